"""The documentation site builds with `mkdocs build --strict`, as CI builds it.

mkdocs.yml turns every check MkDocs makes into a warning (a link to a missing page, an anchor no heading
has, a page left out of the navigation) and --strict fails the build on any warning, so this test fails on
a broken link or a missing page. The `dev` extra installs MkDocs and its Material theme, so CI runs it;
without them the test is skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[dev]' installs them)")
def test_the_docs_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's end-of-life banner, not a problem of ours
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "architecture" / "index.html").exists()
