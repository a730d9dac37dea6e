"""Where the dashboard listens: `MINITRAIN_DASHBOARD`, parsed and validated.

    unset or ""        on, at 127.0.0.1 with a port the system picks (the default)
    "0" / "off"        off: no server, no port
    "HOST:PORT"        on HOST (a name, an IPv4 address or a bracketed IPv6 address) and PORT (0: any)
    "HOST"             on HOST, any port
    ":PORT" / "PORT"   on 127.0.0.1 at PORT

The live dashboard is configured by the environment only, like the log level: `RunConfig` keeps Ray's
fields, so a training script runs unchanged under Ray and under minitrain, and an operator turns the
dashboard on, off or onto another interface without touching the script.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from minitrain import knobs
from minitrain.errors import ConfigError

ENV_VAR = knobs.DASHBOARD.name
LOOPBACK = "127.0.0.1"
_OFF = {"0", "off", "false", "no"}


@dataclass(frozen=True)
class DashboardAddress:
    """A host and port to bind; port 0 lets the system pick one."""

    host: str = LOOPBACK
    port: int = 0

    @property
    def is_loopback(self) -> bool:
        """True when only this machine can connect (127.0.0.0/8, ::1 or 'localhost')."""
        return is_loopback_host(self.host)


def is_loopback_host(host: str) -> bool:
    """True for 'localhost' and loopback IP addresses; False for every other name or address
    (a name could resolve anywhere, so it counts as reachable from other machines)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_address(value: Optional[str], source: str = ENV_VAR) -> Optional[DashboardAddress]:
    """The address `value` names (see the module docstring), or None when it turns the dashboard off.

    Raises ConfigError naming `source`, the value and the accepted forms for anything else."""
    if value is None or value.strip() == "":
        return DashboardAddress()
    text = value.strip()
    if text.lower() in _OFF:
        return None
    host, port_text = _split(text, source, value)
    host = host or LOOPBACK
    if not _valid_host(host):
        raise _bad(source, value, f"{host!r} is not a host name or IP address")
    if port_text is None:
        return DashboardAddress(host, 0)
    if not _ascii_digits(port_text) or not 0 <= int(port_text) <= 65535:
        raise _bad(source, value, f"the port {port_text!r} is not an integer from 0 to 65535")
    return DashboardAddress(host, int(port_text))


def _ascii_digits(text: str) -> bool:
    # str.isdigit() also takes "٣" and "¹" (int() refuses the second): ports are ASCII digits.
    return text.isascii() and text.isdigit()


def _split(text: str, source: str, value: str) -> tuple[str, Optional[str]]:
    if _ascii_digits(text):
        return LOOPBACK, text
    if text.startswith("["):  # [IPv6]:port or [IPv6]
        end = text.find("]")
        rest = text[end + 1:] if end > 0 else None
        if rest is None or (rest and not rest.startswith(":")) or not _is_ipv6(text[1:end]):
            raise _bad(source, value, "a bracketed IPv6 address must look like [::1]:8265")
        return text[1:end], rest[1:] if rest else None
    if text.count(":") > 1:
        raise _bad(source, value, "write an IPv6 address in brackets, e.g. [::1]:8265")
    if ":" in text:
        host, port = text.split(":", 1)
        return host, port
    return text, None


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def _valid_host(host: str) -> bool:
    """An IP address, or a host name of ASCII letters, digits and hyphens (not all digits: "999.1.1.1"
    or "1.2.3" is a mistyped address, which the resolver would read as some other one)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        labels = host.rstrip(".").split(".")
        return (host.isascii() and len(host) <= 253 and not all(label.isdigit() for label in labels)
                and all(label and len(label) <= 63 and label.replace("-", "").isalnum()
                        and not label.startswith("-") for label in labels))


def _bad(source: str, value: str, why: str) -> ConfigError:
    return ConfigError(
        f"{source}={value!r}: {why}. Use HOST:PORT (e.g. 127.0.0.1:8265, 0.0.0.0:8265, [::1]:8265), "
        f"HOST (any free port), PORT (on 127.0.0.1), or 0 to turn the dashboard off.")
