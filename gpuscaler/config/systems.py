"""Config sections of the outside systems (Prometheus, Kubernetes) and of preemption, the
simulator, the node agent, the scheduler extender and KEDA's external scaler."""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from gpuscaler.config.base import Seconds, StrictModel
from gpuscaler.demand import check_template


def redact_url(url: str) -> str:
    """`url` with the password of any `user:password@` part (up to the authority's last
    @, whatever characters it holds) replaced by ***: safe to print."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@:]*):[^/?#]*@", r"\1:***@", url)


class PrometheusQueries(StrictModel):
    """PromQL templates: `{matchers}` becomes the target's escaped label matchers,
    `{lookback}` twice the metrics step (a missed scrape stays a gap, not an old value)."""

    pool_utilization: str = "avg(last_over_time(DCGM_FI_DEV_GPU_UTIL{{{matchers}}}[{lookback}]))"
    pool_stall: str = "avg(last_over_time(nvidia_gpu_stall_percentage{{{matchers}}}[{lookback}]))"
    workload_load: str = (
        "sum(max by (namespace, pod, exported_namespace, exported_pod, UUID, gpu, Hostname, "
        "hostname) (last_over_time(DCGM_FI_DEV_GPU_UTIL{{{matchers}}}[{lookback}])))"
    )
    """The GPU utilization of the workload's pods, each GPU once per pod: dcgm-exporter's DRA
    mode copies a GPU's series to every container holding it (internal/pkg/transformation/
    kubernetes.go), the label `container` apart."""
    pool_memory_used: str = "max(last_over_time(DCGM_FI_DEV_FB_USED{{{matchers}}}[{lookback}]))"
    """MiB used on the pool's fullest GPU."""
    pool_memory_total: str = (
        "min(last_over_time(DCGM_FI_DEV_FB_USED{{{matchers}}}[{lookback}])"
        " + last_over_time(DCGM_FI_DEV_FB_FREE{{{matchers}}}[{lookback}]))"
    )
    """MiB of the pool's smallest GPU (used + free)."""
    workload_requests: str | None = None
    """Requests per second of a workload, which `gpuscaler whatif` replays; unset: derived
    from `workload_load`."""

    @field_validator("*")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        return None if value is None else check_template(value)


class PrometheusConfig(StrictModel):
    url: str | None = None
    """Prometheus base URL; unset = no Prometheus source (simulator only)."""
    timeout: Seconds = Field(10.0, gt=0)
    """Per request: a slow server costs at most this per query and cycle."""
    retries: int = Field(2, ge=0, le=10)
    """Retries of a failed request (connection errors and 5xx), with backoff."""
    backoff: Seconds = Field(0.5, ge=0)
    """First backoff between retries; doubles each retry."""
    overlap: Seconds = Field(5.0, ge=0)
    """Each incremental fetch re-reads this much before the newest sample, for late ones."""
    grouped_queries: bool = True
    """One query per signal and pool family and one for all workloads, instead of one per
    target (targets no group covers are still read one by one)."""
    pool_recording_rules: bool = True
    """With grouped queries, read a `modelName` pool's utilization and stall from the
    shipped rules' per-pool series (group `gpuscaler-pools`) where Prometheus records them:
    one series per pool instead of one per GPU."""
    max_concurrent_queries: int = Field(4, ge=1, le=64)
    """Queries in flight at once: a short tick without loading a shared Prometheus."""
    compress_answers: bool = False
    """Ask for gzipped answers: on for a slow link (off by default: gzip costs Prometheus
    more CPU than it saves on a cluster network)."""
    memory_total_every: Seconds = Field(300.0, ge=0)
    """A pool's frame-buffer total (a property of the hardware) is read again this often,
    and at once for a new or changed pool; 0: every tick."""
    background_backfill: bool = True
    """A first read fetches only forecast.min_history plus `overlap` and acts; the rest of
    the window is read in the background. false: the whole window first."""
    warm_state_file: str | None = None
    """Warm start: the windows are saved here (an emptyDir survives a container restart)
    and read back at start, so a restart fetches only the gap."""
    warm_state_every: Seconds = Field(120.0, gt=0)
    """The windows are saved after a tick at most this often."""
    bearer_token_file: str | None = None
    """Re-read whenever the file changes (projected service account tokens rotate)."""
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure_skip_verify: bool = False
    """Explicitly skip TLS verification (never the default)."""
    queries: PrometheusQueries = PrometheusQueries()

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.url is not None and not re.match(r"^https?://[^\s/]+", self.url):
            raise ValueError(f"url {redact_url(self.url)!r} is not an http(s) URL")
        if (self.basic_auth_username is None) != (self.basic_auth_password_file is None):
            raise ValueError(
                "basic auth needs both basic_auth_username and basic_auth_password_file"
            )
        if self.basic_auth_username is not None and self.bearer_token_file is not None:
            raise ValueError("use either a bearer token or basic auth, not both")
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("a client certificate needs both client_cert_file and client_key_file")
        return self


