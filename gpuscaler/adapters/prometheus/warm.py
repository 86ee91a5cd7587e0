"""Warm start: the windows saved to a file (an emptyDir survives a container restart),
so a restarted controller asks Prometheus only for the gap since the last save.

One `.npz` file (bucket sums, counts and raw tail per window; the rest as JSON), written
to a temporary name and renamed. A file of another FORMAT or sampling grid, or
unreadable, is ignored with a log line: the source then backfills.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from typing import Any, Protocol

import numpy as np

from gpuscaler.adapters.prometheus.window import Buckets, Window
from gpuscaler.config import Config

log = logging.getLogger("gpuscaler.prometheus")

FORMAT = 2


class WindowHolder(Protocol):
    @property
    def config(self) -> Config: ...
    @property
    def windows(self) -> dict[str, Window]: ...


def save_windows(source: WindowHolder, path: str) -> int:
    """Write the source's windows to `path` atomically; the number written."""
    step, window = source.config.metrics.step, source.config.metrics.window
    kept = [(k, w, w.buckets) for k, w in source.windows.items() if w.buckets is not None]
    meta = {
        "format": FORMAT,
        "step": step,
        "window": window,
        "windows": [
            {
                "key": k,
                "width": w.width,
                "first": b.first,
                "sealed": w.sealed,
                "fetched_until": w.fetched_until,
            }
            for k, w, b in kept
        ],
    }
    arrays: dict[str, Any] = {}
    for i, (_, w, b) in enumerate(kept):
        arrays |= {f"s{i}": b.sums, f"c{i}": b.counts, f"t{i}": w.tail}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return len(kept)


def load_windows(source: WindowHolder, path: str) -> int:
    """Restore windows saved by `save_windows` for the source's grid; the number restored."""
    try:
        with np.load(path) as data:
            meta: dict[str, Any] = json.loads(bytes(data["meta"]).decode())
            if meta.get("format") != FORMAT:
                log.info("warm start: %s is of another format; backfilling", path)
                return 0
            step, window = source.config.metrics.step, source.config.metrics.window
            if (meta.get("step"), meta.get("window")) != (step, window):
                log.info("warm start: %s is for another sampling grid; backfilling", path)
                return 0
            restored = 0
            for i, w in enumerate(meta["windows"]):
                width = float(w["width"])
                size = max(1, round(window / width))
                sums = np.asarray(data[f"s{i}"], dtype=np.float64)
                counts = np.asarray(data[f"c{i}"], dtype=np.float64)
                if sums.shape != (size,) or counts.shape != (size,):
                    continue
                source.windows[str(w["key"])] = Window(
                    step=step,
                    width=width,
                    size=size,
                    buckets=Buckets(width, int(w["first"]), sums.copy(), counts.copy()),
                    sealed=float(w["sealed"]),
                    tail=np.asarray(data[f"t{i}"], dtype=np.float64).copy(),
                    fetched_until=None if w["fetched_until"] is None else float(w["fetched_until"]),
                )
                restored += 1
            return restored
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:
        log.warning("warm start: cannot read %s (%s); backfilling", path, e)
        return 0


class WarmStart:
    """Loads the windows once, then saves them after a tick at most every `every` s."""

    def __init__(self, source: WindowHolder, path: str, every: float):
        self.source, self.path, self.every = source, path, every
        self.restored = load_windows(source, path)
        self._saved_at: float | None = None

    def after_tick(self, now: float) -> None:
        if self._saved_at is not None and now - self._saved_at < self.every:
            return
        if getattr(self.source, "backfilling", False):
            return  # windows missing their older part would be restored as complete
        try:
            save_windows(self.source, self.path)
            self._saved_at = now
        except OSError as e:
            log.warning("warm start: cannot write %s: %s", self.path, e)
