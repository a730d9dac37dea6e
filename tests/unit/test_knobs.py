"""minitrain.knobs: the one table of MINITRAIN_* environment variables, and the one module that reads them.

The grep tests below are what keeps the table complete: a new variable anywhere in the package fails them
until it is added to `knobs.KNOBS` and read through it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from minitrain import knobs
from minitrain.errors import ConfigError

PACKAGE = Path(knobs.__file__).resolve().parent
KNOBS_FILE = Path(knobs.__file__).resolve()
# Strings that look like variable names and are not: the marker line `ssh.preflight` prints.
NOT_VARIABLES = {"MINITRAIN_PREFLIGHT"}
NAMES = {knob.name for knob in knobs.KNOBS}
_NAME = re.compile(r"MINITRAIN_[A-Z0-9_]*[A-Z0-9](_\*)?")


def _sources() -> list[tuple[Path, str]]:
    return [(path, path.read_text()) for path in sorted(PACKAGE.rglob("*.py")) if "_gen" not in path.parts]


def test_every_minitrain_variable_the_package_names_is_in_the_table():
    unknown = set()
    for path, text in _sources():
        for match in _NAME.finditer(text):
            name = match.group(0)
            if name.endswith("_*"):  # "MINITRAIN_STRAGGLER_*" in prose names a family of knobs
                if not any(known.startswith(name[:-1]) for known in NAMES):
                    unknown.add(f"{path.relative_to(PACKAGE)}: {name}")
            elif name not in NAMES | NOT_VARIABLES:
                unknown.add(f"{path.relative_to(PACKAGE)}: {name}")
    assert not unknown, f"add these to minitrain.knobs.KNOBS (or fix the name): {sorted(unknown)}"


def test_every_knob_in_the_table_is_used_by_the_package():
    attributes = {name for name, value in vars(knobs).items() if isinstance(value, knobs.Knob)}
    assert {getattr(knobs, name) for name in attributes} == set(knobs.KNOBS)
    used = "\n".join(text for path, text in _sources() if path != KNOBS_FILE)
    unused = [name for name in attributes if not re.search(rf"\bknobs\.{name}\b", used)]
    assert not unused, f"knobs nothing reads (delete them, or read them through the table): {unused}"


def _environment_reads(tree: ast.AST) -> list[ast.AST]:
    """Reads of an environment mapping (`os.environ[...]`, `os.environ.get(...)`, `environ.get(...)`,
    `os.getenv(...)`) whose key is a MINITRAIN_* string or a knob's `.name`."""
    def names_a_knob(key: ast.AST) -> bool:
        text = ast.unparse(key)
        return bool(_NAME.search(text)) or text.endswith(".name") or "knobs." in text

    def is_environ(node: ast.AST) -> bool:
        return ast.unparse(node).split(".")[-1] in ("environ", "environb")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value) and names_a_knob(node.slice):
            found.append(node)
        elif isinstance(node, ast.Call) and node.args and names_a_knob(node.args[0]):
            func = node.func
            if isinstance(func, ast.Attribute) and (
                    (func.attr in ("get", "pop", "setdefault") and is_environ(func.value))
                    or func.attr == "getenv"):
                found.append(node)
    return found


def test_only_the_knobs_module_reads_minitrain_variables_from_the_environment():
    readers, literals = [], []
    for path, text in _sources():
        if path == KNOBS_FILE:
            continue
        tree = ast.parse(text)
        readers += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for node in _environment_reads(tree)]
        # Outside the table a variable is named by its knob (`knobs.STATUS.name`), never spelled out.
        literals += [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and node.value in NAMES]
    assert not readers, f"read these through minitrain.knobs: {readers}"
    assert not literals, f"name these variables by their knob (knobs.X.name): {literals}"


def test_the_reader_check_sees_direct_reads():
    tree = ast.parse("import os\nos.environ.get('MINITRAIN_X')\nos.getenv(knobs.STATUS.name)\n"
                     "environ['MINITRAIN_Y']\nenv.get('MINITRAIN_Z')\n")
    assert [node.lineno for node in _environment_reads(tree)] == [2, 3, 4]