class PreemptionConfig(StrictModel):
    enabled: bool = True
    """Free GPUs for pending high-priority pods; off = plan nothing, touch nothing."""
    beneficiary_min_priority: int = 1_000_000
    """Pods at or above this priority may have GPUs freed for them when none fits."""
    victim_max_priority: int = 10_000
    """Only pods below this priority are ever victims."""
    protected_namespaces: tuple[str, ...] = (
        "kube-system",
        "gpu-operator",
        "nvidia-device-plugin",
        "gpuscaler",
    )
    """Never a victim: the cluster's own machinery."""
    protected_labels: dict[str, str] = Field(default_factory=dict)
    """A pod with any of these label values is never a victim."""
    pending_for: Seconds = Field(30.0, ge=0)
    """A beneficiary must be unschedulable this long first: the scheduler may still place it."""
    soft_grace: Seconds = Field(300.0, ge=0)
    """Tier 1: time a victim gets to checkpoint (gpuscaler.io/checkpoint-done) or exit
    before it is evicted: one checkpoint of a large model."""
    checkpoint_endpoint: str | None = None
    """Optional: POST here to ask for a checkpoint, e.g. "http://{pod_ip}:8080/checkpoint"."""
    checkpoint_fresh: Seconds = Field(900.0, gt=0)
    """Victims checkpointed (gpuscaler.io/last-checkpoint) more recently are preferred."""
    eviction_grace_period: Seconds = Field(30.0, ge=0)
    """Tier 2: deleteOptions.gracePeriodSeconds of the eviction (SIGTERM to SIGKILL)."""
    eviction_retry: Seconds = Field(30.0, gt=0)
    """After a 429 (a PodDisruptionBudget), wait this long before trying again."""
    max_eviction_attempts: int = Field(4, ge=1)
    """Then the victim is given up (or, with escalate_to_delete, deleted)."""
    escalate_to_delete: bool = False
    """Delete a pod whose eviction a PDB keeps refusing (off: PDBs are respected)."""
    terminating_timeout: Seconds = Field(300.0, gt=0)
    """Tier 3: a victim still Terminating this long after eviction is force-deleted."""
    memory_release_timeout: Seconds = Field(120.0, gt=0)
    """Tier 3: a gone victim's GPU memory must be seen released within this, else the node
    is tainted for a node-side cleanup."""
    released_below_mib: float = Field(1024.0, ge=0)
    """Frame buffer used at or below this on a GPU with no pod counts as released."""
    max_in_flight: int = Field(2, ge=1)
    """Victims being preempted at once, at most."""
    max_per_hour: int = Field(10, ge=1)
    """Victims chosen per rolling hour, at most."""
    forecast_trigger: bool = False
    """Also free GPUs ahead of time for replicas a high-priority workload's forecast floor
    asks for and its pool has no room for."""
    fragments_trigger: bool = False
    """Also preempt low-priority pods holding more shares of a GPU than the fewer fragments
    a hot pool should go to (off: the change waits until they leave)."""


class ObjectRef(StrictModel):
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)


