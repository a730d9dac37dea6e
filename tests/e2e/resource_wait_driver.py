"""A driver for the resource-waiting tests: ``python resource_wait_driver.py NAME OUT STORAGE [--hold]``.

One `TorchTrainer.fit()` of one worker that claims every CPU of this host (resources_per_worker names
them, so the run waits in the ledger for any other run that holds them). Its worker writes
``OUT/started_NAME`` (with whether ``OUT/finished_*`` of another run existed then), waits for
``OUT/go`` when ``--hold`` is given, and writes ``OUT/finished_NAME`` last.
"""

from __future__ import annotations

import os
import sys
import time

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.hosts import hostinfo
from minitrain.torch import TorchTrainer


def train(config):
    out = config["out"]
    others_done = sorted(name for name in os.listdir(out) if name.startswith("finished_"))
    with open(os.path.join(out, f"started_{config['name']}"), "w") as handle:
        handle.write(",".join(others_done))
    deadline = time.monotonic() + 120
    while config["hold"] and not os.path.exists(os.path.join(out, "go")):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    minitrain.report({"done": 1})
    with open(os.path.join(out, f"finished_{config['name']}"), "w"):
        pass


def whole_host_trainer(name: str, out: str, storage: str, hold: bool = False) -> TorchTrainer:
    """The trainer this driver fits (a Tune test hands it to a Tuner: its trials claim the same)."""
    return TorchTrainer(train, train_loop_config={"name": name, "out": out, "hold": hold},
                        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": hostinfo.cpu_count()}),
                        run_config=RunConfig(name=name, storage_path=storage))


def main() -> int:
    name, out, storage = sys.argv[1:4]
    result = whole_host_trainer(name, out, storage, hold="--hold" in sys.argv).fit()
    print(f"result {name} {result.metrics}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

