"""What a Slurm allocation gives a run, read from the environment alone (L1: stdlib + L0; no `scontrol`).

Inside an allocation (``sbatch``, ``salloc``, or a step of either) Slurm sets ``SLURM_JOB_ID`` and
describes the nodes in two compressed syntaxes, parsed here in Python, because ``scontrol show
hostnames`` is missing in many containers (pyxis/enroot):

- a hostlist (``SLURM_JOB_NODELIST``): comma-separated names, each with any number of bracket groups
  of numbers and ranges, zero padding kept (``gpu[01-04,07],cpu5``, ``rack[1-2]-node[01-02]``; several
  groups expand as their product, the first group outermost, as Slurm does);
- counts per node (``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_CPUS_PER_NODE``): ``4(x2),2`` is 4, 4, 2.

`allocation_from_environment` turns them into a `SlurmAllocation`: the job, its nodes in order, and
each node's slots (the most workers minitrain places there), chosen by the first rule that applies:

1. GPUs per node, when the job has GPUs: ``SLURM_GPUS_PER_NODE`` (``4`` or ``a100:4``; types summed),
   else this node's own count (``SLURM_GPUS_ON_NODE``, else the ids in ``SLURM_JOB_GPUS`` /
   ``SLURM_STEP_GPUS``) taken for every node (ask with ``--gpus-per-node`` for an uneven allocation);
2. tasks per node (``SLURM_TASKS_PER_NODE``), when tasks were asked for (``SLURM_NTASKS_PER_NODE``,
   ``SLURM_NTASKS`` or ``SLURM_NPROCS`` is set);
3. CPUs per node (``SLURM_JOB_CPUS_PER_NODE``).

A value that does not parse raises `SlurmEnvironmentError` naming the variable, its value and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product
from typing import Optional

from minitrain.errors import ConfigError

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
OLD_NODELIST = "SLURM_NODELIST"  # the name before SLURM_JOB_NODELIST; still set by every version
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"
GPUS_PER_NODE = "SLURM_GPUS_PER_NODE"
GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
JOB_GPUS = "SLURM_JOB_GPUS"
STEP_GPUS = "SLURM_STEP_GPUS"
TASKS_ASKED = ("SLURM_NTASKS_PER_NODE", "SLURM_NTASKS", "SLURM_NPROCS")
STEP_ID = "SLURM_STEP_ID"
STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
RESTART_COUNT = "SLURM_RESTART_COUNT"  # how many times Slurm requeued this job (unset before the first)

_NAME_CHARS = re.compile(r"[A-Za-z0-9_.:%-]+")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_GPU_ENTRY = re.compile(r"(?:[A-Za-z_][\w.-]*:)?(\d+)")
_MAX_EXPANDED = 1_000_000  # a typo such as node[1-99999999] must not eat the memory


class SlurmEnvironmentError(ConfigError):
    """A Slurm variable minitrain reads has a value it cannot use; the message names both and the fix."""


def _error(variable: str, value: str, what: str, fix: str) -> SlurmEnvironmentError:
    return SlurmEnvironmentError(f"{variable}={value!r}: {what}. {fix}")


_HOSTLIST_FIX = ("Expected a Slurm hostlist such as 'gpu[01-04,07],cpu5' (what `scontrol show hostnames` "
                 "expands); check the variable, or name the hosts explicitly with minitrain.init(hosts=...)")


# ---------------------------------------------------------------------------------- hostlists

def _split_top_level(text: str, variable: str) -> list[str]:
    """`text` split at the commas outside brackets; unbalanced brackets are an error."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise _error(variable, text, "has a bracket inside a bracket", _HOSTLIST_FIX)
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _error(variable, text, "has a ']' without its '['", _HOSTLIST_FIX)
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise _error(variable, text, "has a '[' that is never closed", _HOSTLIST_FIX)
    items.append(text[start:])
    return items


