"""Ray's own XGBoostTrainer and LightGBMTrainer examples (Ray 2.60's docstrings), ported by imports only,
run as the docs show them: the first Python block under "Porting a Ray script" of docs/trainers/*.md is
run as a script in a fresh process (its default storage_path is under ~, so HOME is the test's
directory). The docs stay true because this is what runs."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ported_example(page: str) -> str:
    text = (ROOT / "docs" / "trainers" / page).read_text()
    section = text.split("## Porting a Ray script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize(("page", "library"), [("xgboost.md", "xgboost"), ("lightgbm.md", "lightgbm")])
def test_rays_example_runs_after_an_import_only_port(tmp_path, page, library):
    pytest.importorskip(library, reason=f"{library} is not installed (the dev extra installs it)")
    script = tmp_path / f"ray_{library}_example.py"
    script.write_text(_ported_example(page) + "\nprint('MODEL', type(booster).__name__)\n")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT), "MINITRAIN_DASHBOARD": "0"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "MODEL Booster" in done.stdout
    assert (tmp_path / "minitrain_results").is_dir()  # Ray's default storage path, under the test's HOME
