"""Config reload from the mounted ConfigMap file, without a restart.

Kubernetes updates a ConfigMap volume by swapping a symlink, so the file's content is
compared (by digest), not its mtime. Checked before every tick:
- unchanged: nothing happens;
- changed: applied once two consecutive checks (a tick apart) read the same content, so a
  file still being written (an in-place edit can be valid YAML half-way) is never applied
  and no tick waits for a second read. A file in a ConfigMap volume (a `..data` symlink
  beside it) is swapped whole by the kubelet, so one read is enough there;
- changed and valid: the new config is handed to `on_reload` and the generation goes up;
- changed and invalid, unreadable, not a regular file or too large: refused; every
  problem is logged with its path and reported to `on_refused` (an Event, the metric);
  the running config stays. The same broken content is reported once, not every tick.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from gpuscaler.config import Config, ConfigError, parse_config, read_config_file

log = logging.getLogger("gpuscaler.config")


def _read(path: Path) -> str | ConfigError:
    try:
        return read_config_file(path)
    except ConfigError as e:
        return e


def _key(read: str | ConfigError) -> str:
    text = read if isinstance(read, str) else "\n".join(read.problems)
    return hashlib.sha256(text.encode()).hexdigest() + ("" if isinstance(read, str) else "!")


class ConfigReloader:
    def __init__(
        self,
        path: str | Path,
        on_reload: Callable[[Config, int], None],
        on_refused: Callable[[ConfigError], None] = lambda e: None,
    ):
        self.path = Path(path)
        self.on_reload = on_reload
        self.on_refused = on_refused
        self.generation = 1
        self.failures = 0
        self._key = _key(_read(self.path))
        self._pending: str | None = None
        """The changed content seen at the last check, applied if the next reads the same."""

    def check(self) -> bool:
        """Reload if the file changed and read the same at the last check (or sits in a
        ConfigMap volume); True when a new config took effect."""
        read = _read(self.path)
        key = _key(read)
        if key == self._key:
            self._pending = None
            return False
        if key != self._pending and not (self.path.parent / "..data").is_symlink():
            self._pending = key
            log.info("config file %s changed; applied if it reads the same next tick", self.path)
            return False
        self._key, self._pending = key, None
        try:
            if isinstance(read, ConfigError):
                raise read
            config = parse_config(read, str(self.path), require_targets=True)
        except ConfigError as e:
            self.failures += 1
            log.error(
                "new config refused, the running one stays: %s",
                "; ".join(e.problems),
                extra={"event": "config_refused", "problems": e.problems, "path": str(self.path)},
            )
            self.on_refused(e)
            return False
        self.generation += 1
        log.info(
            "config reloaded (generation %d): %s",
            self.generation,
            config.summary(),
            extra={"event": "config_reloaded", "generation": self.generation},
        )
        self.on_reload(config, self.generation)
        return True
