"""Prometheus source: dcgm-exporter series, aggregated by Prometheus, fetched incrementally.

Four parts, kept apart (unlike a one-method scraper):
- PromQL: label values escaped into matchers; `Hostname` also tried as `hostname`.
- Transport: auth (bearer token file re-read on change, basic auth), TLS (CA, client
  certificate, explicit insecure), timeouts, bounded retries with backoff; errors become
  `SourceError` with every secret scrubbed from the message.
- Decoding: the `data.result` matrix checked for shape; values parsed, NaN/Inf flagged.
- Window: per target a sliding window on the step grid; the first cycle backfills in
  chunks under Prometheus' 11,000-points-per-series limit, later cycles fetch only what is
  new (plus a small overlap for late samples); gaps stay NaN; memory is window x targets.

Failure policy: any failure for a target sets its `problem`, so the core takes no action
on it and says why; the source's health records the last error; the next good fetch
recovers by itself.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from gpuscaler.adapters.cluster import CurrentState
from gpuscaler.adapters.spacing import SpacingTracker
from gpuscaler.config import Config, PrometheusConfig, WorkloadConfig
from gpuscaler.core.model import FloatArray, Series
from gpuscaler.core.snapshot import Observations, RawPool, RawWorkload
from gpuscaler.demand import DEMAND_BOUNDS
from gpuscaler.errors import OutsideError

log = logging.getLogger("gpuscaler.prometheus")

MAX_POINTS = 10_000
"""Points per series per request: below Prometheus' hard limit of 11,000."""
PERCENT = (0.0, 100.0)
"""GPU utilization and stall are percentages: anything else is a broken exporter or rule."""
LOAD = (0.0, 100.0 * 100_000)
"""A workload's load sums its pods' GPU utilization: at most 100 % on each of 100,000 GPUs."""
MEMORY_MIB = (0.0, 1024.0 * 1024)
"""Frame buffer per GPU in MiB: no GPU has a TiB."""
HOSTNAME_LABELS = ("Hostname", "hostname")
"""dcgm-exporter is renaming Hostname to hostname; a matcher on either tries both."""


class SourceError(OutsideError):
    """A fetch that failed; the message is safe to log (no secrets)."""


# --------------------------------------------------------------------------- PromQL


