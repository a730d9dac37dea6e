"""JaxTrainer end to end with real JAX on 2 CPU worker processes (Ray's CPU set-up: JAX_PLATFORMS=cpu and
two host devices per process): `jax.distributed` is initialised with the ranks, a jitted linear-regression
step over a mesh of all four devices averages the gradients across the processes (gloo), the replicas
agree, and a rank that raises once mid-training restarts the run from its last checkpoint; a worker stops at
minitrain's SIGTERM and a failed rank exits at once; and (with the `cluster` marker) the processes train across
two hosts, whose names resolve to loopback, so gloo must listen on the address the other host reaches."""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JaxTrainer's tests need jax (pip install 'minitrain[jax]')")

import minitrain  # noqa: E402
from minitrain import Checkpoint, FailureConfig, RunConfig, ScalingConfig, WorkerGroupError  # noqa: E402
from minitrain.jax import JaxTrainer  # noqa: E402

pytestmark = pytest.mark.e2e

ROWS, FEATURES, STEPS, EVERY, LEARNING_RATE = 256, 3, 24, 8, 0.1
# Ray's JaxTrainer tests on CPU: JAX on the CPU platform, several host devices per process.
CPU_ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ROWS rows of a noisy linear target: (x, y), float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (x @ np.array([1.5, -2.0, 0.5], np.float32) + 0.3 + 0.05 * rng.normal(size=ROWS)).astype(np.float32)
    return x, y


def gradient_descent(x: np.ndarray, y: np.ndarray, steps: int) -> np.ndarray:
    """The same full-batch descent on all rows in one process (numpy): what the workers must reach."""
    w, b = np.zeros(FEATURES, np.float64), 0.0
    for _ in range(steps):
        error = x @ w + b - y
        w, b = w - LEARNING_RATE * 2 * x.T @ error / len(y), b - LEARNING_RATE * 2 * error.mean()
    return w


def train_linear_regression(config: dict):
    """Each rank holds its shard; the jitted step sees the global batch over every process's devices."""
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    context = minitrain.get_context()
    rank = context.get_world_rank()
    if (jax.process_index(), jax.process_count()) != (rank, context.get_world_size()):
        raise AssertionError(f"jax.process_index()/count() = {jax.process_index()}/{jax.process_count()} on rank {rank}")
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    rows, replicated = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    shard = next(iter(minitrain.get_dataset_shard("train").iter_batches(batch_size=None)))
    x = jax.make_array_from_process_local_data(rows, np.stack(shard["x"]).astype(np.float32))
    y = jax.make_array_from_process_local_data(rows, np.asarray(shard["y"], np.float32))

    start, params = 0, {"w": np.zeros(FEATURES, np.float32), "b": np.zeros((), np.float32)}
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = np.load(os.path.join(directory, "params.npz"))
            start, params = int(saved["step"]), {"w": saved["w"], "b": saved["b"]}
    params = jax.device_put(params, replicated)

    def mse(params, x, y):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    @jax.jit
    def step(params, x, y):  # the mean over the global batch: XLA all-reduces across the processes
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss

    for index in range(start, STEPS):
        if index == config.get("fail_at") and rank == 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError(f"injected failure at step {index}")
        params, loss = step(params, x, y)
        replicas = multihost_utils.process_allgather(np.asarray(params["w"].addressable_data(0)))
        metrics = {"step": index + 1, "loss": float(loss), "replicas_agree": bool((replicas == replicas[0]).all())}
        with tempfile.TemporaryDirectory() as directory:
            saved = None
            if (index + 1) % EVERY == 0 and rank == 0:
                np.savez(os.path.join(directory, "params.npz"), step=index + 1,
                         w=np.asarray(params["w"].addressable_data(0)), b=np.asarray(params["b"].addressable_data(0)))
                saved = Checkpoint.from_directory(directory)
            minitrain.report(metrics, checkpoint=saved)
    return {"resumed_from": start, "devices": jax.device_count(), "w": np.asarray(params["w"].addressable_data(0))}