def test_the_table_is_well_formed():
    assert len(NAMES) == len(knobs.KNOBS)
    for knob in knobs.KNOBS:
        assert re.fullmatch(r"MINITRAIN_[A-Z0-9_]+", knob.name)
        assert knob.doc and "\n" not in knob.doc
    assert [knob.name for knob in knobs.KNOBS if knob.internal] == ["MINITRAIN_TUNE_PARENT"]


def test_unset_and_blank_values_give_the_default():
    for knob in knobs.KNOBS:
        assert knob.get({}) == knob.default
        assert knob.get({knob.name: "  "}) == knob.default
    knobs.check_all({})


def test_values_are_parsed():
    assert knobs.STATUS.get({"MINITRAIN_STATUS": " Lines "}) == "lines"
    assert [knobs.STATUS.get({"MINITRAIN_STATUS": v}) for v in ("0", "off", "no", "1", "auto")] == \
        ["off", "off", "off", "auto", "auto"]
    assert knobs.TELEMETRY.get({"MINITRAIN_TELEMETRY": "OFF"}) is False
    assert knobs.TELEMETRY.get({"MINITRAIN_TELEMETRY": "yes"}) is True
    assert [knobs.RELAY.get({"MINITRAIN_RELAY": v}) for v in ("auto", "1", "0")] == [None, True, False]
    assert knobs.STATUS_INTERVAL_S.get({"MINITRAIN_STATUS_INTERVAL_S": "2.5"}) == 2.5
    assert knobs.STRAGGLER_WINDOW.get({"MINITRAIN_STRAGGLER_WINDOW": "3"}) == 3
    assert knobs.TUNE_PARENT.get({"MINITRAIN_TUNE_PARENT": "4242"}) == 4242
    assert knobs.HOSTS.get({"MINITRAIN_HOSTS": " gpu1:2 "}) == "gpu1:2"


@pytest.mark.parametrize("knob, value, fix", [
    (knobs.STATUS, "sometimes", "lines"),
    (knobs.TELEMETRY, "maybe", "off"),
    (knobs.RELAY, "sometimes", "1 (relay, the default"),
    (knobs.STATUS_INTERVAL_S, "-1", "above 0"),
    (knobs.STATUS_INTERVAL_S, "inf", "above 0"),
    (knobs.STRAGGLER_FACTOR, "1", "above 1"),
    (knobs.STRAGGLER_WINDOW, "2.5", "whole number"),
    (knobs.STRAGGLER_MIN_SAMPLES, "0", "whole number"),
    (knobs.TUNE_PARENT, "x", "process id"),
])
def test_a_bad_value_names_the_variable_the_value_and_the_fix(knob, value, fix):
    with pytest.raises(ConfigError, match=re.escape(f"{knob.name}={value!r}")) as info:
        knob.get({knob.name: value})
    assert fix in str(info.value) and f"unset {knob.name}" in str(info.value)
    with pytest.raises(ConfigError, match=knob.name):
        knobs.check_all({knob.name: value})


def test_the_environment_is_read_when_asked(monkeypatch):
    monkeypatch.setenv("MINITRAIN_STATUS_INTERVAL_S", "7")
    assert knobs.STATUS_INTERVAL_S.get() == 7.0
    monkeypatch.delenv("MINITRAIN_STATUS_INTERVAL_S")
    assert knobs.STATUS_INTERVAL_S.get() == 30.0


def test_the_relay_default_in_the_docs_is_the_one_in_force():
    from minitrain.driver.trainer import relays_workers

    assert "1 (the default, at every size" in knobs.RELAY.doc
    assert knobs.RELAY.get({}) is None and relays_workers() is True
    with pytest.raises(ConfigError, match="1 \\(relay, the default; auto means the same\\) or 0"):
        knobs.RELAY.get({"MINITRAIN_RELAY": "sometimes"})