def escape_label_value(value: str) -> str:
    """A PromQL double-quoted string literal holding exactly `value`."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def matcher_sets(labels: Mapping[str, str]) -> list[str]:
    """Matcher lists (comma-joined) for the labels; two when a Hostname label is involved."""
    for name in labels:
        if not _LABEL_NAME.match(name):
            raise ValueError(f"invalid Prometheus label name {name!r}")
    variants: list[dict[str, str]] = [dict(labels)]
    host = next((h for h in HOSTNAME_LABELS if h in labels), None)
    if host is not None:
        other = HOSTNAME_LABELS[1] if host == HOSTNAME_LABELS[0] else HOSTNAME_LABELS[0]
        swapped = {(other if k == host else k): v for k, v in labels.items()}
        variants = [dict(labels), swapped]
    return [
        ",".join(f"{k}={escape_label_value(v)}" for k, v in sorted(v.items())) for v in variants
    ]


def build_query(template: str, labels: Mapping[str, str], lookback: str) -> str:
    parts = [template.format(matchers=m, lookback=lookback) for m in matcher_sets(labels)]
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


POD_LABELS = (("namespace", "pod"), ("exported_namespace", "exported_pod"))
"""dcgm-exporter's pod attribution, as scraped: `pod`/`namespace` when the ServiceMonitor
honours the exporter's labels, `exported_pod`/`exported_namespace` under the stock
`honorLabels: false` of the dcgm-exporter Helm chart and the GPU Operator (Prometheus
renames a scraped label that clashes with a target label)."""


def workload_matchers(
    namespace: str, name: str, labels: tuple[str, str] = POD_LABELS[0]
) -> list[str]:
    """Matchers for a workload's pods: its namespace and pods named `<name>-...` (the
    Deployment/StatefulSet naming); the name is regex-escaped, then string-escaped."""
    ns_label, pod_label = labels
    return [
        f"{ns_label}={escape_label_value(namespace)}",
        f"{pod_label}=~{escape_label_value(re.escape(name) + '-.+')}",
    ]


def build_workload_query(template: str, namespace: str, name: str, lookback: str) -> str:
    """The template over the workload's pods under either label convention: `(A) or (B)`
    takes the plain labels when they match and the exported ones otherwise. A template
    without `{matchers}` (a demand query of the config's own) is taken as it is."""
    if "{matchers}" not in template:
        return template.format(lookback=lookback)
    parts = [
        template.format(
            matchers=",".join(workload_matchers(namespace, name, labels)), lookback=lookback
        )
        for labels in POD_LABELS
    ]
    return " or ".join(f"({p})" for p in parts)


def format_step(seconds: float) -> str:
    """A query_range step Prometheus accepts: float seconds ('0.5'), never '0.5s'."""
    return f"{seconds:g}"


# --------------------------------------------------------------------------- transport


class Transport:
    """prometheus-api-client with auth, TLS, timeouts and retries; secrets never leak."""

    def __init__(self, cfg: PrometheusConfig):
        if cfg.url is None:
            raise ValueError("prometheus.url is not set")
        self.cfg = cfg
        retry = Retry(
            total=cfg.retries,
            backoff_factor=cfg.backoff,
            status_forcelist=(500, 502, 503, 504),
            allowed_methods=("GET",),
            raise_on_status=False,
        )
        self.client = PrometheusConnect(
            url=cfg.url.rstrip("/"),
            disable_ssl=cfg.insecure_skip_verify,
            retry=retry,
            timeout=cfg.timeout,
        )
        session = self.client._session
        if cfg.ca_file and not cfg.insecure_skip_verify:
            session.verify = cfg.ca_file
        if cfg.client_cert_file and cfg.client_key_file:
            session.cert = (cfg.client_cert_file, cfg.client_key_file)
        self._token: tuple[float, str] | None = None
        self._secrets: set[str] = set()
        password = urlsplit(cfg.url).password
        if password:  # credentials in the URL itself are a secret like any other
            self._secrets.add(password)

    def _read_secret(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                secret = f.read().strip()
        except OSError as e:
            raise SourceError(f"cannot read secret file {path}: {e.strerror}") from None
        if secret:
            self._secrets.add(secret)
        return secret

    def _authorize(self) -> None:
        cfg = self.cfg
        if cfg.bearer_token_file:
            try:
                mtime = os.stat(cfg.bearer_token_file).st_mtime
            except OSError as e:
                raise SourceError(f"cannot read bearer token file: {e.strerror}") from None
            if self._token is None or self._token[0] != mtime:  # rotated: read it again
                self._token = (mtime, self._read_secret(cfg.bearer_token_file))
            self.client.headers = {"Authorization": f"Bearer {self._token[1]}"}
        if cfg.basic_auth_username and cfg.basic_auth_password_file:
            password = self._read_secret(cfg.basic_auth_password_file)
            self.client.auth = (cfg.basic_auth_username, password)
            # A server may echo the header back: its encoded form is a secret too.
            pair = f"{cfg.basic_auth_username}:{password}".encode()
            self._secrets.add(base64.b64encode(pair).decode())

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        return self._call(
            lambda: self.client.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=format_step(step),
            )
        )

    def query(self, query: str) -> list[Any]:
        """An instant query (the scheduler extender's grouped GPU-memory read)."""
        return self._call(lambda: self.client.custom_query(query))

    def _call(self, request: Callable[[], Any]) -> list[Any]:
        """`data.result` of one request, every failure a SourceError without secrets."""
        self._authorize()
        try:
            result: Any = request()
        except requests.exceptions.JSONDecodeError:
            raise SourceError("answer is not JSON") from None
        except requests.Timeout:
            raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
        except requests.ConnectionError as e:
            if "timed out" in str(e) or "Timeout" in str(e):  # a read timeout after retries
                raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
            raise SourceError(self.scrub(f"cannot connect: {type(e).__name__}")) from None
        except requests.RequestException as e:
            raise SourceError(self.scrub(f"request failed: {e}")) from None
        except PrometheusApiClientException as e:
            raise SourceError(self.scrub(str(e))[:300]) from None
        except ValueError:
            raise SourceError("answer is not JSON") from None
        except (KeyError, TypeError):
            raise SourceError("answer is JSON of the wrong shape (no data.result)") from None
        return result  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- decoding


def out_of_range(values: FloatArray, bounds: tuple[float, float]) -> str | None:
    """A problem naming the first finite value outside `bounds`, None when all are in."""
    lo, hi = bounds
    finite = values[np.isfinite(values)]
    bad = finite[(finite < lo) | (finite > hi)]
    if bad.size == 0:
        return None
    return f"{bad.size} value(s) outside {lo:g}..{hi:g}, e.g. {bad[0]:g}: invalid input"


def decode_matrix(result: Any) -> tuple[FloatArray, FloatArray, bool]:
    """(times, values, had_non_finite) of a single-series matrix result; several series
    are refused, an empty result gives empty arrays."""
    if not isinstance(result, list):
        raise SourceError("data.result is not a list")
    if len(result) == 0:
        return np.empty(0), np.empty(0), False
    if len(result) > 1:
        raise SourceError(f"query returned {len(result)} series, expected one aggregate")
    item = result[0]
    if not isinstance(item, dict) or not isinstance(item.get("values"), list):
        raise SourceError("result item has no values list")
    try:
        times = np.array([float(p[0]) for p in item["values"]], dtype=np.float64)
        values = np.array([float(p[1]) for p in item["values"]], dtype=np.float64)
    except (TypeError, ValueError, IndexError, KeyError):
        raise SourceError('a sample is not [timestamp, "value"]') from None
    bad = ~np.isfinite(values)
    values[bad] = np.nan
    return times, values, bool(bad.any())


# --------------------------------------------------------------------------- window


@dataclass
class Window:
    """One target's samples on the grid k * step, covering the last `window` seconds."""

    step: float
    size: int
    end: float | None = None  # grid time of the last slot
    values: FloatArray = field(default_factory=lambda: np.empty(0))
    fetched_until: float | None = None

    def advance(self, end: float) -> None:
        """Move the window to end at `end`, keeping what overlaps, NaN for the rest."""
        new = np.full(self.size, np.nan)
        if self.end is not None and self.values.size:
            shift = round((end - self.end) / self.step)
            keep = self.size - shift
            if 0 < keep <= self.size:
                new[:keep] = self.values[shift:]
            elif shift <= 0:
                new = self.values.copy()
        self.values, self.end = new, end

    def write(self, times: FloatArray, values: FloatArray) -> None:
        assert self.end is not None
        idx = np.round((times - self.end) / self.step).astype(np.int64) + self.size - 1
        ok = (idx >= 0) & (idx < self.size)
        self.values[idx[ok]] = values[ok]

    def series(self) -> Series:
        assert self.end is not None
        return Series(
            start=self.end - self.step * (self.size - 1), step=self.step, values=self.values
        )


@dataclass
class Health:
    ok: bool = True
    last_error: str | None = None
    last_success: float | None = None
    failures: int = 0


StateReader = Callable[[], CurrentState]
"""Reads what the cluster runs now; called once per tick."""


class PrometheusSource:
    """Metrics from Prometheus joined with the cluster's current state (fixed, or read
    each tick by a `StateReader`)."""

    name = "prometheus"

    def __init__(
        self,
        config: Config,
        state: CurrentState | StateReader,
        transport: Transport | None = None,
    ):
        self.config = config
        self.state = state
        self.transport = transport or Transport(config.prometheus)
        self.windows: dict[str, Window] = {}
        self.health = Health()
        self._transport_errors: list[str] = []
        self.spacing = SpacingTracker(config.metrics.step)
        """Series read more coarsely than metrics.step, and their lookback."""
        self.sample_spacing = self.spacing.measured

    def _fetch(
        self, key: str, query: Callable[[str], str], now: float, bounds: tuple[float, float]
    ) -> tuple[Series | None, str | None]:
        """The target's window after fetching what is new, and the problem if any; a
        transport failure is also recorded for the source's health. Values outside
        `bounds` (the metric's physical range) are invalid input: kept out of the window,
        and the target gets no action this tick. `query` builds the PromQL for a lookback:
        a series found coarser than the step is read again at once with its own."""
        series, problem = self._fetch_once(key, query(self.spacing.lookback(key)), now, bounds)
        if problem is None and series is not None:
            present = np.flatnonzero(np.isfinite(series.values)).astype(np.float64)
            if self.spacing.observe(key, series.start + series.step * present):
                self.windows.pop(key, None)  # backfill the window with the new lookback
                return self._fetch_once(key, query(self.spacing.lookback(key)), now, bounds)
        return series, problem

    def _fetch_once(
        self, key: str, query: str, now: float, bounds: tuple[float, float]
    ) -> tuple[Series | None, str | None]:
        step = self.config.metrics.step
        size = round(self.config.metrics.window / step)
        window = self.windows.setdefault(key, Window(step=step, size=size))
        end = math.floor(now / step) * step
        window.advance(end)
        first = end - step * (size - 1)
        start = first
        if window.fetched_until is not None:
            start = max(first, window.fetched_until - self.config.prometheus.overlap)
        had_bad = False
        absurd: str | None = None
        got_any = False
        chunk = math.floor(MAX_POINTS * step)
        last = math.floor(end)  # the client sends whole seconds
        try:
            t = math.floor(start)
            while True:
                chunk_end = min(last, t + chunk)
                times, values, bad = decode_matrix(
                    self.transport.query_range(query, t, chunk_end, step)
                )
                absurd = absurd or out_of_range(values, bounds)
                values[(values < bounds[0]) | (values > bounds[1])] = np.nan
                window.write(times, values)
                had_bad |= bad
                got_any |= times.size > 0
                if chunk_end >= last:
                    break
                t = chunk_end  # chunks share their edge sample: none is skipped
        except SourceError as e:
            self._transport_errors.append(f"{key}: {e}")
            return window.series(), str(e)
        if got_any or window.series().last_sample_time() is not None:
            window.fetched_until = end  # an empty window is backfilled again next tick
        if absurd is not None:
            return window.series(), absurd
        if had_bad:
            return window.series(), "NaN or Inf in the newest samples"
        if not got_any and window.series().last_sample_time() is None:
            return window.series(), "empty result: no series matches"
        return window.series(), None

    def _newest_gib(
        self, key: str, template: str, matchers: Mapping[str, str], now: float
    ) -> tuple[float | None, str | None]:
        """Newest frame-buffer figure in GiB, None when dcgm-exporter does not export it
        (or not recently): memory then bounds fragments by the config alone. A failing
        query is still a problem."""
        series, problem = self._fetch(
            key, lambda lookback: build_query(template, matchers, lookback), now, MEMORY_MIB
        )
        if problem is not None and not problem.startswith("empty result"):
            return None, problem
        last = series.last_sample_time() if series is not None else None
        if series is None or last is None or now - last > self.config.metrics.staleness:
            return None, None
        return float(series.values[np.isfinite(series.values)][-1]) / 1024, None

    def reconfigure(self, config: Config) -> None:
        """Use `config` from the next tick: windows of targets no longer configured are
        dropped, all of them when the sampling grid changed."""
        if (config.metrics.step, config.metrics.window) != (
            self.config.metrics.step,
            self.config.metrics.window,
        ):
            self.windows.clear()
        if config.prometheus != self.config.prometheus:
            self.transport = Transport(config.prometheus)
        keep = {f"pool:{p.name}:" for p in config.node_pools}
        keep |= {f"workload:{w.key}" for w in config.workloads}
        for key in list(self.windows):
            if not any(key == k or key.startswith(k) for k in keep):
                del self.windows[key]
        self.spacing.reset(config.metrics.step, lambda key: key in self.windows)
        self.config = config

    def observe(self, now: float) -> Observations:
        queries = self.config.prometheus.queries
        self._transport_errors = []
        state = self.state() if callable(self.state) else self.state
        pools = []
        for p in self.config.node_pools:
            cluster_problem = state.problems.get(f"pool:{p.name}")
            if not p.metrics_matchers:
                pools.append(
                    RawPool(
                        p.name,
                        None,
                        None,
                        state.fragments.get(p.name),
                        None,
                        problem="no metrics_matchers configured for this pool",
                    )
                )
                continue
            m = p.metrics_matchers
            util, util_problem = self._fetch(
                f"pool:{p.name}:util",
                partial(build_query, queries.pool_utilization, m),
                now,
                PERCENT,
            )
            stall, stall_problem = self._fetch(
                f"pool:{p.name}:stall",
                partial(build_query, queries.pool_stall, m),
                now,
                PERCENT,
            )
            used_gib, used_problem = self._newest_gib(
                f"pool:{p.name}:fb_used", queries.pool_memory_used, p.metrics_matchers, now
            )
            total_gib, total_problem = self._newest_gib(
                f"pool:{p.name}:fb_total", queries.pool_memory_total, p.metrics_matchers, now
            )
            problem = util_problem or stall_problem or used_problem or total_problem
            pools.append(
                RawPool(
                    name=p.name,
                    utilization=util,
                    stall=stall,
                    fragments=state.fragments.get(p.name),
                    time_slice_level=state.time_slice_levels.get(p.name),
                    gpu_memory_gib=total_gib or state.gpu_memory_gib.get(p.name),
                    max_shares_held=state.shares_held.get(p.name, 0),
                    memory_used_gib=used_gib,
                    problem=_problem(problem, cluster_problem),
                )
            )
        workloads = []
        for w in self.config.workloads:
            template, bounds = queries.workload_load, LOAD
            if w.demand is not None:  # the serving stack's own demand (gpuscaler.demand)
                template, bounds = w.demand.template, DEMAND_BOUNDS
            load, problem = self._fetch(
                f"workload:{w.key}",
                partial(build_workload_query, template, w.namespace, w.name),
                now,
                bounds,
            )
            demand, demand_problem = self._leading(w, now)
            workloads.append(
                RawWorkload(
                    key=w.key,
                    load=load,
                    floor=state.floors.get(w.key),
                    replicas=state.replicas.get(w.key),
                    max_replicas=state.max_replicas.get(w.key),
                    problem=_problem(problem, state.problems.get(f"workload:{w.key}")),
                    serving=(w.demand.per_replica, w.demand.unit_name) if w.demand else None,
                    demand=demand,
                    demand_problem=f"prometheus: {demand_problem}" if demand_problem else None,
                )
            )
        self._record_health(now, self._transport_errors)
        return Observations(now, tuple(pools), tuple(workloads))

    def _leading(self, w: WorkloadConfig, now: float) -> tuple[Series | None, str | None]:
        """The workload's leading signal (workloads[].leading_query, sent as written)."""
        if not w.leading_query:
            return None, None
        query = w.leading_query
        return self._fetch(f"workload:{w.key}:demand", lambda _lookback: query, now, DEMAND_BOUNDS)

    def _record_health(self, now: float, errors: list[str]) -> None:
        if errors:
            self.health.ok = False
            self.health.failures += 1
            self.health.last_error = errors[0]
            log.warning(
                "prometheus: %d target(s) failed: %s",
                len(errors),
                errors[0],
                extra={"event": "source_unhealthy", "source": "prometheus"},
            )
        else:
            if not self.health.ok:
                log.info("prometheus recovered", extra={"event": "source_recovered"})
            self.health.ok = True
            self.health.last_success = now


def _problem(prometheus: str | None, cluster: str | None) -> str | None:
    if prometheus:
        return f"prometheus: {prometheus}"
    return f"kubernetes: {cluster}" if cluster else None


def load_state(path: str | None, config: Config) -> tuple[CurrentState, str]:
    """The cluster's current state from a YAML file, or the config's initial values;
    with a sentence saying which, for the operator."""
    import yaml

    if path is None:
        return (
            CurrentState(fragments={p.name: p.initial_fragments or 1 for p in config.node_pools}),
            "current fragments from the config's initial_fragments; replica floors unknown "
            "(pass --state FILE) until the Kubernetes adapter reads them",
        )
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot read state file: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping with pools and workloads")
    pools = doc.get("pools") or {}
    workloads = doc.get("workloads") or {}
    try:
        initial = {p.name: p.initial_fragments or 1 for p in config.node_pools}
        state = CurrentState(
            fragments=initial
            | {k: int(v["fragments"]) for k, v in pools.items() if "fragments" in v},
            time_slice_levels={
                k: str(v["time_slice_level"]) for k, v in pools.items() if "time_slice_level" in v
            },
            floors={k: int(v["floor"]) for k, v in workloads.items() if "floor" in v},
            replicas={k: int(v["replicas"]) for k, v in workloads.items() if "replicas" in v},
            max_replicas={
                k: int(v["max_replicas"]) for k, v in workloads.items() if "max_replicas" in v
            },
        )
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed state file: {e}") from None
    return state, f"current fragments and replicas from the state file {path}"
