"""minitrain.coordinator.policy.ranks.assign_ranks: placement over NodeInfo records (pure, no processes)."""

from __future__ import annotations

import collections
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain.coordinator.policy.elastic import fitting_workers
from minitrain.coordinator.policy.ranks import assign_ranks, node_assignments, rank_counts
from minitrain.errors import ConfigError
from minitrain.records import NodeInfo, WorkerAssignment


def node(name: str, gpus: int = 0, cpus: int = 2) -> NodeInfo:
    return NodeInfo(node_id=f"id-{name}", hostname=name, address=f"10.0.0.{len(name)}", agent_pid=100,
                    cpus=cpus, memory_bytes=1 << 30, gpu_ids=tuple(range(gpus)))


def per_node(assignments: list[WorkerAssignment]) -> dict[str, list[WorkerAssignment]]:
    grouped: dict[str, list[WorkerAssignment]] = collections.defaultdict(list)
    for a in assignments:
        grouped[a.node_id].append(a)
    return dict(grouped)


def check_invariants(assignments: list[WorkerAssignment], nodes: list[NodeInfo], num_workers: int,
                     gpus_per_worker: float) -> None:
    """What every placement must satisfy, whatever the strategy."""
    assert [a.rank for a in assignments] == list(range(num_workers))
    assert all(a.world_size == num_workers for a in assignments)
    order = [n.node_id for n in nodes]
    by_node = per_node(assignments)
    # Ranks are ordered by node (in the given order), then by local rank: each node's ranks are contiguous.
    node_sequence = [a.node_id for a in assignments]
    used = list(dict.fromkeys(node_sequence))
    assert used == sorted(used, key=order.index)
    assert sum(1 for i in range(1, len(node_sequence)) if node_sequence[i] != node_sequence[i - 1]) == \
        len(used) - 1
    for node_rank, node_id in enumerate(used):
        members = by_node[node_id]
        assert [m.local_rank for m in members] == list(range(len(members)))
        assert {m.local_world_size for m in members} == {len(members)}
        assert {m.node_rank for m in members} == {node_rank}
        info = nodes[order.index(node_id)]
        if gpus_per_worker > 0:
            for m in members:
                assert len(m.gpu_ids) == math.ceil(gpus_per_worker)
                assert all(0 <= g < len(info.gpu_ids) for g in m.gpu_ids), (m, info.gpu_ids)
            if gpus_per_worker >= 1:
                flat = [g for m in members for g in m.gpu_ids]
                assert len(flat) == len(set(flat)), "a whole GPU is given to two workers"
        else:
            assert all(m.gpu_ids == () for m in members)


# ---------------------------------------------------------------------------------- examples


def test_cpu_single_node():
    result = assign_ranks([node("a")], 3)
    assert result == [
        WorkerAssignment(rank=r, local_rank=r, world_size=3, local_world_size=3, node_rank=0,
                         node_id="id-a", gpu_ids=()) for r in range(3)
    ]


def test_cpu_workers_may_oversubscribe_cores():
    result = assign_ranks([node("a", cpus=1)], 8)
    check_invariants(result, [node("a", cpus=1)], 8, 0.0)


def test_zero_workers_is_empty():
    assert assign_ranks([node("a")], 0) == []


def test_cpu_pack_fills_the_first_node():
    nodes = [node("a", cpus=4), node("b"), node("c")]
    result = assign_ranks(nodes, 4, placement_strategy="PACK")
    assert {a.node_id for a in result} == {"id-a"}
    check_invariants(result, nodes, 4, 0.0)


def test_cpu_workers_on_several_nodes_fit_their_cpus_or_slots():
    nodes = [node("a", cpus=2), node("b", cpus=2), node("c", cpus=8)]
    result = assign_ranks(nodes, 5, placement_strategy="PACK")  # a: 2, b: 2, c: 1
    assert [len(v) for v in per_node(result).values()] == [2, 2, 1]
    result = assign_ranks(nodes, 5, placement_strategy="PACK", slots={"id-a": 1, "id-c": 2})
    assert {k: len(v) for k, v in per_node(result).items()} == {"id-a": 1, "id-b": 2, "id-c": 2}
    with pytest.raises(ConfigError) as info:
        assign_ranks(nodes, 13, placement_strategy="PACK")
    table = str(info.value).splitlines()[1:]
    assert table[0].split() == ["host", "cpus", "memory", "gpus", "slots", "room"]
    assert table[3].split()[0] == "c" and table[3].split()[-1] == "8"


