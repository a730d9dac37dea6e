"""The ``s3`` fixture across processes: a filesystem pickled in this process (or plain storage_options)
works in another, as a minitrain worker gets its storage. The fixture within one process:
tests/unit/test_s3_fixture.py.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

from s3server import skip_unless_available

skip_unless_available()


def test_pickled_filesystem_works_in_a_subprocess(s3, tmp_path):
    """How a minitrain worker gets its storage: a pickled fs (or plain storage_options) from the parent."""
    fs = s3.filesystem()
    b = s3.bucket
    fs.pipe_file(f"{b}/from_parent.txt", b"parent wrote this")

    clone = pickle.loads(pickle.dumps(fs))  # in-process round trip first
    assert clone is not fs and clone.cat_file(f"{b}/from_parent.txt") == b"parent wrote this"

    (tmp_path / "fs.pkl").write_bytes(pickle.dumps(fs))
    (tmp_path / "opts.json").write_text(json.dumps(s3.storage_options()))
    script = textwrap.dedent(
        """
        import json, pickle, sys
        import fsspec
        bucket, pkl, opts = sys.argv[1:4]
        fs = pickle.load(open(pkl, "rb"))
        data = fs.cat_file(f"{bucket}/from_parent.txt")
        fs.pipe_file(f"{bucket}/worker/rank_0.txt", b"child read: " + data)
        fs2 = fsspec.filesystem("s3", **json.load(open(opts)))
        fs2.pipe_file(f"{bucket}/worker/rank_1.txt", fs2.cat_file(f"{bucket}/worker/rank_0.txt"))
        print("ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, b, str(tmp_path / "fs.pkl"), str(tmp_path / "opts.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert fs.cat_file(f"{b}/worker/rank_0.txt") == b"child read: parent wrote this"
    assert fs.cat_file(f"{b}/worker/rank_1.txt") == b"child read: parent wrote this"
