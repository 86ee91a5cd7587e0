"""Each pool's frame-buffer total (used + free on its smallest GPU), read every few
minutes instead of every tick.

A GPU's total memory is a property of the hardware: it does not change while the GPU is
there. Its query is the costliest of a tick's reads (two selectors over every GPU and a
label match between them), so a pool's total is read again only when
- the pool has none kept (the first read, a restart, a pool new or changed in the
  config, a query template changed: `Totals.reconfigure` forgets those),
- the kept one was read `prometheus.memory_total_every` (5 min) ago or more,
- the pool's frame buffer in use is absent this tick (its GPUs report nothing: when they
  come back they may be other GPUs), or the last read found nothing or failed.

What an older total means for staleness: the frame buffer in use, read every tick,
stays the pool's fresh measurement; the kept total is what the hardware was when last
read, and counts while younger than `memory_total_every` + `metrics.staleness` (its
refresh period plus the staleness any signal is allowed). A refresh that fails keeps the
kept total within that limit (the failure is recorded for the source's health); past
it, the failure is the pool's problem, as every tick's failed read was before, so the
pool gets no action. A refresh that finds no total within `metrics.staleness` forgets
the kept one: the pool's memory is bounded by the config alone, as before.
`memory_total_every: 0` reads the total every tick, exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscaler.config import Config


@dataclass(frozen=True)
class Kept:
    gib: float
    read_at: float
    """The tick time of the read that found it."""


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
        self.every = config.prometheus.memory_total_every
        self.limit = self.every + config.metrics.staleness
        self._identity = _identity(config)

    def due(self, key: str, now: float) -> bool:
        """Whether `key`'s total is read this tick (given its used figure is present)."""
        kept = self.kept.get(key)
        return kept is None or not 0 <= now - kept.read_at < self.every

    def kept_within_limit(self, key: str, now: float) -> float | None:
        """The kept total in GiB while younger than the limit (a refresh failed)."""
        kept = self.kept.get(key)
        if kept is None or not 0 <= now - kept.read_at <= self.limit:
            return None
        return kept.gib

    def store(self, key: str, gib: float | None, now: float) -> None:
        """What a read found (None: nothing, the kept one is forgotten)."""
        if gib is None or self.every <= 0:
            self.kept.pop(key, None)
        else:
            self.kept[key] = Kept(gib, now)

    def reconfigure(self, config: Config) -> None:
        """Forget the totals of pools gone, or read with other matchers or template."""
        identity = _identity(config)
        for key in list(self.kept):
            if identity.get(key) != self._identity.get(key):
                del self.kept[key]
        self._identity = identity
        self.every = config.prometheus.memory_total_every
        self.limit = self.every + config.metrics.staleness

    def resting(self, now: float) -> set[str]:
        """The keys whose total is not read this tick (unless their used figure turns
        out absent): the grouped reader does not ask Prometheus for them."""
        return {key for key in self.kept if not self.due(key, now)}