def test_cpu_spread_deals_round_robin_but_ranks_stay_node_ordered():
    nodes = [node("a"), node("b"), node("c")]
    result = assign_ranks(nodes, 5, placement_strategy="SPREAD")
    check_invariants(result, nodes, 5, 0.0)
    counts = {k: len(v) for k, v in per_node(result).items()}
    assert counts == {"id-a": 2, "id-b": 2, "id-c": 1}
    assert [(a.rank, a.node_id, a.local_rank, a.node_rank) for a in result] == [
        (0, "id-a", 0, 0), (1, "id-a", 1, 0), (2, "id-b", 0, 1), (3, "id-b", 1, 1), (4, "id-c", 0, 2),
    ]


def test_spread_with_fewer_workers_than_nodes_skips_unused_nodes_in_node_rank():
    nodes = [node("a"), node("b"), node("c")]
    result = assign_ranks(nodes, 2, placement_strategy="SPREAD")
    assert [(a.node_id, a.node_rank, a.local_world_size) for a in result] == [("id-a", 0, 1), ("id-b", 1, 1)]


def test_gpu_pack_fills_each_node_to_capacity():
    nodes = [node("a", gpus=2), node("b", gpus=4)]
    result = assign_ranks(nodes, 5, gpus_per_worker=1, placement_strategy="PACK")
    check_invariants(result, nodes, 5, 1)
    assert [(a.rank, a.node_id, a.local_rank, a.gpu_ids, a.local_world_size) for a in result] == [
        (0, "id-a", 0, (0,), 2), (1, "id-a", 1, (1,), 2),
        (2, "id-b", 0, (0,), 3), (3, "id-b", 1, (1,), 3), (4, "id-b", 2, (2,), 3),
    ]


def test_gpu_spread_respects_capacity():
    nodes = [node("a", gpus=1), node("b", gpus=3)]
    result = assign_ranks(nodes, 4, gpus_per_worker=1, placement_strategy="SPREAD")
    check_invariants(result, nodes, 4, 1)
    assert {k: len(v) for k, v in per_node(result).items()} == {"id-a": 1, "id-b": 3}


def test_gpu_node_without_gpus_is_skipped():
    nodes = [node("cpu-only"), node("gpu", gpus=2)]
    result = assign_ranks(nodes, 2, gpus_per_worker=1)
    assert [(a.node_id, a.node_rank) for a in result] == [("id-gpu", 0), ("id-gpu", 0)]


def test_two_gpus_per_worker_get_disjoint_pairs():
    nodes = [node("a", gpus=4)]
    result = assign_ranks(nodes, 2, gpus_per_worker=2)
    assert [a.gpu_ids for a in result] == [(0, 1), (2, 3)]


@pytest.mark.parametrize("strategy", ["PACK", "SPREAD"])
def test_gpu_shortage_raises_config_error_naming_what_is_missing(strategy):
    nodes = [node("alpha", gpus=1), node("beta", gpus=2)]
    with pytest.raises(ConfigError) as info:
        assign_ranks(nodes, 4, gpus_per_worker=1, placement_strategy=strategy)
    text = str(info.value)
    assert isinstance(info.value, ValueError)
    for needle in ("4 workers", "room for 3", "alpha: 1 GPU", "beta: 2 GPU", "num_workers",
                   "resources_per_worker['GPU']"):
        assert needle in text, (needle, text)


def test_gpu_request_with_no_nodes_says_so():
    with pytest.raises(ConfigError, match="no nodes"):
        assign_ranks([], 1, gpus_per_worker=1)


def test_gpu_request_on_cpu_only_nodes_fails():
    with pytest.raises(ConfigError, match="room for 0"):
        assign_ranks([node("a"), node("b")], 1, gpus_per_worker=1)


def test_fractional_gpus_share_the_node_gpus():
    nodes = [node("a", gpus=1)]
    result = assign_ranks(nodes, 2, gpus_per_worker=0.5)
    check_invariants(result, nodes, 2, 0.5)
    assert [a.gpu_ids for a in result] == [(0,), (0,)]


def test_gpus_above_one_never_index_past_the_node():
    nodes = [node("a", gpus=3)]
    try:
        result = assign_ranks(nodes, 2, gpus_per_worker=1.5)
    except ConfigError:
        return  # refusing is a fine answer too: 2 workers x 2 whole GPUs do not fit on 3
    check_invariants(result, nodes, 2, 1.5)


def test_strict_spread_needs_a_node_per_worker():
    with pytest.raises(ConfigError):
        assign_ranks([node("a"), node("b")], 3, placement_strategy="STRICT_SPREAD")


def test_strict_pack_needs_one_node():
    with pytest.raises(ConfigError):
        assign_ranks([node("a", gpus=1), node("b", gpus=1)], 2, gpus_per_worker=1,
                     placement_strategy="STRICT_PACK")


# ---------------------------------------------------------------------------------- property


