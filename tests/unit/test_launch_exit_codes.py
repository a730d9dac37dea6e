"""The exit codes of `python -m minitrain.launch` (minitrain/launch/cli.py) for what a script target lets
escape, in process: a `NoProgressError` ends with 93 (NVIDIA's resiliency extension's "do not restart"),
so that a scheduler does not start the run again as it is. The function target's 93 is checked end to end
(tests/e2e/test_fault_tolerance.py)."""

from __future__ import annotations

import sys

import pytest

from minitrain.launch.cli import EXIT_NO_PROGRESS, main


@pytest.mark.parametrize("raised, code", [
    ('minitrain.NoProgressError("no progress in the last 3 attempts", {}, attempts=3)', 93),
    ('minitrain.WorkerGroupError("failure budget spent", {})', None),  # any uncaught exception: not ours
])
def test_a_script_that_lets_no_progress_escape_exits_93(tmp_path, monkeypatch, capsys, raised, code):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "script.py"
    script.write_text(f"import minitrain\nraise {raised}\n")
    if code is None:
        with pytest.raises(Exception, match="failure budget spent"):
            main([str(script)])
        return
    assert main([str(script)]) == EXIT_NO_PROGRESS == code
    err = capsys.readouterr().err
    assert err.startswith("minitrain.launch: training failed without progress; not to be restarted as it is\n"
                          "no progress in the last 3 attempts")
