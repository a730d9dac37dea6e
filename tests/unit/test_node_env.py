"""The environment a node's workers get: GPU lists per node, interface names, torchrun's defaults."""

from __future__ import annotations

from minitrain.coordinator.facts.worker_group import node_env
from minitrain.coordinator.policy.ranks import assign_ranks
from minitrain.records import NodeInfo


def _gpu_node(node_id: str, gpu_ids: tuple[int, ...], ifname: str = "ib0") -> NodeInfo:
    return NodeInfo(node_id=node_id, hostname=node_id, address="10.0.0.1", agent_pid=1, cpus=32,
                    memory_bytes=1 << 34, gpu_ids=gpu_ids, ifname=ifname)


def test_each_node_lists_only_its_workers_gpus_and_its_interface():
    nodes = [_gpu_node("a", (0, 1, 2, 3)), _gpu_node("b", (4, 6))]  # b's agent sees physical GPUs 4 and 6
    assignments = assign_ranks(nodes, 4, gpus_per_worker=1.0, slots={"a": 2})
    by_node = {n.node_id: [a for a in assignments if a.node_id == n.node_id] for n in nodes}
    env_a = node_env({}, nodes[0], by_node["a"])
    env_b = node_env({}, nodes[1], by_node["b"])
    assert env_a["CUDA_VISIBLE_DEVICES"] == "0,1" and env_b["CUDA_VISIBLE_DEVICES"] == "4,6"
    # get_device() is cuda:<local rank>: each worker's index into its node's list.
    assert [a.gpu_ids for a in by_node["b"]] == [(0,), (1,)]
    assert env_a["NCCL_SOCKET_IFNAME"] == env_a["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env_a["OMP_NUM_THREADS"] == "1"  # several workers share the node, as torchrun does


def test_user_choices_win_over_the_defaults():
    nodes = [_gpu_node("a", (0, 1))]
    assignments = assign_ranks(nodes, 2, gpus_per_worker=1.0)
    env = node_env({"NCCL_SOCKET_IFNAME": "eth1", "OMP_NUM_THREADS": "8"}, nodes[0], assignments)
    assert env["NCCL_SOCKET_IFNAME"] == "eth1" and env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env["OMP_NUM_THREADS"] == "8"
