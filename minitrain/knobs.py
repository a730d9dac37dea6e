"""Every ``MINITRAIN_*`` environment variable minitrain reads, in one table (L0: stdlib only).

This module is the only one that reads ``MINITRAIN_*`` variables from the environment, and `KNOBS`
lists every one of them (as Ray's ``constants.py`` lists its ``RAY_TRAIN_*`` variables):
`tests/unit/test_knobs.py` greps the package to prove both. A `Knob` holds the variable's name, its
default, the parser that turns its text into a value, a one-line doc, and whether users set it
(`internal` ones are set by minitrain for its own child processes). A module reads a knob with
`knob.get()` (from `os.environ`) or `knob.get(environ)` (a given mapping: a test's, a child's
environment), and names it with `knob.name`; a bad value raises `ConfigError` naming the variable, the
value and the fix. A blank value counts as unset.

Some knobs are the defaults of config fields: the straggler rule and the status interval are
`RunConfig(monitoring_config=MonitoringConfig(...))` fields, whose unset fields take these variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

from minitrain.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: `parse` turns its (stripped, non-blank) text into the value, or
    raises ValueError with what is wrong and how to fix it; `default` is the value while it is unset."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str
    internal: bool = False

    def text(self, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The variable's text in `environ` (default: `os.environ`), stripped; None when unset or blank."""
        value = (os.environ if environ is None else environ).get(self.name)
        if value is None or not value.strip():
            return None
        return value.strip()

    def unset(self) -> None:
        """Remove the variable from this process's environment (a secret, once read: children started
        afterwards do not inherit it)."""
        os.environ.pop(self.name, None)

    def get(self, environ: Optional[Mapping[str, str]] = None) -> T:
        """The parsed value in `environ` (default: `os.environ`), or `default` when unset or blank.

        Raises ConfigError naming the variable, its value and the fix for a value `parse` refuses."""
        text = self.text(environ)
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            default = "" if self.default is None else f" ({_shown(self.default)})"
            raise ConfigError(f"{self.name}={text!r}: {exc}; or unset {self.name} for the default{default}.") \
                from None


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "1" if default else "0"
    return f"{default:g}" if isinstance(default, float) else str(default)


# ---------------------------------------------------------------------------------- parsers

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def _text(text: str) -> str:
    return text


def _switch(text: str) -> bool:
    value = text.lower()
    if value in _ON or value in _OFF:
        return value in _ON
    raise ValueError(f"use one of {', '.join(_ON)} (on) or {', '.join(_OFF)} (off)")


def _relay(text: str) -> Optional[bool]:
    value = text.lower()
    if value == "auto":
        return None
    if value in _ON or value in _OFF:
        return value in _ON
    raise ValueError("not a known value; use 1 (relay, the default; auto means the same) or 0 (every worker "
                     "dials the coordinator itself)")


def _status(text: str) -> str:
    value = text.lower()
    if value in ("auto", "lines"):
        return value
    if value in _ON or value in _OFF:
        return "auto" if value in _ON else "off"
    raise ValueError("use 0 (or off) to turn the status off, lines for summary lines even on a terminal, or "
                     "auto (a block on a terminal, lines elsewhere)")