def test_two_cpu_processes_train_one_model_and_resume_after_a_failure(tmp_path):
    x, y = make_data()
    marker = tmp_path / "failed-once"
    trainer = JaxTrainer(
        train_linear_regression, train_loop_config={"fail_at": 13, "marker": str(marker)},
        datasets={"train": minitrain.data.from_items([{"x": row, "y": float(target)} for row, target in zip(x, y)])},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="jax", storage_path=str(tmp_path / "runs"), worker_runtime_env={"env_vars": CPU_ENV},
                             # rank 0 waits in a gloo collective for the failed rank: only SIGKILL ends it
                             failure_config=FailureConfig(max_failures=1, worker_stop_grace_s=0.5)))
    result = trainer.fit()

    assert marker.exists() and (pathlib.Path(result.path) / "logs" / "attempt_1").is_dir()
    returned = result.return_value
    assert returned["resumed_from"] == 8 and returned["devices"] == 4  # the checkpoint before step 13; 2 x 2 devices
    history = result.metrics_dataframe
    assert history["replicas_agree"].all()
    assert history["loss"].iloc[-1] < 0.05 * history["loss"].iloc[0]
    # Every step descended on the global batch (both ranks' shards), as one process on all rows does.
    np.testing.assert_allclose(returned["w"], gradient_descent(x.astype(np.float64), y, STEPS), rtol=1e-4, atol=1e-5)
    with result.checkpoint.as_directory() as directory:
        assert int(np.load(os.path.join(directory, "params.npz"))["step"]) == STEPS


def train_one_rank_fails_at_once(config):
    """`config["rank"]` raises as training starts; the other runs Python until it is stopped (SIGTERM can end it)."""
    if minitrain.get_context().get_world_rank() == config["rank"]:
        raise RuntimeError(f"rank {config['rank']} fails")
    while True:
        time.sleep(0.05)


@pytest.mark.parametrize("failing", [0, 1])
def test_a_jax_worker_stops_at_sigterm_and_a_failed_rank_exits_at_once(tmp_path, failing):
    # 60 s between SIGTERM and SIGKILL: a worker that ignored SIGTERM (JAX's preemption service handles it)
    # or a failed rank waiting in JAX's shutdown barrier for its peers would hold the stop for all of it.
    trainer = JaxTrainer(train_one_rank_fails_at_once, train_loop_config={"rank": failing}, scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(name="stop", storage_path=str(tmp_path), worker_runtime_env={"env_vars": CPU_ENV},
                                              failure_config=FailureConfig(worker_stop_grace_s=60)))
    started = time.monotonic()
    with pytest.raises(WorkerGroupError) as failed:
        trainer.fit()

    assert time.monotonic() - started < 30
    assert [(a.rank, a.cause) for a in failed.value.failed_attempts] == [(failing, f"RuntimeError: rank {failing} fails")]


@pytest.mark.cluster
def test_training_across_two_hosts(netns_cluster, tmp_path):
    workdir = pathlib.Path(netns_cluster.workdir)
    minitrain.init(hosts=[f"{h.ip}:1" for h in netns_cluster.hosts], ssh_user="root",
                   ssh_identity_file=str(workdir / "id_ed25519"), ssh_known_hosts_file=str(workdir / "known_hosts"),
                   ssh_options=("IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"))
    x, y = make_data()
    try:
        result = JaxTrainer(
            train_linear_regression, train_loop_config={},
            datasets={"train": minitrain.data.from_items([{"x": row, "y": float(target)} for row, target in zip(x, y)])},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="jax2", storage_path=str(tmp_path / "runs"),
                                 worker_runtime_env={"env_vars": CPU_ENV})).fit()
    finally:
        minitrain.shutdown()

    assert result.metrics_dataframe["replicas_agree"].all() and result.return_value["devices"] == 4
    np.testing.assert_allclose(result.return_value["w"], gradient_descent(x.astype(np.float64), y, STEPS),
                               rtol=1e-4, atol=1e-5)