@st.composite
def placements(draw, fits: bool = True):
    gpus_per_worker = draw(st.sampled_from([0.0, 1.0, 2.0]))
    gpu_counts = draw(st.lists(st.integers(0, 5), min_size=1, max_size=5))
    nodes = [node(f"n{i}", gpus=g, cpus=4) for i, g in enumerate(gpu_counts)]
    strategy = draw(st.sampled_from(["PACK", "SPREAD"]))
    if gpus_per_worker == 0:  # one node may oversubscribe; several hold cpus (4) each
        room = 24 if len(nodes) == 1 else 4 * len(nodes)
        if not fits and len(nodes) == 1:
            gpus_per_worker, room = 1.0, gpu_counts[0]
    else:
        room = sum(g // int(gpus_per_worker) for g in gpu_counts)
    if fits:
        if room == 0:
            gpus_per_worker, room = 0.0, (24 if len(nodes) == 1 else 4 * len(nodes))
        num_workers = draw(st.integers(1, room))
    else:
        num_workers = room + draw(st.integers(1, 4))
    return nodes, num_workers, gpus_per_worker, strategy


@settings(max_examples=300, deadline=None, database=None)  # no example files in the repo
@given(placements())
def test_property_every_fitting_request_yields_a_valid_placement(case):
    nodes, num_workers, gpus_per_worker, strategy = case
    result = assign_ranks(nodes, num_workers, gpus_per_worker, strategy)
    check_invariants(result, nodes, num_workers, gpus_per_worker)
    if strategy == "SPREAD":
        # Round-robin: among nodes that did not hit capacity, counts differ by at most one.
        counts = collections.Counter(a.node_id for a in result)
        cpu_cap = math.inf if len(nodes) == 1 else 4
        cap = {n.node_id: (cpu_cap if gpus_per_worker == 0 else len(n.gpu_ids) // int(gpus_per_worker))
               for n in nodes}
        unsaturated = [counts.get(n.node_id, 0) for n in nodes if counts.get(n.node_id, 0) < cap[n.node_id]]
        if unsaturated:
            assert max(counts.values()) - min(unsaturated) <= 1


@settings(max_examples=150, deadline=None, database=None)
@given(placements(fits=False))
def test_property_requests_that_do_not_fit_raise_config_error(case):
    nodes, num_workers, gpus_per_worker, strategy = case
    with pytest.raises(ConfigError):
        assign_ranks(nodes, num_workers, gpus_per_worker, strategy)


@settings(max_examples=300, deadline=None)
@given(cpus=st.lists(st.integers(1, 6), min_size=1, max_size=6), num_workers=st.integers(0, 30),
       strategy=st.sampled_from(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]),
       gpus=st.lists(st.integers(0, 3), min_size=6, max_size=6), gpus_per_worker=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
       slots=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=6, max_size=6))
def test_counts_and_one_nodes_assignments_agree_with_the_whole_placement(cpus, num_workers, strategy, gpus,
                                                                         gpus_per_worker, slots):
    """`rank_counts` and `node_assignments` (what an elastic run asks at each connection and turn, in
    O(nodes)) say exactly what `assign_ranks` places, and refuse exactly what it refuses."""
    nodes = [node(f"h{i}", gpus=gpus[i] if gpus_per_worker else 0, cpus=c) for i, c in enumerate(cpus)]
    slot_map = {n.node_id: slots[i] for i, n in enumerate(nodes) if slots[i] is not None}
    args = (gpus_per_worker, strategy, 1.0, slot_map)
    try:
        whole = assign_ranks(nodes, num_workers, *args)
    except ConfigError as exc:
        with pytest.raises(ConfigError, match=re.escape(str(exc).splitlines()[0])):
            rank_counts(nodes, num_workers, *args)
        with pytest.raises(ConfigError):
            node_assignments(nodes, num_workers, nodes[0].node_id, *args)
        return
    placed = collections.Counter(a.node_id for a in whole)
    assert rank_counts(nodes, num_workers, *args) == [placed[n.node_id] for n in nodes]
    for n in nodes:
        assert node_assignments(nodes, num_workers, n.node_id, *args) == [a for a in whole if a.node_id == n.node_id]
    assert node_assignments(nodes, num_workers, "not-a-node", *args) == []
    # fitting_workers (the elastic size) is the largest count the whole placement accepts
    most = num_workers or 1
    fits = next((k for k in range(most, 0, -1) if _places(nodes, k, args)), 0)
    assert fitting_workers(nodes, most, gpus_per_worker, strategy, 1.0, slot_map) == fits


def _places(nodes, count, args) -> bool:
    try:
        assign_ranks(nodes, count, *args)
        return True
    except ConfigError:
        return False