def _expand_ranges(body: str, text: str, variable: str) -> list[str]:
    """``01-03,7`` -> 01 02 03 7: each range is padded to the width of its lower bound."""
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise _error(variable, text, f"has [{body}], whose {part!r} is neither a number nor a range "
                         f"'low-high'", _HOSTLIST_FIX)
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            raise _error(variable, text, f"has the range {part!r}, which runs backwards", _HOSTLIST_FIX)
        if len(numbers) + high - low >= _MAX_EXPANDED:
            raise _error(variable, text, f"names more than {_MAX_EXPANDED} hosts", _HOSTLIST_FIX)
        numbers.extend(str(n).zfill(len(low_text)) for n in range(low, high + 1))
    return numbers


def _expand_item(item: str, text: str, variable: str) -> list[str]:
    pieces: list[list[str]] = []  # literal text and bracket groups, in order
    for index, part in enumerate(re.split(r"(\[[^\]]*\])", item)):
        if index % 2:
            pieces.append(_expand_ranges(part[1:-1], text, variable))
        elif part:
            if not _NAME_CHARS.fullmatch(part):
                raise _error(variable, text, f"has {item!r}, with a character no host name has",
                             _HOSTLIST_FIX)
            pieces.append([part])
    if not pieces:
        raise _error(variable, text, "has an empty entry (two commas in a row, or a trailing comma)",
                     _HOSTLIST_FIX)
    return ["".join(parts) for parts in product(*pieces)]


def expand_hostlist(text: str, variable: str = NODELIST) -> tuple[str, ...]:
    """The host names of the Slurm hostlist `text`, in order (``n[1-2],x`` -> n1, n2, x).

    Commas split entries only outside brackets; inside, they separate numbers and ranges. A range
    keeps the width of its lower bound (``[08-10]`` -> 08, 09, 10; ``[8-10]`` -> 8, 9, 10). Several
    bracket groups in one entry expand as their product, the first group varying slowest. Raises
    `SlurmEnvironmentError` naming `variable` for an empty list, unbalanced or nested brackets, a
    backwards range, a character no host name has, or a host listed twice.
    """
    stripped = text.strip()
    if not stripped:
        raise _error(variable, text, "names no host", _HOSTLIST_FIX)
    names: list[str] = []
    for item in _split_top_level(stripped, variable):
        names.extend(_expand_item(item.strip(), stripped, variable))
        if len(names) > _MAX_EXPANDED:
            raise _error(variable, text, f"names more than {_MAX_EXPANDED} hosts", _HOSTLIST_FIX)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _error(variable, text, f"names the host {name!r} twice", _HOSTLIST_FIX)
        seen.add(name)
    return tuple(names)


# ---------------------------------------------------------------------------------- counts

