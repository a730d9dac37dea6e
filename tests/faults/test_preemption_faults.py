"""The fault suite's "preemption signal" kind: schedules of preemptions drawn by hypothesis, each fired
from inside the deterministic DDP training function of fault_training.py (rank 0, at a drawn step): to
the driver or to the node agent, once or twice, before the step's report or during a checkpoint upload.
Every fit() runs in a process of its own (a signal to the driver must not reach pytest), and the same
run is fit() again until it finishes, as a requeued job would.

Invariants on every example:
- a fit() ends in PreemptionError (exit 143) only when its preemption fired, with `drain_timed_out` exactly
  when a second signal came during the agreed round's upload; otherwise (its step was already past, or the
  agreed round lay past the last report) it finishes;
- every checkpoint the index names is complete and loads, and holds the step its metrics say; the latest is
  the one the error names; no staging or uncommitted directory is left;
- each fit() resumes from a step >= the previous one's (a commit is never lost), and after a single signal
  from the very checkpoint the preemption agreed on (nothing is lost beyond the step in flight);
- the run ends with parameters bit-identical to a run that was never preempted;
- no process of the run survives any fit().

The whole module is the soak tier's (marked `soak`, run by `bash scripts/test.sh --soak`): in the default
run, tests/e2e/test_preemption_signals.py signals the driver and an agent, once, twice and during an
upload, and checks the agreed round, its commit and the resume; tests/e2e/test_slurm_allocation.py checks
a preempted and requeued job that ends bit-identical.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from fault_training import CHECKPOINT_FILES, N_STEPS, PREEMPTED_EXIT, RUN_NAME
from test_fault_injection import FAULTS_DIR, TAG_VAR, _profile, _tagged_processes, property_timeout_s
from minitrain.procs import wait_until_gone

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

FIT_TIMEOUT_S = 180.0
ROOT = Path(__file__).resolve().parents[2]

PREEMPTION = st.fixed_dictionaries({
    "step": st.integers(min_value=1, max_value=N_STEPS - 2),
    "target": st.sampled_from(["driver", "agent"]),
    "twice": st.booleans(),
    "during_upload": st.booleans(),
})
SCHEDULES = st.fixed_dictionaries({"every": st.sampled_from([2, 3]),
                                   "preemptions": st.lists(PREEMPTION, min_size=1, max_size=2)})


def _fit(root: Path, schedule: dict, fit_index: int, tag: str) -> tuple[int, str]:
    code = (f"import sys; sys.path.insert(0, {FAULTS_DIR!r}); import fault_training; "
            f"sys.exit(fault_training.preemption_driver({str(root)!r}, {schedule!r}, {fit_index}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), TAG_VAR: tag, "MINITRAIN_DASHBOARD": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=FIT_TIMEOUT_S, start_new_session=True)
    return done.returncode, done.stdout + done.stderr


def _line(output: str, word: str) -> dict:
    line = next((l for l in output.splitlines() if l.startswith(word + " ")), None)
    assert line is not None, output[-4000:]
    return json.loads(line[len(word) + 1:])


def _committed(run_dir: Path) -> dict[str, int]:
    """dir name -> step of every checkpoint the index names, each complete; no other checkpoint left."""
    import torch

    index = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    named = {}
    for record in index["checkpoint_results"]:
        directory = run_dir / record["checkpoint_dir_name"]
        assert sorted(os.listdir(directory)) == sorted(CHECKPOINT_FILES), f"{directory.name} is incomplete"
        model, optim = torch.load(directory / "model.pt"), torch.load(directory / "optim.pt")
        meta = json.loads((directory / "meta.json").read_text())
        assert model["step"] == optim["step"] == meta["step"] == record["metrics"]["step"]
        named[record["checkpoint_dir_name"]] = meta["step"]
    on_disk = sorted(d.name for d in run_dir.iterdir() if d.is_dir() and d.name.startswith("checkpoint_"))
    assert on_disk == sorted(named), f"uncommitted directories remain: {on_disk} vs {sorted(named)}"
    assert not (run_dir / ".staging").exists() or not any((run_dir / ".staging").iterdir())
    return named


def _run_schedule(schedule: dict, root: Path) -> tuple[list[dict], str]:
    """fit() the run until it finishes; returns each fit()'s record and the final parameters."""
    tag = uuid.uuid4().hex
    run_dir = root / "results" / RUN_NAME
    records = []
    for fit_index in range(len(schedule["preemptions"]) + 1):
        code, output = _fit(root, schedule, fit_index, tag)
        assert wait_until_gone(_tagged_processes(tag), timeout=15) == [], f"fit {fit_index} left processes"
        fired = (root / "out" / "markers" / f"preemption_{fit_index}").exists()
        if code == 0:  # its preemption never fired, or the agreed round lay past the last report
            records.append({"fit": fit_index, "finished": True, "fired": fired})
            break
        assert code == PREEMPTED_EXIT and fired, f"fit {fit_index} exited {code}:\n{output[-4000:]}"
        outcome = _line(output, "PREEMPTED")
        due = schedule["preemptions"][fit_index]
        if not due["twice"] or due["during_upload"]:  # else the second may come after the agreed stop
            assert outcome["drain_timed_out"] == due["twice"], (due, outcome)
        named = _committed(run_dir)
        latest = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())["latest_checkpoint_result"]
        assert (latest["checkpoint_dir_name"] if latest else "") == outcome["checkpoint_dir"]
        records.append({"fit": fit_index, "outcome": outcome, "latest_step": named.get(outcome["checkpoint_dir"])})
    else:
        raise AssertionError(f"the run never finished: {records}")
    return records, (root / "out" / "final_params.hex").read_text()


def _resume_steps(root: Path) -> list[int]:
    return [json.loads(p.read_text())["resume_step"] for p in sorted((root / "out" / "attempts").iterdir())
            if not p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def reference_params() -> str:
    root = Path(tempfile.mkdtemp(prefix="mt-preempt-ref-"))
    try:
        records, params = _run_schedule({"every": 2, "preemptions": []}, root)
        assert records == [{"fit": 0, "finished": True, "fired": False}] and params
        return params
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check(schedule: dict, reference_params: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="mt-preempt-"))
    try:
        records, params = _run_schedule(schedule, root)
        assert params == reference_params, "final parameters differ from the never-preempted run's"
        resumes = _resume_steps(root)
        assert resumes == sorted(resumes), f"a fit() resumed from an older checkpoint: {resumes}"
        for record, resume in zip(records[:-1], resumes[1:]):
            # after one signal the agreed checkpoint is the resume point: nothing lost beyond it
            if not record["outcome"]["drain_timed_out"]:
                assert resume == record["latest_step"], (records, resumes)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(property_timeout_s())
@settings(_profile())
@given(SCHEDULES)
def test_any_preemption_schedule_keeps_the_invariants(reference_params, schedule):
    note(f"schedule: {schedule}")
    _check(schedule, reference_params)


@pytest.mark.parametrize("preemption", [
    {"step": 3, "target": "driver", "twice": False, "during_upload": False},
    {"step": 2, "target": "agent", "twice": False, "during_upload": True},
    {"step": 4, "target": "driver", "twice": True, "during_upload": True},
], ids=["driver", "agent-during-upload", "twice-during-upload"])
def test_each_preemption_shape_once(reference_params, preemption):
    _check({"every": 3, "preemptions": [preemption]}, reference_params)
