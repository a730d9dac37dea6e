"""Without pyarrow, `Checkpoint.filesystem` and `Result.filesystem` fall back to the fsspec filesystem
(minitrain.storage.user_filesystems.for_users), in a real interpreter in which `import pyarrow` fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_without_pyarrow_the_fsspec_filesystem_is_handed_back(tmp_path):
    entry = {"checkpoint_dir_name": "c1", "metrics": {"loss": 0.5}, "report_index": 0}
    (tmp_path / "run" / "c1").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint_manager_snapshot.json").write_text(
        json.dumps({"checkpoint_results": [entry], "latest_checkpoint_result": entry}))
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.fs'] = None\n"
            "from fsspec.implementations.local import LocalFileSystem\n"
            "from minitrain import Checkpoint, Result\n"
            f"c = Checkpoint.from_directory({str(tmp_path)!r})\n"
            "assert isinstance(c.filesystem, LocalFileSystem), type(c.filesystem)\n"
            f"r = Result.from_path({str(tmp_path / 'run')!r})\n"
            "assert isinstance(r.filesystem, LocalFileSystem), type(r.filesystem)\n"
            "assert isinstance(r.checkpoint.filesystem, LocalFileSystem)\n"
            "print('fsspec')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0 and done.stdout.strip() == "fsspec", done.stderr
