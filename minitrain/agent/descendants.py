"""Everything a worker started is gone when its attempt ends: the agent's cleanup of descendants.

A worker's process group is stopped when the worker ends, but a process that started its own
session (a daemon the training function spawned, `Popen(start_new_session=True)`, a double fork)
is not in that group, and would outlive `fit()` holding its ports, files and GPU memory. When the
last worker of an attempt on this node has exited, `Descendants.end_attempt` ends such processes:
SIGTERM, then SIGKILL after the grace, then a bounded wait. Two mechanisms, both used when present:

- cgroup v2 (`cgroups.py`): each attempt's workers live in a cgroup of their own; every process in
  it is signalled, then killed with `cgroup.kill`, including processes whose parents died.
- the process tree: the agent is a subreaper (`procs.become_subreaper`), so every orphan among its
  workers' descendants is re-parented to it. At the end of an attempt every child of the agent that is
  not a worker or fork server it runs is such a leftover; it is signalled (`procs.signal_orphans`),
  and its own children come to the agent when it dies, to be signalled in turn.

Nothing else is ever signalled: no process is chosen by name, only by cgroup membership (of
directories this agent created) or by being the agent's own unreaped child. Which mechanism is in use
is logged at debug level when the agent starts (`python -m minitrain.agent --log-level DEBUG`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Optional

from minitrain import procs
from minitrain.agent.cgroups import AgentCgroup, open_agent_cgroup

logger = logging.getLogger("minitrain.agent")

DESCENDANT_GRACE_S = 2.0  # SIGTERM -> SIGKILL for what outlived an attempt's workers
KILL_WAIT_S = 5.0  # after SIGKILL: processes in uninterruptible sleep are given up then
_POLL_S = 0.02


class Descendants:
    """The leftovers of each attempt's workers on this node, and how to end them.

    `known_pids()` returns the pids of the agent's own children it keeps (living workers, fork
    servers). `children_lock` is held by the agent whenever it starts a child (from the fork or spawn
    until the pid is in `known_pids()`) and whenever it reaps orphans; the sweep holds it while it
    looks and signals, so it never mistakes a child being started for a leftover.
    """

    def __init__(self, run_id: str, known_pids: Callable[[], set[int]], children_lock: threading.Lock,
                 use_cgroups: bool = True):
        self._known_pids = known_pids
        self._children_lock = children_lock
        self._ending = threading.Lock()  # one cleanup at a time (attempt ends and the agent's end)
        self.cgroup: Optional[AgentCgroup] = None
        reason = "disabled"
        if use_cgroups:
            self.cgroup, reason = open_agent_cgroup(run_id)
        if self.cgroup is not None:
            self.mechanism = f"cgroup v2 ({self.cgroup.root}, cgroup.kill) and the process tree (subreaper)"
        else:
            self.mechanism = f"the process tree (subreaper); no cgroups: {reason}"
        logger.debug("descendants of workers are ended through %s", self.mechanism)

    def add_worker(self, pid: int, attempt: int) -> None:
        """Put a new worker (our child, before it runs any user code) into its attempt's cgroup."""
        if self.cgroup is None:
            return
        try:
            self.cgroup.add(pid, attempt)
        except OSError as exc:
            # Still ended by the process tree sweep; only escapes from the tree are out of reach.
            logger.warning("could not move worker %d into cgroup %s (%s); its descendants are ended "
                           "through the process tree only", pid, self.cgroup.attempt_dir(attempt), exc)

    def end_attempt(self, attempt: int, grace_s: float = DESCENDANT_GRACE_S,
                    kill_wait_s: float = KILL_WAIT_S) -> list[int]:
        """End what is left of `attempt` (and of no other attempt's cgroup): SIGTERM, up to `grace_s`,
        SIGKILL, up to `kill_wait_s`. Returns the pids still alive then (uninterruptible sleep).

        The process tree sweep takes every leftover child of the agent, whatever its attempt: call
        this when no other attempt's workers run on this node (the controller starts the next
        attempt only after every worker of this one has exited)."""
        with self._ending:
            attempts = [attempt] if self.cgroup is not None else []
            return self._end(attempts, grace_s, kill_wait_s)

    def close(self, grace_s: float = DESCENDANT_GRACE_S, kill_wait_s: float = KILL_WAIT_S) -> list[int]:
        """The agent's end: end every attempt's leftovers and remove the cgroup directories it made."""
        with self._ending:
            attempts = self.cgroup.attempts() if self.cgroup is not None else []
            survivors = self._end(attempts, grace_s, kill_wait_s)
            if self.cgroup is not None and not survivors:
                self.cgroup.close()
            return survivors

    def _end(self, attempts: list[int], grace_s: float, kill_wait_s: float) -> list[int]:
        term_deadline = time.monotonic() + grace_s
        end_deadline = term_deadline + kill_wait_s
        signalled: set[int] = set()
        for attempt in attempts:
            self.cgroup.terminate(attempt)
        while True:
            killing = time.monotonic() >= term_deadline
            with self._children_lock:
                if killing:
                    living = procs.signal_orphans(self._known_pids(), signal.SIGKILL)
                else:
                    living = procs.signal_orphans(self._known_pids(), None)
                    for pid in set(living) - signalled:
                        _terminate_child(pid)  # our unreaped child, under the lock: the pid is surely it
                signalled.update(living)
            in_cgroups = [pid for attempt in attempts for pid in self.cgroup.members(attempt)]
            if killing:
                for attempt in attempts:
                    self.cgroup.kill(attempt)
            if not living and not in_cgroups:
                break
            if time.monotonic() >= end_deadline:
                logger.warning("processes %s left by workers are still alive %.1f s after SIGKILL "
                               "(uninterruptible sleep?); giving up on them", sorted(set(living + in_cgroups)),
                               kill_wait_s)
                return sorted(set(living + in_cgroups))
            time.sleep(_POLL_S)
        for attempt in attempts:
            self.cgroup.remove(attempt)
        if signalled or attempts:
            logger.debug("ended %d leftover process(es) of attempt(s) %s", len(signalled), attempts or "-")
        return []


def _terminate_child(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once woken
    except ProcessLookupError:
        pass
