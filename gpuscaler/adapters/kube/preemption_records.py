"""Preemption state in the cluster: one ConfigMap in gpuscaler's namespace holds every
victim's record as JSON under `<namespace>.<pod>`, written before each step acts and
checked against the transition table, so a restart resumes and never repeats a step.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, api_error, json_body
from gpuscaler.core.preemption import VictimState

STATE_CONFIGMAP = "gpuscaler-preemptions"
KEEP_FINISHED = 24 * 3600
"""Finished records are kept a day: evidence for operators, and the per-hour limit."""
CHECKPOINT_REQUESTED = "gpuscaler.io/checkpoint-requested"
CHECKPOINT_DONE = "gpuscaler.io/checkpoint-done"
LAST_CHECKPOINT = "gpuscaler.io/last-checkpoint"
PREEMPTIBLE = "gpuscaler.io/preemptible"
GPU_MEMORY = "gpuscaler.io/gpu-memory-gib"
VICTIM_ANNOTATION = "gpuscaler.io/preemption"
BENEFICIARY_ANNOTATION = "gpuscaler.io/preempting"
QUARANTINE_TAINT = "gpuscaler.io/gpu-memory-held"


def record_key(victim: str) -> str:
    return victim.replace("/", ".")


def parse_record(key: str, raw: str) -> VictimState:
    try:
        return VictimState(**json.loads(raw))
    except (ValueError, TypeError) as e:
        raise KubeError(f"ConfigMap {STATE_CONFIGMAP} key {key}: unreadable record: {e}") from None


def read_records(core: client.CoreV1Api, namespace: str) -> dict[str, Any] | None:
    """The records ConfigMap as JSON, None while it does not exist (no preemption yet)."""
    try:
        return json_body(
            core.read_namespaced_config_map(STATE_CONFIGMAP, namespace, _preload_content=False)
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise api_error(f"read ConfigMap {namespace}/{STATE_CONFIGMAP}", e) from None
