"""A multi-host run over SSH honours each remote host's resource ledger: the run claims on the
host itself (a holder the driver starts there over SSH), waits while another process holds that host, and
leaves nothing in its ledger. Each fake host has a ledger of its own (scripts/netns_cluster.py's sshd
sets MINITRAIN_LEDGER_DIR), as separate machines do."""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

import minitrain
import minitrain.hosts.cluster
from minitrain import RunConfig, ScalingConfig
from minitrain.hosts import hostinfo
from minitrain.hosts.reserve import ledger_report
from minitrain.torch import TorchTrainer

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]
ROOT = pathlib.Path(__file__).resolve().parents[2]
CLAIMANT = ROOT / "tests" / "process" / "ledger_claimant.py"


@pytest.fixture(autouse=True)
def _forget_cluster():
    yield
    minitrain.shutdown()


def record_the_ledger(config):
    """The claim files of this host's ledger while the run holds it (read on the remote host)."""
    names = sorted(n for n in os.listdir(config["ledger"]) if n.startswith("claim-"))
    with open(os.path.join(config["out"], "claims_seen"), "w") as handle:
        handle.write("\n".join(open(os.path.join(config["ledger"], n)).read() for n in names))
    minitrain.report({"claims": len(names)})


@pytest.mark.parametrize("netns_cluster", [1], indirect=True)
def test_a_run_over_ssh_waits_for_the_remote_hosts_ledger(netns_cluster, tmp_path, monkeypatch):
    (host,) = netns_cluster.hosts
    ledger = netns_cluster.ledger_dir(host)
    monkeypatch.setenv("MINITRAIN_LEDGER_DIR", str(tmp_path / "driver-ledger"))  # this machine's: unused
    monkeypatch.setenv("MINITRAIN_STATUS", "lines")
    workdir = pathlib.Path(netns_cluster.workdir)
    minitrain.init(hosts=[host.ip], ssh_user="root", ssh_identity_file=str(workdir / "id_ed25519"),
                   ssh_known_hosts_file=str(workdir / "known_hosts"),
                   ssh_options=("IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"))
    env = {**os.environ, "MINITRAIN_LEDGER_DIR": ledger, "PYTHONPATH": str(ROOT)}
    holder = netns_cluster.popen_in(host, [sys.executable, str(CLAIMANT), "hold", "-"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    outcome: list = []
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("minitrain").addHandler(handler)
    try:
        assert holder.stdout.readline().strip() == "held"
        report = ledger_report(minitrain.hosts.cluster.current_cluster(), (str(ROOT),))  # --status, over SSH
        assert report.startswith(f"{host.ip}: ") and f"  run holder (root, pid {holder.pid}," in report
        out = tmp_path / "out"
        out.mkdir()
        trainer = TorchTrainer(record_the_ledger, train_loop_config={"out": str(out), "ledger": ledger},
                               scaling_config=ScalingConfig(num_workers=1,
                                                            resources_per_worker={"CPU": hostinfo.cpu_count()}),
                               run_config=RunConfig(name="remote", storage_path=str(tmp_path / "results")))
        fit = threading.Thread(target=lambda: outcome.append(trainer.fit()), name="fit")
        fit.start()
        deadline = time.monotonic() + 120
        while not any("is waiting for" in line for line in said):
            assert fit.is_alive() and time.monotonic() < deadline, said
            time.sleep(0.05)
        waiting = next(line for line in said if "is waiting for" in line)
        assert f"on {host.ip} since" in waiting and f"held by run holder (root, pid {holder.pid}," in waiting
        holder.stdin.close()  # the other process on that host ends: its claim goes
        assert holder.wait(30) == 0
        fit.join(180)
        assert not fit.is_alive()
    finally:
        logging.getLogger("minitrain").removeHandler(handler)
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
    (result,) = outcome
    assert result.metrics == {"claims": 1}
    claim = (out / "claims_seen").read_text()
    assert '"run": "remote"' in claim  # the run's own claim, in the remote host's ledger
    assert os.listdir(ledger) == [".lock"]  # released with the run
    assert not os.path.exists(tmp_path / "driver-ledger")  # the driver's machine was not one of the hosts
