"""A trial's vocabulary (minitrain.storage.sweep_state): `TrialStatus` speaks Ray's words as plain strings,
`TrialError` is a record, and the state file keeps both as the plain JSON it always held."""

from __future__ import annotations

import json

from minitrain.storage import sweep_state as tr
from minitrain.storage.sweep_state import TrialError, TrialStatus


def test_statuses_are_rays_words_and_compare_print_and_serialise_as_plain_strings():
    assert [s.value for s in TrialStatus] == ["PENDING", "RUNNING", "TERMINATED", "ERROR"]
    for status in TrialStatus:
        assert status == status.value and isinstance(status, str)
        assert str(status) == f"{status}" == status.value and "%s" % status == status.value
        assert json.dumps({"status": status}) == json.dumps({"status": status.value})
        assert TrialStatus(status.value) is status
    assert {TrialStatus.ERROR: 1} == {"ERROR": 1} and TrialStatus.RUNNING + " (x)" == "RUNNING (x)"


def test_only_terminated_and_error_are_finished():
    assert {s for s in TrialStatus if s.finished} == {TrialStatus.TERMINATED, TrialStatus.ERROR}
    trial = tr.new_trial("t_0", "t0", "t0", {"x": 1}, 0)
    assert trial.status is TrialStatus.PENDING and not trial.finished
    trial.status = TrialStatus.ERROR
    assert trial.finished


def test_the_state_file_keeps_status_and_error_as_plain_json_and_reads_them_back_typed(tmp_path):
    trial = tr.new_trial("t_0", "t0", "t0", {"x": 1}, 0)
    trial.status, trial.error = TrialStatus.ERROR, TrialError("ValueError", "boom\nmore", "tb")
    tr.write_state(str(tmp_path), {"name": "n"}, [trial])
    record = json.loads((tmp_path / tr.STATE_FILE).read_text())["trials"][0]
    assert record["status"] == "ERROR"
    assert record["error"] == {"exc_type": "ValueError", "message": "boom\nmore", "traceback": "tb"}
    _, (back,) = tr.read_state(str(tmp_path))
    assert back.status is TrialStatus.ERROR and back.error == trial.error and back == trial


def test_an_older_state_files_error_with_its_message_type_key_is_read(tmp_path):
    trial = tr.new_trial("t_0", "t0", "t0", {"x": 1}, 0)
    tr.write_state(str(tmp_path), {"name": "n"}, [trial])
    data = json.loads((tmp_path / tr.STATE_FILE).read_text())
    data["trials"][0].update(status="ERROR", error={"type": "error", "exc_type": "E", "message": "m", "traceback": ""})
    (tmp_path / tr.STATE_FILE).write_text(json.dumps(data))
    _, (back,) = tr.read_state(str(tmp_path))
    assert back.error == TrialError("E", "m") and back.error.summary == "E: m"
