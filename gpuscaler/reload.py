"""Config reload from the mounted ConfigMap file, without a restart.

Kubernetes updates a ConfigMap volume by swapping a symlink, so the file's content is
compared (by digest), not its mtime. Checked before every tick:
- unchanged: nothing happens;
- changed and valid: the new config is handed to `on_reload` and the generation goes up;
- changed and invalid (or unreadable): refused; every problem is logged with its path and
  reported to `on_refused` (an Event); the running config stays. The same broken content
  is reported once, not every tick.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from gpuscaler.config import Config, ConfigError, load_config

log = logging.getLogger("gpuscaler.config")


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


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
        self._digest = _digest(self.path)

    def check(self) -> bool:
        """Reload if the file changed; True when a new config took effect."""
        digest = _digest(self.path)
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            config = load_config(self.path)
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
