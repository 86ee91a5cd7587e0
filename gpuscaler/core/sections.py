"""Every target's config section, resolved once per config (issue 18).

`Config.workload_section` is cheap per call but not free (two private-attribute lookups on
the pydantic model and a dict probe each), and the core asked for it four times per
workload per tick: at 10,000 workloads that was about a tenth of a steady tick. A config
is frozen, so the sections are taken once per config object (kept while that config
lives: the controller keeps one until it is reloaded) and read from a plain dict
afterwards. The sections are the very objects `workload_section` returns.
"""

from __future__ import annotations

import weakref
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from gpuscaler.config import Config

M = TypeVar("M", bound=BaseModel)

_TABLES: dict[int, tuple[weakref.ref[Config], dict[tuple[str, str], dict[str, Any]]]] = {}
"""Per live config (by id, checked through a weak reference, dropped with the config):
its resolved sections by (target kind, section)."""


def _tables(config: Config) -> dict[tuple[str, str], dict[str, Any]]:
    key = id(config)
    hit = _TABLES.get(key)
    if hit is None or hit[0]() is not config:
        hit = (weakref.ref(config, lambda _: _TABLES.pop(key, None)), {})
        _TABLES[key] = hit
    return hit[1]


def workload_sections(config: Config, section: str, model: type[M]) -> Sections[M]:
    """Each configured workload's `section` by key (others: the config's own section)."""
    return Sections(config, "workload", section, model)


def pool_sections(config: Config, section: str, model: type[M]) -> Sections[M]:
    """Each configured pool's `section` by name (others: the config's own section)."""
    return Sections(config, "pool", section, model)


class Sections(Generic[M]):
    __slots__ = ("config", "kind", "model", "section", "table")

    def __init__(self, config: Config, kind: str, section: str, model: type[M]):
        self.config, self.kind, self.section, self.model = config, kind, section, model
        tables = _tables(config)
        table = tables.get((kind, section))
        if table is None:
            table = tables[(kind, section)] = self._resolve_all()
        self.table: dict[str, Any] = table

    def _resolve_all(self) -> dict[str, Any]:
        if self.kind == "workload":
            keys = [w.key for w in self.config.workloads]
        else:
            keys = [p.name for p in self.config.node_pools]
        return {key: self._resolve(key) for key in keys}

    def _resolve(self, key: str) -> M:
        if self.kind == "workload":
            return self.config.workload_section(key, self.section, self.model)
        return self.config.pool_section(key, self.section, self.model)

    def __getitem__(self, key: str) -> M:
        found: M | None = self.table.get(key)
        return self._resolve(key) if found is None else found
