"""Where the tuner places trials: packing, spreading, fragmentation, queueing, release (pure), and the
restricted cluster a trial process is handed."""

import pytest

import minitrain
from minitrain.hosts.cluster import ClusterConfig, HostSpec, parse_host_list
from minitrain.tune import with_resources
from minitrain.tune.placement import Demand, HostRoom, Pool
from minitrain.tune.resources import ClusterRoom, trial_demand


def gpu_hosts(*gpus, local=False):
    return [HostRoom(f"h{i}", cpus=64, gpus=n, slots=None, local=local) for i, n in enumerate(gpus)]


def test_two_whole_host_trials_get_one_host_each_and_a_third_queues():
    pool = Pool(gpu_hosts(8, 8))
    eight = Demand(8, cpus=1, gpus=1)
    first, second = pool.place(eight), pool.place(eight)
    assert first.workers == {"h0": 8} and second.workers == {"h1": 8}  # not 16 workers on h0
    assert pool.place(eight) is None  # queued, nothing held
    pool.release(first)
    assert pool.place(eight).workers == {"h0": 8}


def test_pack_prefers_the_tightest_host_that_holds_the_whole_trial():
    pool = Pool(gpu_hosts(8, 4))
    assert pool.place(Demand(2, 1, 1)).workers == {"h1": 2}  # keeps h0's 8 GPUs whole for a big trial
    assert pool.place(Demand(8, 1, 1)).workers == {"h0": 8}


def test_pack_over_several_hosts_when_no_host_holds_it_and_strict_pack_waits():
    pool = Pool(gpu_hosts(4, 4, 4))
    assert pool.place(Demand(2, 1, 1)).workers == {"h0": 2}
    # Fragmented: 2 + 4 + 4 free; 6 workers take the fewest hosts, roomiest first.
    assert pool.place(Demand(6, 1, 1, "STRICT_PACK")) is None
    assert pool.place(Demand(6, 1, 1)).workers == {"h1": 4, "h2": 2}


def cpu_hosts(*cpus):
    return [HostRoom(f"h{i}", cpus=n, gpus=0) for i, n in enumerate(cpus)]


def test_spread_and_strict_spread():
    pool = Pool(cpu_hosts(2, 2, 2))
    assert pool.place(Demand(4, 1, 0, "SPREAD")).workers == {"h0": 2, "h1": 1, "h2": 1}
    assert pool.place(Demand(3, 1, 0, "STRICT_SPREAD")) is None  # h0 is full: two hosts left
    assert pool.place(Demand(2, 1, 0, "STRICT_SPREAD")).workers == {"h1": 1, "h2": 1}
    idle = Pool(cpu_hosts(2, 2, 2))
    assert idle.place(Demand(3, 1, 0, "STRICT_SPREAD")).workers == {"h0": 1, "h1": 1, "h2": 1}
    assert "STRICT_SPREAD" in idle.never_fits(Demand(4, 1, 0, "STRICT_SPREAD"))


def test_slots_and_cpus_limit_workers():
    pool = Pool([HostRoom("a", cpus=4, gpus=0, slots=2), HostRoom("b", cpus=3, gpus=0, slots=None)])
    assert pool.place(Demand(2, 1, 0)).workers == {"b": 2}  # the tightest host: 3 CPUs
    assert pool.place(Demand(3, 1, 0)).workers == {"a": 2, "b": 1}  # a's 2 slots cap it below its 4 CPUs
    assert pool.place(Demand(1, 1, 0)) is None


def test_fractional_gpus_share_a_gpu_as_fit_numbers_them():
    pool = Pool(gpu_hosts(2, local=True)[:1])
    half = Demand(2, 0, 0.5)
    first = pool.place(half)
    assert first.gpus == {"h0": ((0, 1.0),)}  # workers 0 and 1 both on the trial's GPU 0, as assign_ranks
    second = pool.place(half)
    assert second.gpus == {"h0": ((1, 1.0),)}
    assert pool.place(Demand(1, 0, 0.5)) is None
    pool.release(first)
    assert pool.place(Demand(1, 0, 0.5)).gpus == {"h0": ((0, 0.5),)}


