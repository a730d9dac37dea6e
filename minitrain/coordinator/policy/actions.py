"""The actions `decide` returns to the controller (coordinator/policy/decide.py), but for `LogLate`, which
names a wait of the loop and lives with it there. Each is executed by the controller's action table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minitrain.run_state import RunState


@dataclass(frozen=True)
class MoveTo:
    """Move the run to `state` (the controller checks it with `run_state.check_move` and tells the
    observers); `target` only with STOPPING: the terminal state the stop leads to. A decision's moves,
    in order, lead from its input loop's state to its output loop's."""

    state: RunState
    reason: str
    target: Optional[RunState] = None


@dataclass(frozen=True)
class StartAttempt:
    """Place the ranks of `attempt` on the connected nodes and start its workers. `resize` says why an
    elastic run restarts without a charged failure ("" for any other start): `SHRINK` after a node loss,
    `GROW` when more workers fit; the new size itself is the controller's (`coordinator/policy/elastic.py`)."""

    attempt: int
    resize: str = ""


SHRINK = "shrink"
GROW = "grow"


@dataclass(frozen=True)
class StopWorkers:
    """Ask every node of the attempt to stop its workers: SIGTERM, `grace_s`, SIGKILL."""

    grace_s: float


@dataclass(frozen=True)
class CollectStacks:
    """Ask every node for the thread stacks of every worker of the attempt."""


@dataclass(frozen=True)
class DeclareHung:
    """Record a hang failure for each of `ranks`, with the stacks that arrived."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class CloseStreams:
    """Close every stream of the attempt still open: nothing a frozen rank sends later is read."""


@dataclass(frozen=True)
class PrepareForkServers:
    """Keep a warm fork server on each node so that the next attempt starts fast."""


@dataclass(frozen=True)
class RelaunchAgents:
    """Start new agents for lost nodes that may come back (local ones at once, remote ones after backoff)."""


@dataclass(frozen=True)
class ForgetAgents:
    """The relaunched agents that did not connect in time stay lost (their hosts back off longer)."""

    reason: str


@dataclass(frozen=True)
class DropDeadAgents:
    """Elastic runs: nodes whose agent ended before it connected are out of the run (their hosts are
    tried again after the resize interval) instead of holding up the start or failing it."""


@dataclass(frozen=True)
class AgreePreemption:
    """Tell every rank of the attempt that the run is preempted; the round follows their answers
    (coordinator/facts/preemption.py)."""
