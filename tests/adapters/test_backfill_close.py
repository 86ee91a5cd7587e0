"""The background backfill when the process stops: nothing more starts, and a fetch cut
off by the shutdown is not logged as a failure with a traceback."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import pytest

from gpuscaler.adapters.prometheus.backfill import Backfill, Folds, Pending
from gpuscaler.adapters.prometheus.window import Window


def _pending() -> Pending:
    return Pending(Window(0.5, 10.0, 6), "up", 0.0, 60.0, (0.0, 100.0))


def test_a_closed_backfill_starts_nothing() -> None:
    fetched: list[int] = []

    def fetch(batch: Mapping[str, Pending]) -> Folds:
        fetched.append(len(batch))
        return Folds(batch)

    backfill = Backfill(fetch)
    backfill.pending["pool/a"] = _pending()
    backfill.close()
    backfill.start()
    assert backfill.wait(1.0) and fetched == [] and not backfill.busy


def test_a_fetch_cut_off_by_the_shutdown_is_logged_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()

    def fetch(batch: Mapping[str, Pending]) -> Folds:
        release.wait(5)
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    backfill = Backfill(fetch)
    backfill.pending["pool/a"] = _pending()
    with caplog.at_level(logging.INFO, logger="gpuscaler.prometheus"):
        backfill.start()
        backfill.close()
        release.set()
        assert backfill.wait(5)
    records = [r for r in caplog.records if r.name == "gpuscaler.prometheus"]
    assert [r.levelno for r in records] == [logging.INFO], records
    assert records[0].exc_info is None and "stopped with the process" in records[0].getMessage()


def test_a_fetch_that_fails_while_running_is_reported_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fetch(batch: Mapping[str, Pending]) -> Folds:
        raise RuntimeError("boom")

    backfill = Backfill(fetch)
    backfill.pending["pool/a"] = _pending()
    with caplog.at_level(logging.INFO, logger="gpuscaler.prometheus"):
        backfill.start()
        assert backfill.wait(5)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