def test_a_remote_hosts_gpus_serve_one_trial_at_a_time_but_local_ones_are_handed_out():
    remote = Pool(gpu_hosts(8))
    assert remote.place(Demand(4, 1, 1)).workers == {"h0": 4}
    assert remote.place(Demand(4, 1, 1)) is None  # its fit() would number GPUs from 0 again
    local = Pool(gpu_hosts(8, local=True))
    first, second = local.place(Demand(4, 1, 1)), local.place(Demand(4, 1, 1))
    assert [i for i, _ in first.gpus["h0"]] == [0, 1, 2, 3] and [i for i, _ in second.gpus["h0"]] == [4, 5, 6, 7]
    assert second.local_gpu_indices(["h0"]) == (4, 5, 6, 7)


def test_never_fits_names_the_demand_and_the_hosts():
    why = Pool(gpu_hosts(8, 8)).never_fits(Demand(17, 1, 1))
    assert "17 worker(s) x (1 CPU, 1 GPU), PACK" in why and "h0: 64 CPU, 8 GPU" in why and "add hosts" in why
    assert Pool(gpu_hosts(8, 8)).never_fits(Demand(16, 1, 1)) is None


def test_a_trial_is_handed_only_its_hosts_with_the_drivers_ssh_options():
    cluster = ClusterConfig(hosts=parse_host_list("gpu1:8,gpu2:8"), python="/opt/py/bin/python")
    room = ClusterRoom(cluster, environ={})
    demand = trial_demand(minitrain.torch.TorchTrainer(
        lambda: None, scaling_config=minitrain.ScalingConfig(num_workers=8, use_gpu=True)))
    assert demand == Demand(8, 0.0, 1.0, "PACK")
    first, second = room.reserve(demand), room.reserve(demand)
    assert first.cluster.hosts == (HostSpec("gpu1", 8, local=False),) and first.cluster.python == "/opt/py/bin/python"
    assert second.cluster.hosts == (HostSpec("gpu2", 8, local=False),) and second.host_list() == "gpu2:8"
    assert room.reserve(demand) is None
    room.release(first)
    assert room.reserve(demand).cluster.hosts[0].name == "gpu1"


def test_local_gpus_are_named_in_the_trials_environment():
    cluster = ClusterConfig(hosts=(HostSpec("localhost", None, local=True),))
    room = ClusterRoom(cluster, environ={"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c"})
    demand = Demand(2, 0, 1)
    assert room.reserve(demand).env == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert room.reserve(Demand(1, 0, 1)).env == {"CUDA_VISIBLE_DEVICES": "GPU-c"}
    assert room.reserve(Demand(1, 0, 1)) is None


def test_demand_of_trainables():
    scaling = minitrain.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 2}, placement_strategy="SPREAD")
    assert trial_demand(with_resources(lambda config: None, scaling)) == Demand(2, 2.0, 0.0, "SPREAD")
    assert trial_demand(with_resources(lambda config: None, {"cpu": 2})) == Demand(1, 2.0, 0.0, restricts_slots=False)
    assert trial_demand(lambda config: None) == Demand(1, 1.0, 0.0, restricts_slots=False)
    room = ClusterRoom(ClusterConfig(hosts=parse_host_list("localhost:4")), environ={})
    held = room.reserve(Demand(1, 2.0, 0.0, restricts_slots=False))
    assert held.cluster.hosts == (HostSpec("localhost", 4, local=True),)  # a bundle leaves the host's slots


@pytest.mark.parametrize("bad", [dict(workers=0, cpus=1, gpus=0), dict(workers=1, cpus=1, gpus=0, strategy="X")])
def test_demand_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        Demand(**bad)

