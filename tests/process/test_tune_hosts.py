"""A real sweep on a two-host cluster of this machine's two loopback names: concurrent trials are handed
disjoint hosts (their fit()s could place ranks nowhere else), and a trial no host can hold is an error."""

import minitrain
from minitrain.tune import with_resources


def report_my_hosts(config):
    """A trial that reports the hosts its fit() would get, after waiting (deadline) for the other
    trial to start, so the two provably run at the same time."""
    import os
    import time

    from minitrain import tune as tune_api
    from minitrain.hosts.cluster import current_cluster
    hosts = ",".join(f"{h.name}:{h.slots}" for h in current_cluster().hosts)
    open(os.path.join(config["dir"], f"started_{config['i']}"), "w").close()
    deadline = time.monotonic() + 120
    while len([n for n in os.listdir(config["dir"]) if n.startswith("started_")]) < 2:
        assert time.monotonic() < deadline, "the other trial never started"
        time.sleep(0.05)
    tune_api.report({"hosts": hosts, "env": os.environ["MINITRAIN_HOSTS"]})


def test_concurrent_trials_get_disjoint_hosts_and_a_too_big_one_is_an_error(tmp_path):
    from minitrain import tune
    minitrain.init(hosts="localhost:2,127.0.0.1:2")  # two names of this machine: a two-host cluster
    try:
        trainable = with_resources(report_my_hosts, minitrain.ScalingConfig(num_workers=2))
        results = tune.Tuner(trainable, param_space={"i": tune.grid_search([0, 1]), "dir": str(tmp_path)},
                             run_config=tune.RunConfig(name="hosts", storage_path=str(tmp_path))).fit()
        assert results.num_errors == 0, results.errors
        assert sorted(r.metrics["hosts"] for r in results) == ["127.0.0.1:2", "localhost:2"]
        assert sorted(r.metrics["env"] for r in results) == ["127.0.0.1:2", "localhost:2"]
        too_big = with_resources(report_my_hosts, minitrain.ScalingConfig(num_workers=5))
        results = tune.Tuner(too_big, param_space={"i": tune.grid_search([0, 1]), "dir": str(tmp_path)},
                             run_config=tune.RunConfig(name="too_big", storage_path=str(tmp_path))).fit()
    finally:
        minitrain.shutdown()
    assert results.num_errors == 2 and all("5 worker(s) x (1 CPU, 0 GPU)" in str(e) for e in results.errors)
