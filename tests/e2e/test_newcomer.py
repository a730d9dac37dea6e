"""What a newcomer hits (issue 30): each test reproduces what a user saw, on the console of a real run."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITRAIN_DASHBOARD": "0"}

FAILING_SCRIPT = textwrap.dedent('''\
    import traceback
    import minitrain


    def helper(rank):
        raise ValueError(f"bad value {rank}")


    def train_func():
        rank = minitrain.get_context().get_world_rank()
        try:
            helper(rank)
        except ValueError:
            traceback.print_exc()  # every rank formats its traceback with the source lines
        minitrain.collective.barrier()
        if rank == 1:
            helper(rank)
''')


@pytest.mark.e2e
def test_worker_tracebacks_name_the_users_file_and_line_on_every_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FAILING_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "minitrain.launch", "--num-workers", "2", f"{script}:train_func",
                           "--name", "tb", "--storage-path", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=ENV)
    assert done.returncode == 1, done.stderr
    assert "<dynamic-code>" not in done.stderr
    for rank in (0, 1):
        assert f'(rank {rank}, ' in done.stderr
        log = (tmp_path / "runs" / "tb" / "logs" / "attempt_0" / f"rank_{rank}.log").read_text()
        assert f'File "{script}", line 12, in train_func' in log and "    helper(rank)" in log, log
        assert f'File "{script}", line 6, in helper' in log and 'raise ValueError(f"bad value {rank}")' in log
    # The failing rank's final traceback is one block on the driver's stderr: from its header to its
    # exception line no line of the driver's own comes in between.
    lines = done.stderr.splitlines()
    last_header = max(i for i, line in enumerate(lines) if line.startswith("(rank 1, ")
                      and line.endswith("Traceback (most recent call last):"))
    end = next(i for i in range(last_header, len(lines)) if lines[i].endswith("ValueError: bad value 1"))
    assert all(line.startswith("(rank 1, ") for line in lines[last_header:end + 1]), lines[last_header:end + 1]
    assert f'File "{script}", line 17, in train_func' in "\n".join(lines[last_header:end + 1])