def expand_counts(text: str, variable: str = TASKS_PER_NODE) -> tuple[int, ...]:
    """Counts per node from Slurm's compressed form: ``4(x2),2`` -> (4, 4, 2). Raises
    `SlurmEnvironmentError` naming `variable` for anything else (an empty entry, ``(x0)``, a word)."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _COUNT.fullmatch(part.strip())
        if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
            raise _error(variable, text, f"has {part!r}, which is not a count 'N' or 'N(xK)'",
                         "Expected Slurm's counts per node such as '4(x2),2'; check the variable")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > _MAX_EXPANDED:
            raise _error(variable, text, f"counts more than {_MAX_EXPANDED} nodes",
                         "Check the variable")
        counts.extend([int(match.group(1))] * repeat)
    return tuple(counts)


# ---------------------------------------------------------------------------------- the allocation

@dataclass(frozen=True)
class SlurmAllocation:
    """The allocation this process runs in: `job_id`, `nodes` (as Slurm names them, in the order of
    ``SLURM_JOB_NODELIST``), `slots` (one per node: the most workers placed there) and `slots_from`
    (the variable the slots were read from, for messages)."""

    job_id: str
    nodes: tuple[str, ...]
    slots: tuple[int, ...]
    slots_from: str


def _get(environ: Mapping[str, str], name: str) -> Optional[str]:
    value = environ.get(name)
    return value.strip() if value is not None and value.strip() else None


def _gpus_per_node(environ: Mapping[str, str]) -> Optional[tuple[str, int]]:
    """(variable, GPUs on each node) when the job has GPUs, else None."""
    per_node = _get(environ, GPUS_PER_NODE)
    if per_node is not None:
        total = 0
        for entry in per_node.split(","):
            match = _GPU_ENTRY.fullmatch(entry.strip())
            if match is None:
                raise _error(GPUS_PER_NODE, per_node, f"has {entry!r}, which is not 'N' or 'TYPE:N'",
                             "Expected what --gpus-per-node takes, such as '4' or 'a100:4'")
            total += int(match.group(1))
        return (GPUS_PER_NODE, total) if total else None
    on_node = _get(environ, GPUS_ON_NODE)
    if on_node is not None:
        if not on_node.isdigit():
            raise _error(GPUS_ON_NODE, on_node, "is not a count", "Slurm sets it to this node's GPU count; "
                         "unset it, or ask for GPUs with --gpus-per-node")
        return (GPUS_ON_NODE, int(on_node)) if int(on_node) else None
    for name in (JOB_GPUS, STEP_GPUS):
        ids = _get(environ, name)
        if ids is not None:
            return name, len([i for i in ids.split(",") if i.strip()])
    return None


def _slots(environ: Mapping[str, str], nodes: tuple[str, ...]) -> tuple[tuple[int, ...], str]:
    gpus = _gpus_per_node(environ)
    if gpus is not None:
        return (gpus[1],) * len(nodes), gpus[0]
    if any(_get(environ, name) is not None for name in TASKS_ASKED):
        variable = TASKS_PER_NODE
    else:
        variable = CPUS_PER_NODE
    value = _get(environ, variable)
    if value is None:  # an old Slurm without one of them: leave each node to its own resources
        fallback = TASKS_PER_NODE if variable == CPUS_PER_NODE else CPUS_PER_NODE
        value, variable = _get(environ, fallback), fallback
        if value is None:
            raise _error(variable, "", "is not set inside an allocation",
                         f"Slurm sets {TASKS_PER_NODE} and {CPUS_PER_NODE} in every job; name the hosts "
                         f"explicitly with minitrain.init(hosts=...) if this is not a Slurm job")
    counts = expand_counts(value, variable)
    if len(counts) != len(nodes):
        raise _error(variable, value, f"counts {len(counts)} node(s) but {NODELIST} names {len(nodes)}",
                     "The two come from the same job and must agree; check that neither was overwritten")
    if any(count < 1 for count in counts):
        raise _error(variable, value, "gives a node no room", "Each node needs at least one task and CPU")
    return counts, variable


def allocation_from_environment(environ: Mapping[str, str]) -> Optional[SlurmAllocation]:
    """The Slurm allocation described by `environ`, or None outside one (``SLURM_JOB_ID`` unset).

    The nodes come from ``SLURM_JOB_NODELIST`` (``SLURM_NODELIST`` on versions without it), the slots as
    the module docstring says. A process that is one of several tasks of a step (``srun -n 2 python
    driver.py``) is refused: every task would start its own run. Raises `SlurmEnvironmentError`.
    """
    job_id = _get(environ, JOB_ID)
    if job_id is None:
        return None
    tasks = _get(environ, STEP_NUM_TASKS)
    if _get(environ, STEP_ID) is not None and tasks is not None and tasks.isdigit() and int(tasks) > 1:
        raise _error(STEP_NUM_TASKS, tasks, "this driver is one of several tasks of a job step, and each "
                     "would start the same run", "Start the driver once: in the batch script itself, or "
                     "with `srun --ntasks=1`; minitrain starts one agent per node as steps of its own")
    variable = NODELIST if _get(environ, NODELIST) is not None else OLD_NODELIST
    nodelist = _get(environ, variable)
    if nodelist is None:
        raise _error(NODELIST, "", f"is not set although {JOB_ID}={job_id} is",
                     "Run inside an allocation made by sbatch or salloc, or unset SLURM_JOB_ID (or set "
                     "MINITRAIN_SLURM=0) to run outside Slurm mode")
    nodes = expand_hostlist(nodelist, variable)
    slots, slots_from = _slots(environ, nodes)
    return SlurmAllocation(job_id=job_id, nodes=nodes, slots=slots, slots_from=slots_from)


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times Slurm has requeued this job (``SLURM_RESTART_COUNT``; 0 when unset)."""
    value = _get(environ, RESTART_COUNT)
    if value is None:
        return 0
    if not value.isdigit():
        raise _error(RESTART_COUNT, value, "is not a count", "Slurm sets it to a whole number; unset it")
    return int(value)
