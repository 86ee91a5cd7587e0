"""The cluster's current state from a YAML state file (`once --state FILE`)."""

from __future__ import annotations

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.config import Config


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
