"""Hosts as users write them (L1: stdlib + L0 only): `HostSpec`, and the two syntaxes of a list of hosts.

- a host list, as ``-H`` of Horovod: ``"gpu1:8,gpu2:8,10.0.0.3,[::1]:2"`` (``host[:slots]``; IPv6 in
  brackets when slots are given): `parse_host_list`;
- a hostfile, the DeepSpeed/MPI format: ``host slots=N`` per line (``slots=`` optional), ``#`` comments:
  `parse_hostfile`, `load_hostfile`.

Hosts named ``localhost``, ``127.0.0.1`` or ``::1`` are local (`is_local_host`): their agent runs as a
subprocess, without ssh. `minitrain.hosts.cluster` builds clusters of these hosts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional, Union

from minitrain.errors import ConfigError

LOCAL_HOST_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

# Hostnames, IPv4 and IPv6 (with a zone after %). No leading '-': the name becomes an ssh argument.
_HOST_NAME = re.compile(r"[A-Za-z0-9_.:%][A-Za-z0-9_.:%-]*")


def is_local_host(name: str) -> bool:
    """True when `name` is this machine's loopback name or address (run without ssh)."""
    return name.lower() in LOCAL_HOST_NAMES


@dataclass(frozen=True, slots=True)
class HostSpec:
    """One host of a cluster.

    `name` is the hostname or IP address as written (IPv6 without brackets). `slots` is the most
    workers placed on it; None leaves it to its resources. `local` is True when the host is this
    machine (run without ssh); left None it is decided from the name (`is_local_host`).
    """

    name: str
    slots: Optional[int] = None
    local: Optional[bool] = None  # always a bool after construction

    def __post_init__(self):
        if not isinstance(self.name, str) or not _HOST_NAME.fullmatch(self.name):
            raise ConfigError(f"HostSpec.name must be a hostname or IP address (letters, digits, '.', "
                              f"'-', '_', ':'; not starting with '-'), got {self.name!r}.")
        if self.slots is not None and (isinstance(self.slots, bool) or not isinstance(self.slots, int)
                                       or self.slots < 1):
            raise ConfigError(f"HostSpec.slots must be None or an int >= 1, got {self.slots!r} for host "
                              f"{self.name!r}. Leave it out to let the host's resources decide.")
        if self.local is None:
            object.__setattr__(self, "local", is_local_host(self.name))
        elif not isinstance(self.local, bool):
            raise ConfigError(f"HostSpec.local must be True, False or None, got {self.local!r}.")


# ---------------------------------------------------------------------------------- host lists

_HOST_LIST_FORMAT = "host[:slots], e.g. 'gpu1:8', '10.0.0.3' or '[::1]:2'"


def _parse_slots(text: str, item: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{where}: {item!r} has slots {text!r}; slots must be an int >= 1. "
                          f"Expected {_HOST_LIST_FORMAT}.")
    return int(text)


def _parse_host_item(item: str, where: str) -> HostSpec:
    slots: Optional[int] = None
    if item.startswith("["):  # [IPv6] or [IPv6]:slots
        match = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", item)
        if match is None:
            raise ConfigError(f"{where}: {item!r} is not a valid host; expected {_HOST_LIST_FORMAT}.")
        name, slots_text = match.group(1), match.group(2)
        if slots_text is not None:
            slots = _parse_slots(slots_text, item, where)
    elif item.count(":") > 1:  # a bare IPv6 address; slots need brackets
        name = item
    else:
        name, _, slots_text = item.partition(":")
        if _:
            slots = _parse_slots(slots_text, item, where)
    if not _HOST_NAME.fullmatch(name):
        raise ConfigError(f"{where}: {item!r} has the host name {name!r}, which is not a hostname or IP "
                          f"address. Expected {_HOST_LIST_FORMAT}.")
    return HostSpec(name, slots)


