"""docs/configuration.md's table of environment variables lists exactly `minitrain.knobs.KNOBS`.

`tests/unit/test_knobs.py` proves that the knobs table names every MINITRAIN_* variable the package reads;
this test carries that to the page users read: a knob added, removed, renamed or given another default
fails here until the page says so too.
"""

from __future__ import annotations

import re
from pathlib import Path

from minitrain import knobs

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEADING = "## Environment variables"
_ROW = re.compile(r"^\| `(MINITRAIN_[A-Z0-9_]+)` \| ([^|]+) \| (.+) \|$")


def _table_rows() -> dict[str, tuple[str, str]]:
    """{variable: (default cell, meaning cell)} of the table under HEADING."""
    text = PAGE.read_text()
    assert HEADING in text, f"{PAGE.name} has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        match = _ROW.match(line.strip())
        if match:
            name, default, meaning = match.groups()
            assert name not in rows, f"{name} is listed twice"
            rows[name] = (default.strip(), meaning.strip())
    return rows


def _shown_default(knob: knobs.Knob) -> str:
    """The default cell the page gives `knob`: its value as a variable's text, "unset" for None (but
    RELAY's None, which means relaying: `1`)."""
    if knob is knobs.RELAY:
        return "`1`"
    if knob.default is None:
        return "unset"
    if isinstance(knob.default, bool):
        return "`1`" if knob.default else "`0`"
    if isinstance(knob.default, float):
        return f"`{knob.default:g}`"
    return f"`{knob.default}`"


def test_the_page_lists_exactly_the_knobs():
    listed = set(_table_rows())
    known = {knob.name for knob in knobs.KNOBS}
    assert listed == known, (f"docs/configuration.md's table and minitrain.knobs.KNOBS differ: missing from the "
                             f"page {sorted(known - listed)}, not knobs {sorted(listed - known)}")


def test_the_page_gives_each_knob_its_default():
    rows = _table_rows()
    wrong = []
    for knob in knobs.KNOBS:
        default, _ = rows[knob.name]
        expected = _shown_default(knob)
        if default != expected:
            wrong.append(f"{knob.name}: the page says {default}, the table {expected}")
    assert not wrong, "docs/configuration.md shows the wrong defaults:\n" + "\n".join(wrong)


def test_internal_knobs_are_marked_internal_on_the_page():
    rows = _table_rows()
    for knob in knobs.KNOBS:
        says_internal = rows[knob.name][1].startswith("Internal")
        assert says_internal == knob.internal, f"{knob.name}: the page and the table disagree on whether users set it"