class LeaseConfig(StrictModel):
    name: str = Field("gpuscaler-leader", min_length=1)
    namespace: str | None = None
    """Unset: the pod's own namespace (POD_NAMESPACE), else `default`."""
    duration: Seconds = Field(15.0, gt=0)
    """A leader silent this long is presumed gone (client-go's default, 15 s)."""
    renew_deadline: Seconds = Field(10.0, gt=0)
    """A leader that has not renewed for this long stops acting, before its lease expires."""
    retry_period: Seconds = Field(2.0, gt=0)
    """How often the lease is renewed or, on a standby, tried."""
    standby_interval: Seconds = Field(120.0, gt=0)
    """A standby ticks (reads, forecasts, plans, never acts) at most this often: warm at a
    fraction of the leader's load on Prometheus."""

    @model_validator(mode="after")
    def _order(self) -> Self:
        if not self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                "need retry_period < renew_deadline < duration, so a leader stops acting "
                "before its lease can expire"
            )
        return self


class DraConfig(StrictModel):
    """Which Dynamic Resource Allocation devices (resource.k8s.io/v1) are GPUs. Defaults are
    NVIDIA's DRA driver's names (kubernetes-sigs/dra-driver-nvidia-gpu: driver and DeviceClass
    `gpu.nvidia.com`, deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml)."""

    enabled: bool = True
    """Watch ResourceSlices and ResourceClaims (a server without them is an empty store)."""
    drivers: tuple[str, ...] = ("gpu.nvidia.com",)
    """An allocated device of one of these drivers is a GPU held by the claim's pods."""
    device_classes: tuple[str, ...] = ("gpu.nvidia.com",)
    """A request for one of these DeviceClasses asks for GPUs: what a pending pod waits for
    (a class's CEL selectors are not evaluated here)."""
    gpu_types: tuple[str, ...] = ("gpu",)
    """A published device counts as one of its node's GPUs when its `type` attribute is one
    of these (or absent): the NVIDIA driver lists MIG devices (type mig) of the same GPUs."""
    pool_label: str = Field("gpuscaler.io/pool", min_length=1)
    """Opt-in for sharing under DRA: a DeviceClass or ResourceClaimTemplate labelled with it,
    valued a pool's name, carries that pool's time slice and share size; nothing else is
    written (docs/dra.md)."""


class KubernetesConfig(StrictModel):
    device_plugin_config_map: ObjectRef = ObjectRef(
        namespace="nvidia-device-plugin", name="gpuscaler-sharing-configs"
    )
    """The ConfigMap the NVIDIA device plugin's config-manager reads named configs from."""
    sharing_config_names: dict[Literal["time-slicing", "mps"], str] = Field(
        default_factory=lambda: {"time-slicing": "ts-{n}", "mps": "mps-{n}"}  # type: ignore[arg-type]
    )
    """The device-plugin config of n fragments per GPU (label nvidia.com/device-plugin.config)."""
    time_slice_label: str = Field("gpuscaler.io/time-slice", min_length=1)
    """Node label a node-side agent reads to set the time slice (default/short/medium/long)."""
    config_propagation: Seconds = Field(90.0, ge=0)
    """A sharing config added to the ConfigMap is named on a node only this long after: the
    kubelet syncs a mounted ConfigMap late, and the config-manager exits on a config its
    copy lacks. 0: at once (configs pre-provisioned)."""
    max_nodes_per_tick: int = Field(2, ge=1)
    """Nodes relabelled per pool per tick: a bad config shows before it is everywhere."""
    max_writes_per_minute: int = Field(30, ge=1)
    """Kubernetes writes per minute at most: a bound on what a runaway plan could do."""
    events_namespace: str = Field("default", min_length=1)
    """Namespace of Events about cluster-scoped objects (Nodes), as kubectl expects."""
    lease: LeaseConfig = LeaseConfig()
    connect_timeout: Seconds = Field(5.0, gt=0, le=60)
    """Every API call gives up connecting after this: a dead server must not hold a tick."""
    read_timeout: Seconds = Field(15.0, gt=0, le=300)
    """Every API call gives up waiting for an answer after this (a large list takes seconds)."""
    tick_api_budget: Seconds = Field(60.0, gt=0, le=3600)
    """Kubernetes API time one tick may spend; then its further calls fail at once (their
    targets get no action, with the reason). Lease renewals are not charged."""
    watch_cache: bool = True
    """Read the cluster from a watch cache (list once, then watch) instead of listing it
    every tick."""
    watch_timeout: Seconds = Field(300.0, ge=1, le=3600)
    """Each watch asks the server to end it after this (as client-go), then resumes."""
    watch_stale_after: Seconds = Field(30.0, gt=0, le=3600)
    """A watch failing this long is not trusted: ticks flag every target until it is back."""
    dra: DraConfig = DraConfig()
    gitops_field_managers: tuple[str, ...] = (
        "argocd-controller",
        "argocd-application-controller",
        "kustomize-controller",
        "helm-controller",
    )
    """Field managers of GitOps tools (Argo CD, Flux): a floor field one of them owns is not
    patched, or the two would fight."""

    @field_validator("sharing_config_names")
    @classmethod
    def _has_n(cls, value: dict[str, str]) -> dict[str, str]:
        for strategy, pattern in value.items():
            if "{n}" not in pattern or not re.fullmatch(r"[A-Za-z0-9._{}-]+", pattern):
                raise ValueError(
                    f"{strategy}: {pattern!r} must contain {{n}} and only label-value "
                    "characters (letters, digits, '-', '_', '.')"
                )
        return value