def parse_host_list(items: Union[str, Iterable[str]]) -> tuple[HostSpec, ...]:
    """Hosts from ``["gpu1:8", "gpu2:8", "10.0.0.3", "localhost:2"]`` or ``"gpu1:8,gpu2:8"``.

    Each entry is ``host[:slots]``; an IPv6 address with slots is written in brackets (``[::1]:2``).
    Entries may themselves be comma-separated; empty entries are skipped. Raises `ConfigError` for a
    bad entry, slots < 1, a host listed twice (naming it) or no host at all.
    """
    if isinstance(items, str):
        items = [items]
    elif not isinstance(items, Iterable):
        raise TypeError(f"hosts must be a string or a list of strings, got {items!r}.")
    hosts: list[HostSpec] = []
    seen: dict[str, str] = {}
    for entry in items:
        if not isinstance(entry, str):
            raise TypeError(f"hosts must be a string or a list of strings; got the entry {entry!r}.")
        for piece in entry.split(","):
            item = piece.strip()
            if not item:
                continue
            host = _parse_host_item(item, "host list")
            key = host.name.lower()
            if key in seen:
                raise ConfigError(f"host list: host {host.name!r} is listed twice ({seen[key]!r} and "
                                  f"{item!r}). List each host once, with :slots for several workers.")
            seen[key] = item
            hosts.append(host)
    if not hosts:
        raise ConfigError(f"the host list {items!r} names no host. Expected {_HOST_LIST_FORMAT}, "
                          f"comma-separated.")
    return tuple(hosts)


_HOSTFILE_FORMAT = "'host' or 'host slots=N' (N >= 1), e.g. 'gpu1 slots=8'"
_HOSTFILE_LINE = re.compile(r"(\S+)(?:\s+slots\s*=\s*(\S+))?")


def parse_hostfile(text: str, source: str = "hostfile") -> tuple[HostSpec, ...]:
    """Hosts from a DeepSpeed/MPI hostfile: one ``host slots=N`` per line (``slots=N`` optional).

    ``#`` starts a comment (whole line or trailing); blank lines are skipped. Raises `ConfigError`
    naming ``source:line`` and the line for bad syntax or slots < 1, both line numbers for a host
    listed twice, and `source` when no host is listed.
    """
    hosts: list[HostSpec] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        match = _HOSTFILE_LINE.fullmatch(line)
        bad = match is None or (match.group(2) is not None and
                                (not match.group(2).isdigit() or int(match.group(2)) < 1))
        name = match.group(1) if match is not None else ""
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        if not bad and (not _HOST_NAME.fullmatch(name) or name.count(":") == 1):
            bad = True
        if bad:
            hint = ""
            if match is not None and name.count(":") == 1 and not name.startswith("["):
                host, _, slots = name.partition(":")
                hint = f" (write '{host} slots={slots}')"
            raise ConfigError(f"{where}: bad hostfile line {raw.strip()!r}{hint}; expected "
                              f"{_HOSTFILE_FORMAT}, with '#' for comments.")
        key = name.lower()
        if key in first_line:
            raise ConfigError(f"{where}: host {name!r} is listed twice (lines {first_line[key]} and "
                              f"{number}). List each host once and give it slots=N.")
        first_line[key] = number
        slots = int(match.group(2)) if match.group(2) is not None else None
        hosts.append(HostSpec(name, slots))
    if not hosts:
        raise ConfigError(f"{source} lists no host; expected lines like {_HOSTFILE_FORMAT}.")
    return tuple(hosts)


def load_hostfile(path: Union[str, os.PathLike]) -> tuple[HostSpec, ...]:
    """`parse_hostfile` of the file at `path` (``~`` expanded); a missing file is a `ConfigError`."""
    expanded = os.path.expanduser(os.fspath(path))
    try:
        with open(expanded, encoding="utf-8") as file:
            text = file.read()
    except OSError as error:
        raise ConfigError(f"cannot read the hostfile {os.fspath(path)!r}: {error.strerror or error}. "
                          f"Give the path of a file with lines like {_HOSTFILE_FORMAT}.") from error
    return parse_hostfile(text, source=expanded)
