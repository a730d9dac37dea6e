"""The environment a node's workers get: GPU lists per node, interface names, torchrun's defaults."""

from __future__ import annotations

import queue

from minitrain.config import FailureConfig
from minitrain.coordinator.controller import Controller, RunSpec
from minitrain.coordinator.ranks import assign_ranks
from minitrain.coordinator.service import Hub
from minitrain.records import NodeInfo


class _NoAgents:
    def dead_agents(self):
        return {}

    def relaunch(self, node_id):
        return False

    def forget(self, node_id):
        pass


class _NoCheckpoints:
    report_index = 0
    latest = None
    records = ()
    committed_dir_names: set = set()


def _controller(worker_env=None) -> Controller:
    spec = RunSpec(run_id="r", experiment_name="e", run_path="/tmp/x", num_workers=4, node_ids=("a", "b"),
                   payload=b"", backend="nccl", dist_timeout_s=60, failure_policy=FailureConfig(),
                   worker_env=worker_env or {}, gpus_per_worker=1.0)
    return Controller(spec, Hub(), queue.SimpleQueue(), _NoAgents(), _NoCheckpoints(), metrics_log=None)


def _gpu_node(node_id: str, gpu_ids: tuple[int, ...], ifname: str = "ib0") -> NodeInfo:
    return NodeInfo(node_id=node_id, hostname=node_id, address="10.0.0.1", agent_pid=1, cpus=32,
                    memory_bytes=1 << 34, gpu_ids=gpu_ids, ifname=ifname)


def test_each_node_lists_only_its_workers_gpus_and_its_interface():
    nodes = [_gpu_node("a", (0, 1, 2, 3)), _gpu_node("b", (4, 6))]  # b's agent sees physical GPUs 4 and 6
    assignments = assign_ranks(nodes, 4, gpus_per_worker=1.0, slots={"a": 2})
    controller = _controller()
    by_node = {n.node_id: [a for a in assignments if a.node_id == n.node_id] for n in nodes}
    env_a = controller._node_env(nodes[0], by_node["a"])
    env_b = controller._node_env(nodes[1], by_node["b"])
    assert env_a["CUDA_VISIBLE_DEVICES"] == "0,1" and env_b["CUDA_VISIBLE_DEVICES"] == "4,6"
    # get_device() is cuda:<local rank>: each worker's index into its node's list.
    assert [a.gpu_ids for a in by_node["b"]] == [(0,), (1,)]
    assert env_a["NCCL_SOCKET_IFNAME"] == env_a["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env_a["OMP_NUM_THREADS"] == "1"  # several workers share the node, as torchrun does


def test_user_choices_win_over_the_defaults():
    nodes = [_gpu_node("a", (0, 1))]
    assignments = assign_ranks(nodes, 2, gpus_per_worker=1.0)
    env = _controller({"NCCL_SOCKET_IFNAME": "eth1", "OMP_NUM_THREADS": "8"})._node_env(nodes[0], assignments)
    assert env["NCCL_SOCKET_IFNAME"] == "eth1" and env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env["OMP_NUM_THREADS"] == "8"