class SimulatorConfig(StrictModel):
    cold_start: Seconds = Field(60.0, ge=0)
    """A new replica serves this long after its pod is created at the earliest (image pull,
    model load); each cold start is drawn uniformly up to `cold_start_max`."""
    cold_start_max: Seconds = Field(120.0, ge=0)
    sync_delay: Seconds = Field(15.0, ge=0)
    """From a scaler's decision to the pod created or deleted: the HPA's sync period."""
    drain_max: Seconds = Field(30.0, ge=0)
    """A leaving replica serves its queue at most this long (terminationGracePeriodSeconds)."""
    slo_wait: Seconds = Field(2.0, gt=0)
    """A request waiting longer than this in the queue violates the SLO."""
    fragment_disruption: Seconds = Field(30.0, ge=0)
    """Capacity is reduced this long after a fragment change (device plugins restart)."""
    fragment_disruption_capacity: float = Field(0.5, ge=0, le=1)
    """Share of capacity left during a fragment change's disruption."""
    gpu_seconds_per_request: float = Field(0.06, gt=0)
    """GPU-busy seconds one request costs on a whole GPU: the load model's scale."""
    replica_gpu_share: float = Field(1.0, gt=0, le=1)
    """GPU share one replica holds at 1 fragment."""
    noise_pct: float = Field(2.0, ge=0)
    """Std dev of measurement noise added to utilization (percentage points)."""
    switch_overhead: float = Field(0.03, ge=0, lt=0.5)
    """Throughput lost per doubling of time-slicing tenants on a busy GPU."""
    preemption_burst_after: Seconds | None = 1800.0
    """A burst of high-priority pods into a full batch pool this long into the replay, to
    exercise the preemption tiers (null: none)."""
    slot: Seconds = Field(0.5, gt=0, le=60)
    """Seconds per simulated slot: dcgm-exporter's 500 ms (`whatif` replays at its read
    step)."""

    @model_validator(mode="after")
    def _cold_start_range(self) -> Self:
        if self.cold_start_max < self.cold_start:
            raise ValueError(
                f"cold_start_max ({self.cold_start_max:g}s) must not be below cold_start "
                f"({self.cold_start:g}s)"
            )
        return self


class AgentConfig(StrictModel):
    """The node agent (`gpuscaler agent`, a DaemonSet): time slices, GPU topology and the
    cleanup of GPU processes that evicted pods leave behind."""

    poll_interval: Seconds = Field(10.0, gt=0)
    """How often the agent reads the node, NVML and the pods."""
    orphan_grace: Seconds = Field(60.0, ge=0)
    """A GPU process whose pod is gone must stay so this long before SIGTERM (a pod list
    read before its pod appeared, a container shutting down)."""
    kill_timeout: Seconds = Field(10.0, gt=0)
    """SIGTERM, then SIGKILL when the process is still alive this long after."""
    dry_run: bool | None = None
    """Report what would be killed, set and lifted, and change nothing. Unset: follows
    `control.dry_run`."""
    time_slice: bool = True
    """Apply the node's time-slice label with nvidia-smi (needs CAP_SYS_ADMIN; off: the
    DaemonSet may drop that capability)."""
    proc_root: str = "/proc"
    """The host's /proc (the DaemonSet runs with hostPID)."""
    sys_root: str = "/sys"
    """The host's /sys (NUMA node of each GPU's PCI device)."""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """The kubelet pod-resources API (read-only mount); unreachable: no device metric."""
    nvidia_smi: str = Field("nvidia-smi", min_length=1)
    """The nvidia-smi binary (name on PATH or a path)."""
    command_timeout: Seconds = Field(30.0, gt=0)
    """An nvidia-smi call slower than this failed."""
    pod_resources_timeout: Seconds = Field(5.0, gt=0)
    """A kubelet pod-resources `List` is abandoned after this."""


