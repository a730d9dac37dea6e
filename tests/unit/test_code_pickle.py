"""minitrain.driver.code_pickle: a function from the user's file keeps its file name and source lines in
tracebacks on the worker side, even where the file does not exist."""

from __future__ import annotations

import importlib.util
import linecache
import os
import sys
import textwrap
import traceback

import cloudpickle

from minitrain.driver import code_pickle

SCRIPT = textwrap.dedent('''\
    import sys

    def helper(x):
        inner = lambda: 1 / x
        return inner()

    def train_func():
        helper(0)
''')


def _load_by_value(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def test_a_script_function_keeps_its_file_and_lines_where_the_file_is_gone(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    module = _load_by_value(str(script), "_code_pickle_user_script")
    try:
        payload = code_pickle.dumps(module.train_func)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        del sys.modules["_code_pickle_user_script"]
    script.unlink()  # the worker's host has no copy of the file
    linecache.clearcache()
    function = cloudpickle.loads(payload)
    try:
        function()
    except ZeroDivisionError:
        text = traceback.format_exc()
    assert "<dynamic-code>" not in text
    assert f'File "{script}", line 8, in train_func' in text
    assert "    helper(0)" in text
    assert f'File "{script}", line 5, in helper' in text
    assert "    return inner()" in text
    assert "lambda: 1 / x" in text  # the nested code object too


def test_what_is_pickled_by_reference_loads_as_before():
    value = {"fn": os.path.join, "n": [1, 2]}
    assert cloudpickle.loads(code_pickle.dumps(value)) == value
