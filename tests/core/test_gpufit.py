"""The design's Filter and Score (core/gpufit.py) as tables of cases."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscaler.core.gpufit import (
    AnnotationError,
    Gpu,
    NodeGpus,
    NodeView,
    PodRequest,
    Reservation,
    fit_problem,
    freshness,
    node_view,
    numa_map,
    place,
    pod_request,
    request_problem,
    reservation_annotations,
    reservation_expiry,
    reservation_from_pod,
    with_numa,
    with_reservations,
)
from gpuscaler.core.gputable import extender_scores, fits, node_table, scores
from gpuscaler.core.parsing import parse_count

MARGIN = 0.1
A100 = 40960.0  # MiB


def node(
    name: str, used: list[float], numa: Sequence[int | None] | None = None, total: float = A100
) -> NodeGpus:
    numa = numa or [None] * len(used)
    gpus = tuple(Gpu(f"{name}-gpu{i}", i, total, u, numa[i]) for i, u in enumerate(used))
    return NodeGpus(name, gpus, sampled_at=100.0)


def score(view: NodeView, req: PodRequest) -> float:
    return float(scores(node_table({view.name: view}), np.array([0]), req)[0])


def test_the_design_example_8_gpus_each_40_percent_used_and_2_allocated_fit_a_1_gpu_pod() -> None:
    # 8 A100s, 4 services holding 2 GPUs each at 40 % memory: the default scheduler sees
    # the node full, the memory view sees 8 x (40960 - 16384 - 4096) = 163,840 MiB usable.
    n = node("a100", [0.4 * A100] * 8)
    view = node_view(n, MARGIN)
    assert view.usable_sum == pytest.approx(8 * 0.5 * A100)
    assert fit_problem(view, PodRequest(8192, 1)) is None
    assert fit_problem(view, PodRequest(20480, 1)) is None  # 20 GiB on one GPU: 20480 usable
    assert fit_problem(view, PodRequest(20481, 1)) is not None


FEW = "node n has {} GPU(s) with {} MiB usable, pod requests {}"


@pytest.mark.parametrize(
    ("used", "req", "problem"),
    [
        # sum rule: max(0, total - used - 10 %) summed over GPUs
        ([A100] * 2, PodRequest(1, 1), "node n has 0 MiB usable, pod requests 1 MiB"),
        ([0.0, A100], PodRequest(36864, 1), None),  # exactly total - 10 %
        ([0.0, A100], PodRequest(36865, 1), "node n has 36864 MiB usable, pod requests 36865 MiB"),
        # used above total - margin never counts negative
        ([40000.0, 0.0], PodRequest(36864, 1), None),
        # the sum covers it but no single GPU does: a 1-GPU pod needs one GPU holding it all
        ([20480.0, 20480.0], PodRequest(20000, 1), FEW.format(0, 20000, 1)),
        # multi-GPU: k GPUs with ceil(memory / k) each
        ([0.0, 0.0, A100, A100], PodRequest(60000, 2), None),
        ([0.0, 20480.0, A100, A100], PodRequest(50000, 2), FEW.format(1, 25000, 2)),
        ([0.0] * 8, PodRequest(8, 8), None),
        ([0.0] * 7 + [A100], PodRequest(8, 8), FEW.format(7, 1, 8)),
    ],
)
def test_filter_keeps_a_node_only_when_usable_memory_covers_the_request(
    used: list[float], req: PodRequest, problem: str | None
) -> None:
    assert fit_problem(node_view(node("n", used), MARGIN), req) == problem


@pytest.mark.parametrize(
    ("used", "numa", "req", "expected"),
    [
        # even use, 1-GPU pod: fragmentation score 100 x 0.6, no bonus
        ([0.0] * 4, None, PodRequest(1000, 1), 60.0),
        # half the GPUs full, half empty: stddev 0.5 -> 0.6 x 50
        ([A100, 0.0, A100, 0.0], None, PodRequest(1000, 1), 30.0),
        # 8 GPUs in 2 NUMA domains of 4, a 4-GPU pod: one domain holds it -> full bonus
        ([0.0] * 8, [0, 0, 0, 0, 1, 1, 1, 1], PodRequest(4000, 4), 100.0),
        # 4 GPUs spread 2 + 2 over two domains: best domain holds 2 of 4 -> bonus 50
        ([0.0] * 4, [0, 0, 1, 1], PodRequest(4000, 4), 60.0 + 0.4 * 50),
        # unknown topology: each GPU its own domain -> bonus 100 x 1 / 4
        ([0.0] * 4, None, PodRequest(4000, 4), 60.0 + 0.4 * 25),
        # only fitting GPUs count for the bonus: domain 0 has 4 GPUs but 2 are full, domain
        # 1 still holds 4 (full bonus); 2 of 8 full: stddev sqrt(0.25 x 0.75)
        (
            [A100, A100] + [0.0] * 6,
            [0] * 4 + [1] * 4,
            PodRequest(4000, 4),
            0.6 * (100 - 43.30127) + 40,
        ),
    ],
)
def test_score_weighs_even_memory_use_and_one_numa_domain(
    used: list[float], numa: list[int | None] | None, req: PodRequest, expected: float
) -> None:
    assert score(node_view(node("n", used, numa), MARGIN), req) == pytest.approx(expected)


def test_a_4_gpu_pod_prefers_the_node_with_4_gpus_in_one_numa_domain() -> None:
    one_domain = node_view(node("one", [0.0] * 8, [0, 0, 0, 0, 1, 1, 1, 1]), MARGIN)
    # the same free GPUs, but half of each domain is taken: no domain has 4 fitting GPUs
    split = node_view(
        node("split", [A100, A100, 0, 0, A100, A100, 0, 0], [0] * 4 + [1] * 4), MARGIN
    )
    req = PodRequest(4 * 8192, 4)
    assert fit_problem(split, req) is None  # cross-NUMA: kept ...
    assert score(one_domain, req) > score(split, req)  # ... but down-weighted: bonus 50
    assert score(split, req) == pytest.approx(0.6 * (100 - 100 * split.fragmentation) + 0.4 * 50)


@pytest.mark.parametrize(
    ("value", "mapped"),
    [(0.0, 0), (4.99, 0), (5.0, 1), (14.99, 1), (15.0, 2), (54.9, 5), (95.0, 10), (100.0, 10)],
)
def test_scores_map_to_0_to_10_rounded_half_up(value: float, mapped: int) -> None:
    assert extender_scores(np.array([value]))[0] == mapped


@pytest.mark.parametrize(
    ("age", "state"),
    [
        (0.0, "fresh"),
        (5.0, "fresh"),
        (5.1, "stale_scored"),
        (15.0, "stale_scored"),
        (15.1, "stale"),
    ],
)
def test_stale_nodes_are_scored_from_last_state_up_to_three_ttls_then_filtered(
    age: float, state: str
) -> None:
    assert freshness(age, ttl=5.0) == state


def test_reservations_count_as_used_memory() -> None:
    n = node("n", [0.0, 0.0])
    r = Reservation("uid-1", "ns", "p", "n", (("n-gpu0", 30000.0),), (("n-gpu0", 0.0),), 50.0)
    other = Reservation("uid-2", "ns", "q", "elsewhere", (("n-gpu1", 30000.0),), (), 50.0)
    view = node_view(with_reservations(n, [r, other]), MARGIN)
    assert view.usable_sum == pytest.approx(2 * 36864 - 30000)
    assert fit_problem(view, PodRequest(36864, 1)) is None  # gpu1 still free
    twice = node_view(with_reservations(n, [r, r]), MARGIN)
    assert fit_problem(twice, PodRequest(36864, 1)) is None
    two = Reservation("uid-3", "ns", "s", "n", (("n-gpu1", 30000.0),), (), 50.0)
    full = node_view(with_reservations(n, [r, two]), MARGIN)
    assert (
        fit_problem(full, PodRequest(8000, 1))
        == "node n has 0 GPU(s) with 8000 MiB usable, pod requests 1"
    )


@pytest.mark.parametrize(
    ("used_now", "sampled_at", "now", "why"),
    [
        (1000.0, 100.0, 110.0, None),  # measured before the bind: nothing known yet
        (1000.0, 130.0, 140.0, None),  # measured after, memory not grown yet
        (1000.0 + 9000.0, 130.0, 140.0, "measured"),  # grew by >= 90 % of 10,000
        (1000.0 + 8999.0, 130.0, 140.0, None),
        (1000.0, 130.0, 120.0 + 301.0, "ttl"),  # never showed: expires after the TTL
    ],
)
def test_a_reservation_ends_when_measured_memory_shows_the_pod_or_after_its_ttl(
    used_now: float, sampled_at: float, now: float, why: str | None
) -> None:
    r = Reservation("u", "ns", "p", "n", (("n-gpu0", 10000.0),), (("n-gpu0", 1000.0),), 120.0)
    n = NodeGpus("n", (Gpu("n-gpu0", 0, A100, used_now),), sampled_at)
    assert reservation_expiry(r, n, now, ttl=300.0) == why


def test_placement_takes_the_tightest_gpus_inside_one_numa_domain() -> None:
    n = node("n", [0, 20000, 0, 0, 0, 30000, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1])
    # 1-GPU pod: the fullest GPU that still fits (best fit keeps big holes)
    assert place(n, PodRequest(5000, 1), MARGIN) == (("n-gpu5", 5000.0),)
    # 4-GPU pod of 10,000 each: gpu5 cannot hold it, domain 0 has 4 fitting GPUs
    chosen = place(n, PodRequest(40000, 4), MARGIN)
    assert {u for u, _ in chosen} == {"n-gpu0", "n-gpu1", "n-gpu2", "n-gpu3"}
    assert place(n, PodRequest(40000 * 9, 9), MARGIN) == ()


MEM, COUNT = "gpu-scheduler/memory-mb", "gpu-scheduler/gpu-count"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", 0), ("8192", 8192), ("007", 7), (" 1 ", 1), ("-1", -1), ("9" * 18, 10**18 - 1)]
    + [(t, None) for t in ("", "+1", "1_0", "\u00b2", "\u0661", "1e3", "9" * 19)],
)
def test_counts_are_read_from_ascii_digits_only(text: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="is not a whole number"):
            parse_count(text)
    else:
        assert parse_count(text) == expected


@pytest.mark.parametrize(
    ("memory", "count", "expected"),
    [
        (None, None, None),
        ("8192", None, PodRequest(8192, 1)),
        (" 8192 ", "4", PodRequest(8192, 4)),
        ("lots", None, f"annotation {MEM}: 'lots' is not a whole number"),
        ("-5", None, f"annotation {MEM}: -5 must be positive"),
        ("0", None, f"annotation {MEM}: 0 must be positive"),
        ("1.5", None, f"annotation {MEM}: '1.5' is not a whole number"),
        ("10", "x", f"annotation {COUNT}: 'x' is not a whole number"),
        *(  # int() takes each of these; nobody writes them meaning a number
            (text, None, f"annotation {MEM}: {text!r} is not a whole number")
            for text in ("8_192", "+8192", "８１９２", "٨١٩٢", "²")
        ),
        ("10", "65", f"annotation {COUNT}: 65 is above 64"),
        (None, "2", f"annotation {COUNT} needs {MEM}"),
    ],
)
def test_pod_annotations_are_read_or_refused_naming_the_annotation(
    memory: str | None, count: str | None, expected: PodRequest | str | None
) -> None:
    annotations = {k: v for k, v in ((MEM, memory), (COUNT, count)) if v is not None}
    if isinstance(expected, str):
        with pytest.raises(AnnotationError) as e:
            pod_request(annotations)
        assert str(e.value) == expected
    else:
        assert pod_request(annotations) == expected


def test_a_request_above_every_nodes_memory_is_refused_naming_the_annotation() -> None:
    assert request_problem(PodRequest(10, 1), 327680.0) is None
    assert request_problem(PodRequest(400000, 1), 327680.0) == (
        "annotation gpu-scheduler/memory-mb: 400000 MiB is more than any node's GPU memory (327680 MiB)"
    )


def test_numa_comes_from_the_topology_annotation_then_the_label() -> None:
    gpus = node("n", [0.0] * 4).gpus
    topology = json.dumps(
        [
            {"uuid": "n-gpu0", "index": 0, "pci_bus_id": "0000:07:00.0", "numa_node": 0},
            {"uuid": "n-gpu1", "index": 1, "memory_mib": 40960, "numa_node": 1},
            {"uuid": "other", "index": 2, "numa_node": 1},  # matched by index
            {"uuid": "n-gpu3", "index": 3, "numa_node": -1},  # sysfs says -1 when unknown
        ]
    )
    assert numa_map(topology, "1", gpus) == {"n-gpu0": 0, "n-gpu1": 1, "n-gpu2": 1, "n-gpu3": None}
    assert numa_map(None, "2", gpus) == {"n-gpu0": 0, "n-gpu1": 0, "n-gpu2": 1, "n-gpu3": 1}
    assert numa_map(None, None, gpus) == dict.fromkeys(["n-gpu0", "n-gpu1", "n-gpu2", "n-gpu3"])
    assert with_numa(node("n", [0.0] * 4), {"n-gpu2": 1}).gpus[2].numa == 1


TOPOLOGY = "annotation gpuscaler.io/gpu-topology"
PER_NUMA = "label gpuscaler.io/gpus-per-numa-node"


@pytest.mark.parametrize(
    ("topology", "label", "message"),
    [
        ("{not json", None, f"{TOPOLOGY}: not JSON"),
        ('{"uuid": "x"}', None, f"{TOPOLOGY}: expected a JSON list of objects"),
        ('[{"uuid": "x", "numa_node": "zero"}]', None, f"{TOPOLOGY}: numa_node 'zero' is not an integer"),
        (None, "four", f"{PER_NUMA}: 'four' is not a positive whole number"),
        (None, "0", f"{PER_NUMA}: '0' is not a positive whole number"),
        (None, "٤", f"{PER_NUMA}: '٤' is not a positive whole number"),
    ],
)  # fmt: skip
def test_malformed_node_topology_is_refused_naming_the_annotation(
    topology: str, label: str | None, message: str
) -> None:
    with pytest.raises(AnnotationError) as e:
        numa_map(topology, label, node("n", [0.0]).gpus)
    assert str(e.value) == message


def test_a_reservation_round_trips_through_pod_annotations() -> None:
    r = Reservation("u", "ns", "p", "n", (("g0", 4096.0), ("g1", 4096.0)), (("g0", 10.0),), 5.0)
    annotations = reservation_annotations(r, "1970-01-01T00:00:05Z")
    assert annotations["gpu-scheduler/reserved-mb"] == "8192"
    assert annotations["gpu-scheduler/assume-time"] == "1970-01-01T00:00:05Z"
    assert reservation_from_pod("u", "ns", "p", annotations, 5.0) == r
    assert reservation_from_pod("u", "ns", "p", {}, 5.0) is None
    with pytest.raises(AnnotationError, match="gpu-scheduler/reservation"):
        reservation_from_pod("u", "ns", "p", {"gpu-scheduler/reservation": "[]"}, 5.0)


annotation_values = st.one_of(
    st.text(max_size=12), st.integers(-(10**12), 10**12).map(str), st.just(" 8 ")
)


@given(
    st.dictionaries(
        st.sampled_from(["gpu-scheduler/memory-mb", "gpu-scheduler/gpu-count", "other"]),
        annotation_values,
    )
)
def test_any_annotations_give_a_request_or_an_error_naming_the_annotation(
    annotations: dict[str, str],
) -> None:
    try:
        req = pod_request(annotations)
    except AnnotationError as e:
        assert "gpu-scheduler/" in str(e)
        return
    if req is not None:
        assert req.memory_mib > 0 and 1 <= req.gpu_count <= 64
        assert req.per_gpu_mib * req.gpu_count >= req.memory_mib


@given(
    st.lists(st.floats(0, A100), min_size=1, max_size=8), st.integers(1, 200000), st.integers(1, 8)
)
def test_placement_agrees_with_the_filter(used: list[float], memory: int, count: int) -> None:
    n = node("n", used, [i // 4 for i in range(len(used))])
    req = PodRequest(memory, count)
    chosen = place(n, req, MARGIN)
    fits = fit_problem(node_view(n, MARGIN), req) is None
    # k GPUs with ceil(memory / k) each imply the sum rule: filter and placement agree
    assert bool(chosen) == fits
    if fits:
        assert len({u for u, _ in chosen}) == count


@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(0, A100), min_size=1, max_size=8),
            st.lists(st.one_of(st.none(), st.integers(0, 2)), min_size=8, max_size=8),
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 100000),
    st.integers(1, 8),
)
def test_the_array_filter_agrees_with_the_sentences_and_scores_stay_in_range(
    nodes: list[tuple[list[float], list[int | None]]], memory: int, count: int
) -> None:
    views = {
        f"n{i}": node_view(node(f"n{i}", used, numa[: len(used)]), MARGIN)
        for i, (used, numa) in enumerate(nodes)
    }
    table = node_table(views)
    req = PodRequest(memory, count)
    rows = table.rows([*views, "missing"])
    assert rows[-1] == -1
    ok, values = fits(table, rows[:-1], req), scores(table, rows[:-1], req)
    for i, view in enumerate(views.values()):
        assert bool(ok[i]) == (fit_problem(view, req) is None)
        assert 0.0 <= values[i] <= 100.0 + 1e-9
        assert values[i] == pytest.approx(score(view, req), abs=1e-9)  # one row as many
    assert ((extender_scores(values) >= 0) & (extender_scores(values) <= 10)).all()