class SchedulerConfig(StrictModel):
    """The scheduler extender (`gpuscaler extender`): memory- and NUMA-aware placement."""

    scheduler_name: str = Field("gpu-scheduler", min_length=1)
    """spec.schedulerName of the pods the second kube-scheduler (and so the extender) places."""
    cache_ttl: Seconds = Field(5.0, gt=0)
    """GPU state is refreshed this often; a node not refreshed for 3 TTLs is filtered out."""
    memory_margin: float = Field(0.1, ge=0, lt=1)
    """Share of each GPU's memory never handed out: the design's 10 % OOM margin."""
    reservation_ttl: Seconds = Field(300.0, gt=0)
    """A bound pod's memory counts as used until measured memory shows it, or this long
    (an image pull and a CUDA start)."""
    sample_max_age: Seconds = Field(60.0, gt=0)
    """Only dcgm-exporter samples younger than this count (two 30 s exporter intervals)."""
    node_resync: Seconds = Field(30.0, gt=0)
    """Node objects (topology annotation, NUMA label, pool labels) are re-read this often."""
    lease: LeaseConfig = LeaseConfig(name="gpuscaler-extender")
    """The extender's own Lease: one replica holds the reservation ledger."""
    max_body_bytes: int = Field(4 << 20, ge=1024, le=256 << 20)
    """A verb's request body above this is refused (413): 4 MiB holds 5,000 node names
    (nodeCacheCapable, as deployed) many times over."""
    max_nodes: int = Field(10_000, ge=1)
    """A filter or prioritize request naming more nodes is refused (400): twice the
    5,000 nodes Kubernetes supports."""
    tls_cert_file: str | None = None
    """HTTPS on the verbs' port with this certificate, `tls_key_file` and client
    certificates required, signed by `client_ca_file` (kube-scheduler's tlsConfig)."""
    tls_key_file: str | None = None
    client_ca_file: str | None = None

    @model_validator(mode="after")
    def _check_tls(self) -> Self:
        files = (self.tls_cert_file, self.tls_key_file, self.client_ca_file)
        if any(f is not None for f in files) and None in files:
            raise ValueError("TLS needs tls_cert_file, tls_key_file and client_ca_file together")
        return self


class ExternalScalerConfig(StrictModel):
    """KEDA's External Scaler gRPC service (gpuscaler.extscaler): a ScaledObject's trigger
    `type: external` pointing at gpuscaler gets the forecast floor as a metric."""

    port: int | None = Field(None, ge=1, le=65535)
    """Port `gpuscaler run` serves it on; null: off, so a bare config opens no port."""
    host: str = Field("0.0.0.0", min_length=1)
    """Address to listen on (all: KEDA's operator reaches it through the Service)."""
    service_names: tuple[str, ...] = ("gpuscaler",)
    """An external trigger whose scalerAddress host starts with one of these names is
    gpuscaler's: that ScaledObject's floor is served, never patched."""
    max_age: Seconds | None = Field(None, gt=0)
    """A floor older than this is not served (the reactive triggers decide, as in an
    outage); null: three control intervals."""
    workers: int = Field(16, ge=3, le=256)
    """gRPC threads; each open StreamIsActive holds one, and at most workers - 2 streams
    are open, so the polled calls always find a thread."""
    stream_interval: Seconds = Field(5.0, gt=0, le=300)
    """StreamIsActive sends the activity this often (and at once when it changes)."""
