"""The one table every workload contributes rows to: minitrain, the peer, the ratio, the target, met."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

HEADER = ("workload", "measure", "minitrain", "peer", "ratio", "target", "met")


@dataclass(frozen=True)
class Row:
    """One measured figure. `met` is None where there is no target (the row is for context)."""

    workload: str
    measure: str
    minitrain: str
    peer: str = "-"
    ratio: str = "-"
    target: str = "-"
    met: Optional[bool] = None

    def cells(self) -> tuple[str, ...]:
        """The row's cells in HEADER order."""
        met = "-" if self.met is None else ("yes" if self.met else "**no**")
        return (self.workload, self.measure, self.minitrain, self.peer, self.ratio, self.target, met)


@dataclass
class WorkloadResult:
    """What one workload measured: its table rows and every raw figure (for --json)."""

    name: str
    rows: list[Row] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        """A JSON-safe form."""
        return {"name": self.name, "rows": [asdict(r) for r in self.rows], "figures": self.figures}


def ratio(a: Optional[float], b: Optional[float], digits: int = 2) -> str:
    """`a / b` as `1.23x`, or `-` when either is missing or b is 0."""
    if a is None or not b:
        return "-"
    return f"{a / b:.{digits}f}x"


def markdown(rows: list[Row]) -> str:
    """A Markdown table of `rows`."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def plain(rows: list[Row]) -> str:
    """The same table aligned for a terminal."""
    cells = [HEADER] + [row.cells() for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(HEADER))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
