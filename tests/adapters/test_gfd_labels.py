"""Node pools as GPU feature discovery labels them (NVIDIA/k8s-device-plugin
internal/lm/resource.go): a pool keeps every node through fragments 1 -> 2 -> 4 -> 2 -> 1,
and a MIG pool is recognised and left alone."""

from __future__ import annotations

from typing import Any

import pytest
from kubeobjects import node
from kubernetes import client

from gpuscaler.adapters.kube.cluster import pool_state, selects
from gpuscaler.adapters.kube.objects import parse_objects
from gpuscaler.adapters.scheduling import SchedulingKube
from gpuscaler.config import Config, parse_config

MODEL = "NVIDIA A100-SXM4-80GB"  # as NVML names it; GFD replaces spaces with '-'
PRODUCT = MODEL.replace(" ", "-")


def gfd(
    strategy: str, replicas: int, renamed: bool = False, mig_strategy: str = "none"
) -> dict[str, str]:
    """The labels GFD sets for `strategy` (none, time-slicing, mps, mig) at `replicas`, with
    GFD's `migStrategy` flag (none, single, mixed; the GPU Operator's `mig.strategy`)."""
    product = PRODUCT
    if strategy == "mig":
        return {
            "nvidia.com/gpu.product": f"{PRODUCT}-MIG-1g.10gb",
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.replicas": "1",
        }
    shared = replicas > 1 and strategy in ("time-slicing", "mps") and not renamed
    if shared:
        product += "-SHARED"
    labels = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": strategy if replicas > 1 else "none",
    }
    if mig_strategy != "none":  # internal/lm/strategy.go: on every node, MIG or not
        labels["nvidia.com/mig.strategy"] = mig_strategy
    return labels


def gfd_mixed_mig(profile: str = "1g.10gb", count: int = 7) -> dict[str, str]:
    """A node whose GPU has MIG on under mig.strategy mixed (internal/lm/mig-strategy.go,
    newMigStrategyMixedLabeler): the parent's product unchanged and without sharing
    (NewGPUResourceLabelerWithoutSharing), and one resource per MIG profile,
    `nvidia.com/mig-<profile>`, labelled by NewMIGResourceLabeler."""
    resource = f"nvidia.com/mig-{profile}"
    return {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.product": PRODUCT,
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.replicas": "1",
        f"{resource}.count": str(count),
        f"{resource}.product": f"{PRODUCT}-MIG-{profile}",
        f"{resource}.replicas": "1",
    }


CONFIG = parse_config(
    f"""
node_pools:
  - {{name: a100, gpu_memory_gib: 80, selector: {{label: nvidia.com/gpu.product, value: {PRODUCT}}}}}
workloads: []
"""
)


def _objects(nodes: list[dict[str, Any]]) -> Any:
    return parse_objects(nodes, CONFIG)


@pytest.mark.parametrize(
    ("label", "value", "selector", "matches"),
    [
        ("nvidia.com/gpu.product", PRODUCT, PRODUCT, True),
        ("nvidia.com/gpu.product", PRODUCT + "-SHARED", PRODUCT, True),
        ("nvidia.com/gpu.product", PRODUCT + "-SHARED-SHARED", PRODUCT, False),
        ("nvidia.com/gpu.product", PRODUCT + "-MIG-1g.10gb", PRODUCT, False),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3", PRODUCT, False),
        ("pool", "batch-SHARED", "batch", False),  # only *.product labels get the suffix
        ("pool", "batch", "batch", True),
        ("nvidia.com/gpu.product", None, PRODUCT, False),
    ],
)
def test_a_product_selector_matches_with_or_without_the_shared_suffix(
    label: str, value: str | None, selector: str, matches: bool
) -> None:
    assert selects(selector, value, label) is matches


@pytest.mark.parametrize("mig_strategy", ["none", "single", "mixed"])
@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
def test_a_pool_keeps_every_node_through_1_2_4_2_1_fragments(
    strategy: str, mig_strategy: str
) -> None:
    # GFD labels nvidia.com/mig.strategy on every node once the strategy is single or
    # mixed (a GPU Operator setting), MIG on or not: that alone is no MIG node.
    prefix = "ts" if strategy == "time-slicing" else "mps"
    for fragments in (1, 2, 4, 2, 1):
        labels = gfd(strategy, fragments, mig_strategy=mig_strategy)
        nodes = [
            node(f"gpu-{i}", config=f"{prefix}-{fragments}", extra_labels=labels) for i in range(3)
        ]
        state = pool_state(_objects(nodes), CONFIG.node_pools[0])
        assert [n.name for n in state.nodes] == ["gpu-0", "gpu-1", "gpu-2"], fragments
        assert state.fragments == fragments and state.problem is None, (fragments, state.problem)


def test_a_pool_half_way_through_a_rollout_still_holds_both_label_forms() -> None:
    nodes = [
        node("gpu-0", config="ts-2", extra_labels=gfd("time-slicing", 2)),
        node("gpu-1", config="ts-1", extra_labels=gfd("time-slicing", 1)),
    ]
    state = pool_state(_objects(nodes), CONFIG.node_pools[0])
    assert [n.name for n in state.nodes] == ["gpu-0", "gpu-1"]


def test_a_selector_written_with_the_suffix_selects_the_pool_too() -> None:
    config = parse_config(
        f"""
node_pools:
  - {{name: a100, gpu_memory_gib: 80, selector: {{label: nvidia.com/gpu.product, value: {PRODUCT}-SHARED}}}}
workloads: []
"""
    )
    nodes = [node("gpu-0", config="ts-1", extra_labels=gfd("time-slicing", 1))]
    assert [n.name for n in pool_state(_objects(nodes), config.node_pools[0]).nodes] == ["gpu-0"]


MIG_CONFIG = parse_config(
    "node_pools: [{name: mig, gpu_memory_gib: 80, selector: {label: pool, value: mig}}]\n"
)


@pytest.mark.parametrize(
    ("labels", "config", "mig"),
    [
        ({**gfd("mig", 1), "pool": "mig"}, MIG_CONFIG, True),
        (gfd_mixed_mig(), CONFIG, True),  # its parent product is the pool's
        (gfd_mixed_mig(count=0), CONFIG, False),  # a resource label GFD no longer writes
    ],
    ids=["single strategy", "mixed strategy", "mixed strategy with no devices left"],
)
def test_a_mig_pool_is_recognised_and_its_fragments_left_alone(
    labels: dict[str, str], config: Config, mig: bool
) -> None:
    nodes = [node("gpu-0", config="ts-1", extra_labels=labels)]
    state = pool_state(parse_objects(nodes, config), config.node_pools[0])
    assert [n.name for n in state.nodes] == ["gpu-0"]
    if mig:  # nothing to change: no fragments decision can be made
        assert state.problem is not None and "MIG pool" in state.problem
        assert state.fragments is None
    else:
        assert state.problem is None


@pytest.mark.parametrize("fragments", [1, 2, 4])
def test_the_extender_places_a_shared_node_in_its_pool_as_the_controller_does(
    fragments: int,
) -> None:
    labels = gfd("time-slicing", fragments)
    kube = SchedulingKube(client.ApiClient(), CONFIG)
    (pool,) = CONFIG.node_pools
    assert kube._pool(labels) == pool.name
    assert [n.name for n in pool_state(_objects([node("g", extra_labels=labels)]), pool).nodes] == [
        "g"
    ]
