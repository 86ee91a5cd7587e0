"""Each pool's frame-buffer total, read every `prometheus.memory_total_every` instead of
every tick: a GPU's memory does not change while it is there, and its query is the
costliest of a tick's. It is read again when none is kept (a start, a pool or template
changed), when due, or when the pool's frame buffer in use is absent this tick (its GPUs
may come back as others). A kept total counts while younger than `memory_total_every` +
`metrics.staleness`: a refresh that fails keeps it that long, one that finds nothing
forgets it; `memory_total_every: 0` reads it every tick.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscaler.config import Config


@dataclass(frozen=True)
class Kept:
    gib: float
    read_at: float


def _identity(config: Config) -> dict[str, tuple[str, tuple[tuple[str, str], ...]]]:
    """What a pool's total is read with: the template and the pool's matchers."""
    template = config.prometheus.queries.pool_memory_total
    return {
        f"pool:{p.name}:fb_total": (template, tuple(sorted(p.metrics_matchers.items())))
        for p in config.node_pools
        if p.metrics_matchers
    }


class Totals:
    """The frame-buffer totals kept between reads, by target key (`pool:NAME:fb_total`)."""

    def __init__(self, config: Config):
        self.kept: dict[str, Kept] = {}
        self._identity: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        self.reconfigure(config)

    def due(self, key: str, now: float) -> bool:
        kept = self.kept.get(key)
        return kept is None or not 0 <= now - kept.read_at < self.every

    def kept_within_limit(self, key: str, now: float) -> float | None:
        kept = self.kept.get(key)
        return kept.gib if kept is not None and 0 <= now - kept.read_at <= self.limit else None

    def store(self, key: str, gib: float | None, now: float) -> None:
        if gib is None or self.every <= 0:
            self.kept.pop(key, None)
        else:
            self.kept[key] = Kept(gib, now)

    def reconfigure(self, config: Config) -> None:
        """Forget the totals of pools gone, or read with other matchers or template."""
        identity = _identity(config)
        self.kept = {k: v for k, v in self.kept.items() if identity.get(k) == self._identity.get(k)}
        self._identity = identity
        self.every = config.prometheus.memory_total_every
        self.limit = self.every + config.metrics.staleness

    def resting(self, now: float) -> set[str]:
        """Keys whose total is not asked of Prometheus this tick."""
        return {key for key in self.kept if not self.due(key, now)}
