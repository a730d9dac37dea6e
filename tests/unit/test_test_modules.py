"""The test tree's own rule: every test module has a basename no other has. The test folders are not
packages, so pytest imports a test module by its basename; a second `test_x.py` elsewhere fails the whole
run's collection ("import file mismatch") and its trial or worker processes may import the wrong one."""

from __future__ import annotations

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own():
    places = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and "__pycache__" not in path.parts:
            places[path.name].append(str(path.relative_to(TESTS)))
    assert {name: where for name, where in places.items() if len(where) > 1} == {}