def _number_above(bound: float, what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value > bound or value == float("inf"):
            raise ValueError(f"must be a finite number above {bound:g} ({what})")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise ValueError("must be a finite number of seconds >= 0")
    return value


def _count(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"must be a whole number >= 1 ({what})")
        return value
    return parse


def _wait_seconds(text: str) -> Optional[float]:
    if text.lower() in ("inf", "forever"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a number of seconds >= 0 (0 fails at once when the hosts are busy), or "
                         "forever")
    return value


def _ledger_dir(text: str) -> Optional[str]:
    if text.lower() == "off":
        return None
    if not text.startswith("/"):
        raise ValueError("must be an absolute path (every run on the host must find the same directory), or off")
    return text


def _foreign_gpus(text: str) -> str:
    value = text.lower()
    if value not in ("report", "taken"):
        raise ValueError("use report (a GPU busy with a process outside minitrain is reported) or taken (it is "
                         "also kept out of placement)")
    return value


def _slurm(text: str) -> Optional[bool]:
    value = text.lower()
    if value == "auto":
        return None
    if value in _ON or value in _OFF:
        return value in _ON
    raise ValueError("use auto (the default: Slurm mode inside an allocation), 1 (require an allocation) or 0 "
                     "(ignore the allocation: run as outside Slurm)")


def _pid(text: str) -> Optional[int]:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("must be a process id (minitrain sets it for the trial processes of a sweep)")
    return int(text)


# ---------------------------------------------------------------------------------- the table

HOSTS: Knob[Optional[str]] = Knob(
    "MINITRAIN_HOSTS", None, _text,
    "Comma-separated hosts (HOST or HOST:SLOTS) of the next run when minitrain.init() named none "
    "(minitrain.hosts.cluster); not with MINITRAIN_HOSTFILE.")
HOSTFILE: Knob[Optional[str]] = Knob(
    "MINITRAIN_HOSTFILE", None, _text,
    "Path of a file naming one host per line, used as MINITRAIN_HOSTS is (minitrain.hosts.cluster).")
SLURM: Knob[Optional[bool]] = Knob(
    "MINITRAIN_SLURM", None, _slurm,
    "Slurm mode: auto (default: inside an allocation, SLURM_JOB_ID set, runs take their hosts from it and "
    "start agents with srun), 1 (require an allocation) or 0 (ignore it) (minitrain.hosts.cluster).")
DASHBOARD: Knob[Optional[str]] = Knob(
    "MINITRAIN_DASHBOARD", None, _text,
    "Where fit() and Tuner.fit() serve the live dashboard and /metrics: unset for 127.0.0.1 on a free port, "
    "HOST:PORT, HOST or PORT, or 0 to turn it off (parsed by minitrain.dashboard.settings).")
RELAY: Knob[Optional[bool]] = Knob(
    "MINITRAIN_RELAY", None, _relay,
    "Whether workers' streams go through their node agent's relay: 1 (the default, at every size; auto "
    "means the same) or 0 (every worker dials the coordinator itself over gRPC).")
LOCAL_AGENT_STREAM: Knob[bool] = Knob(
    "MINITRAIN_LOCAL_AGENT_STREAM", True, _switch,
    "Whether the node agent on the driver's machine streams to the coordinator over a local socket: 1 (the "
    "default: no gRPC threads and wake-ups per message on either side) or 0 (gRPC on loopback, as remote "
    "agents do).")
STATUS: Knob[str] = Knob(
    "MINITRAIN_STATUS", "auto", _status,
    "The driver's live status: auto (a block at the bottom of a terminal, summary lines elsewhere), lines "
    "(summary lines even on a terminal) or 0 (off).")
STATUS_INTERVAL_S: Knob[float] = Knob(
    "MINITRAIN_STATUS_INTERVAL_S", 30.0, _number_above(0, "seconds between status lines"),
    "Seconds between the status summary lines off a terminal: the default of "
    "MonitoringConfig.status_interval_s.")
TELEMETRY: Knob[bool] = Knob(
    "MINITRAIN_TELEMETRY", True, _switch,
    "0 turns off each rank's telemetry (step and wait times sampled about once a second, minitrain.waits).")
STRAGGLER_FACTOR: Knob[float] = Knob(
    "MINITRAIN_STRAGGLER_FACTOR", 1.5, _number_above(1, "1.5 flags a rank 50% slower than the others"),
    "A rank is a straggler from this many times the others' median work time per step: the default of "
    "MonitoringConfig.straggler_factor.")
STRAGGLER_WINDOW: Knob[int] = Knob(
    "MINITRAIN_STRAGGLER_WINDOW", 10, _count("telemetry samples per rank the straggler rule takes the median of"),
    "Telemetry samples per rank whose median the straggler rule judges: the default of "
    "MonitoringConfig.straggler_window.")
STRAGGLER_MIN_SAMPLES: Knob[int] = Knob(
    "MINITRAIN_STRAGGLER_MIN_SAMPLES", 5, _count("samples a rank needs before it is judged"),
    "Samples a rank needs before the straggler rule judges it (unset: 5, or the window when that is "
    "smaller): the default of MonitoringConfig.straggler_min_samples.")
KEY_DIR: Knob[Optional[str]] = Knob(
    "MINITRAIN_KEY_DIR", None, _text,
    "The private directory (0700) of the user's restore key, restore.key, which seals what a sweep stores for "
    "Tuner.restore that is not JSON (minitrain.storage.user_key); unset: ~/.minitrain.")
TUNE_PARENT: Knob[Optional[int]] = Knob(
    "MINITRAIN_TUNE_PARENT", None, _pid,
    "The pid of the sweep that started this trial process, which ends with it (minitrain.tune).",
    internal=True)

LEDGER_DIR: Knob[Optional[str]] = Knob(
    "MINITRAIN_LEDGER_DIR", "/var/tmp/minitrain-ledger", _ledger_dir,
    "The directory of this host's resource ledger, where every run claims the GPUs (and named CPUs and "
    "memory) it holds (minitrain.hosts.ledger); made mode 1777 when missing. off: runs started here claim "
    "nothing and never wait (under a scheduler such as Slurm, which gives each job its own GPUs).")
MEMORY_TIER_DIR: Knob[str] = Knob(
    "MINITRAIN_MEMORY_TIER_DIR", "/dev/shm", _text,
    "Where each node agent makes its memory tier, the private directory its workers' checkpoint files go to "
    "first (minitrain.storage.memory_tier): a tmpfs, so the files are in host memory.")
PERSIST_RETRY_S: Knob[float] = Knob(
    "MINITRAIN_PERSIST_RETRY_S", 60.0, _seconds,
    "How long a node agent keeps retrying (with doubling pauses) to write a checkpoint from its memory tier to "
    "storage before the round's commit fails by name (minitrain.agent.tier_keeper).")
RESOURCE_WAIT_S: Knob[Optional[float]] = Knob(
    "MINITRAIN_RESOURCE_WAIT_S", None, _wait_seconds,
    "Seconds a run waits for the GPUs/CPUs/memory other runs hold on its hosts: unset (or forever) waits "
    "as long as it takes, 0 fails at once (minitrain.hosts.reserve). The limit holds whatever another "
    "process does with a ledger's lock: a claim waits for it 0.5 s at most.")
LEDGER_FOREIGN_GPUS: Knob[str] = Knob(
    "MINITRAIN_LEDGER_FOREIGN_GPUS", "report", _foreign_gpus,
    "A GPU busy with a process outside any minitrain claim: report (default: named in the waiting line and "
    "--status) or taken (also kept out of placement).")

JOIN_TOKEN: Knob[Optional[str]] = Knob(
    "MINITRAIN_JOIN_TOKEN", None, _text,
    "The run token of a run whose agents join by themselves (a Kubernetes Secret as an environment variable); "
    "at least 32 characters. Read by the coordinator and every joiner (minitrain.hosts.joining).")
JOIN_TOKEN_FILE: Knob[Optional[str]] = Knob(
    "MINITRAIN_JOIN_TOKEN_FILE", None, _text,
    "A file holding that run token (a Kubernetes Secret mounted as a file); wins over MINITRAIN_JOIN_TOKEN.")
JOIN_TIMEOUT_S: Knob[float] = Knob(
    "MINITRAIN_JOIN_TIMEOUT_S", 600.0, _number_above(0, "seconds"),
    "How long a joiner retries resolving and reaching the coordinator, and how long the coordinator waits for "
    "the agents that join (the master's DNS name may not exist yet when a pod starts).")

ELASTIC_START_WAIT_S: Knob[float] = Knob(
    "MINITRAIN_ELASTIC_START_WAIT_S", 5.0, _seconds,
    "An elastic run (ScalingConfig(num_workers=(min, max))) starts this many seconds after its min workers "
    "fit on the hosts that answered, unless every host is in sooner; the hosts that come later are used when "
    "it grows (docs/elastic.md). 0 starts as soon as min fit.")

KNOBS: tuple[Knob[Any], ...] = (HOSTS, HOSTFILE, SLURM, DASHBOARD, RELAY, LOCAL_AGENT_STREAM, STATUS,
                                STATUS_INTERVAL_S, TELEMETRY, STRAGGLER_FACTOR, STRAGGLER_WINDOW,
                                STRAGGLER_MIN_SAMPLES, KEY_DIR, TUNE_PARENT, LEDGER_DIR, MEMORY_TIER_DIR, PERSIST_RETRY_S,
                                RESOURCE_WAIT_S,
                                LEDGER_FOREIGN_GPUS, JOIN_TOKEN, JOIN_TOKEN_FILE, JOIN_TIMEOUT_S,
                                ELASTIC_START_WAIT_S)


def check_all(environ: Optional[Mapping[str, str]] = None) -> None:
    """Parse every knob in `environ` (default: `os.environ`); raises the first ConfigError, so that a run
    can refuse a bad value before it creates anything."""
    for knob in KNOBS:
        knob.get(environ)
