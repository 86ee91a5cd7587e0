"""Bad input at the command line and in the config gets exit 2 and a message naming it;
an unexpected error gets exit 1 and a message, with the traceback only under --debug."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from builders import CLI, run_cli

from gpuscaler import cli
from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.config import ConfigError
from gpuscaler.sim.trace import TraceError

WORKLOAD = "workloads:\n  - {namespace: ml, kind: ScaledObject, name: chat}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["backtest", "--series", "S", "--resample", "0s"], "--resample: must be more than 0s"),
        (["backtest", "--series", "S", "--window", "0s"], "--window: must be more than 0s"),
        (["backtest", "--series", "S", "--horizon", "0s"], "--horizon: must be more than 0s"),
        (["backtest", "--series", "S", "--max-origins", "0"], "must be at least 1, got 0"),
        (["backtest", "--series", "S", "--max-origins", "-3"], "must be at least 1, got -3"),
        (["backtest", "--series", "S", "--max-origins", "x"], "'x' is not a whole number"),
        (["backtest", "--series", "S", "--max-origins", "1_0"], "'1_0' is not a whole number"),
        (["simulate", "--report", "FILE"], "exists and is not a directory"),
        (["--log-level", "BOGUS", "validate-config", "X"], "invalid choice: 'BOGUS'"),
    ],
)
def test_bad_arguments_exit_2_naming_the_argument(
    tmp_path: Path, args: list[str], message: str
) -> None:
    series = tmp_path / "s.csv"
    series.write_text("timestamp,value\n" + "".join(f"{60 * i},{i % 7}\n" for i in range(300)))
    existing = tmp_path / "report.txt"
    existing.write_text("not a directory")
    argv = [{"S": str(series), "FILE": str(existing)}.get(a, a) for a in args]
    out = run_cli(*argv, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def _gzipped_trace(cut: slice | None = None, zeroed: slice | None = None) -> bytes:
    text = "time,requests\n" + "".join(f"{10 * i},{i % 7}\n" for i in range(5000))
    data = bytearray(gzip.compress(text.encode()))
    if zeroed is not None:
        data[zeroed] = bytes(zeroed.stop - zeroed.start)
    return bytes(data[cut or slice(None)])


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("t.csv.gz", _gzipped_trace(cut=slice(0, 2000)), "truncated or corrupt compressed file"),
        ("t.csv.gz", _gzipped_trace(zeroed=slice(40, 60)), "truncated or corrupt compressed file"),
        ("t.csv", ("time,requests\n" + "".join(f"{10 * i},1e300\n" for i in range(999))).encode(), "999 bin(s) above 1e+09 requests per second, e.g. 1e+299"),
    ],
    ids=["a truncated gzip", "a corrupt gzip", "gigantic values"],
)  # fmt: skip
def test_a_broken_trace_exits_2_with_the_reason(
    tmp_path: Path, name: str, content: bytes, says: str
) -> None:
    trace = tmp_path / name
    trace.write_bytes(content)
    out = run_cli("simulate", "--trace", str(trace), "--hours", "1", timeout=120)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("error", "code", "says"),
    [
        (ConfigError("c.yaml", ["control.interval: bad"]), 2, "control.interval: bad"),
        (TraceError("t.csv: row 3: not a number"), 2, "row 3"),
        (KubeError("patch node n1: HTTP 500"), 1, "patch node n1"),
        (SourceError("cannot connect"), 1, "cannot connect"),
        (PermissionError(13, "Permission denied", "/report"), 1, "Permission denied"),
        (ZeroDivisionError("division by zero"), 1, "this is a bug in gpuscaler"),
    ],
)
def test_the_one_error_path_maps_each_kind_of_failure_to_its_exit_code(
    error: Exception, code: int, says: str
) -> None:
    got, message = cli.explain(error)
    assert got == code
    assert says in message


def test_an_unexpected_error_is_a_message_and_its_traceback_only_under_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def broken(args: object) -> int:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli, "cmd_validate", broken)
    assert cli.main(["validate-config", "x"]) == 1
    err = capsys.readouterr().err
    assert "gpuscaler validate-config: internal error (ZeroDivisionError" in err
    assert "--debug" in err and "Traceback" not in err
    with pytest.raises(ZeroDivisionError):
        cli.main(["--debug", "validate-config", "x"])


def _wait_for(proc: subprocess.Popen[str], log: Path, text: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if text in log.read_text():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def test_run_without_a_cluster_reloads_a_valid_edit_and_refuses_an_invalid_one(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gpuscaler.yaml"
    original = (Path(__file__).parents[2] / "config" / "gpuscaler.yaml").read_text()
    config.write_text(original.replace("interval: 30s", "interval: 1s", 1))
    log = tmp_path / "run.log"
    with log.open("w") as sink:
        argv = [*CLI, "run", "--config", str(config), "--metrics-port", "0"]
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            assert _wait_for(proc, log, '"event": "tick"', 60), log.read_text()[-2000:]
            config.write_text(config.read_text().replace("dry_run: false", "dry_run: true", 1))
            assert _wait_for(proc, log, "config reloaded (generation 2)", 30), log.read_text()
            config.write_text("control: {interval: soon}\n" + WORKLOAD)
            assert _wait_for(proc, log, "new config refused", 30), log.read_text()[-2000:]
            assert proc.poll() is None, "an invalid edit never stops the loop"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    said = log.read_text()
    assert proc.returncode == 0 and '"event": "stopped"' in said and "Traceback" not in said
    assert "source: simulator" in said  # it says it acts on no real cluster
    assert "control.interval" in said
