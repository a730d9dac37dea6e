"""A node agent that joins a run by itself (``python -m minitrain.launch --join HOST:PORT``).

The joiner waits until HOST resolves and PORT accepts a connection (the master's DNS name may not
exist yet, and its coordinator may not listen yet: both are retried until `timeout_s`), then serves
the run as any agent does (`NodeAgent`), over TLS trusting only the certificate derived from the run
token and HOST (`minitrain.rpc.tls.join_identity`). Exit codes (`join`):

- 0: the coordinator shut the run down (the run ended, however it ended but preempted: its result is the
  driver's);
- EXIT_PREEMPTED (143): the coordinator shut the run down preempted (a preemption signal reached the driver
  or any agent, this one's included, and the agreed checkpoint is what the next run resumes from). Retryable,
  as the driver's 143: a pod that exited 0 counts as succeeded and is not restarted (PyTorchJob's
  ``restartPolicy: OnFailure``/``ExitCode``), so the resumed run would wait for it in vain;
- EXIT_REFUSED (3): the coordinator refused this agent: a wrong token (found at the TLS handshake, since
  the certificate is derived from the token; over loopback, by the token check), or another run id (a run
  that is over, or another run): retrying cannot help, so a Kubernetes ``restartPolicy: ExitCode`` treats it as
  permanent. Also a joiner that dialled a loopback address (plaintext) where the coordinator serves TLS
  (`plaintext_to_tls`): it cannot ever connect, and the fix is its address; and a joiner for a node id
  whose agent's stream is open (two pods sharing a Secret and a node id): the first agent keeps the node,
  and a joiner started after that agent is lost (its stream ended, or its lease ran out) is accepted; and a
  joiner that dialled over TLS (a name, or an address that is not loopback) where what answers does not speak
  TLS (`tls_to_plaintext`: a run whose JoinConfig address is loopback serves plaintext);
- EXIT_UNREACHABLE (4): HOST did not resolve or PORT did not answer within `timeout_s`;
- 1: the coordinator went away mid-run (its lease broke), as for any agent;
- EXIT_SIGNALLED (143): SIGTERM, SIGINT or SIGHUP stopped it (its workers first).
"""

from __future__ import annotations

import logging
import signal
import socket
import ssl
import sys
import time
from typing import Callable, Optional

from minitrain import procs
from minitrain.agent.agent import NodeAgent, install_signal_handlers
from minitrain.rpc import limits, tls

logger = logging.getLogger("minitrain")

EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4
EXIT_SIGNALLED = 128 + signal.SIGTERM  # 143: what Kubernetes' restartPolicy ExitCode retries
EXIT_PREEMPTED = EXIT_SIGNALLED  # the driver's code for a resumable preemption (minitrain.launch.cli)
RETRY_FIRST_S = 0.2  # the first pause between tries; doubled up to RETRY_MAX_S
RETRY_MAX_S = 1.0  # a recreated master is found within a second of listening; one SYN a second is cheap
CONNECT_TIMEOUT_S = 3.0  # one TCP connect try


def wait_for_coordinator(host: str, port: int, timeout_s: float, *,
                         connect: Callable[[str, int, float], None] = None,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep) -> Optional[str]:
    """Retry resolving `host` and connecting to `port` until one connection succeeds (None) or
    `timeout_s` passed (the last error, as text); `Refused` from `connect` ends it at once. Pauses grow from RETRY_FIRST_S to RETRY_MAX_S, so a
    coordinator that appears is found within about RETRY_MAX_S. `connect(host, port, timeout)` opens and
    closes one connection or raises OSError (socket.gaierror for a name that does not resolve)."""
    connect = connect or _connect_once
    deadline = clock() + timeout_s
    pause, last = RETRY_FIRST_S, "no try was made"
    tries = 0
    while True:
        tries += 1
        try:
            connect(host, port, CONNECT_TIMEOUT_S)
            if tries > 1:
                logger.info("reached the coordinator at %s:%d after %d tries", host, port, tries)
            return None
        except socket.gaierror as error:
            last = f"the name {host!r} does not resolve ({error.strerror or error})"
        except OSError as error:
            last = f"nothing answers at {host}:{port} ({error.strerror or error})"
        left = deadline - clock()
        if left <= 0:
            return f"{last}; tried {tries} times in {timeout_s:g} s"
        sleep(min(pause, left))
        pause = min(pause * 2, RETRY_MAX_S)


class Refused(Exception):
    """The coordinator (or whatever answers at its address) cannot be this run's: retrying cannot help."""


def _connect_once(host: str, port: int, timeout_s: float, cert_pem: bytes = b"") -> None:
    """One TCP connection, and with `cert_pem` one TLS handshake trusting only it: a coordinator whose
    certificate is not the one derived from this joiner's token has another token (Refused)."""
    with socket.create_connection((host, port), timeout=timeout_s) as connection:
        if not cert_pem:
            return
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and the host name checked
        context.load_verify_locations(cadata=cert_pem.decode("ascii"))
        context.set_alpn_protocols(["h2"])  # as gRPC's client: its server expects HTTP/2
        try:
            with context.wrap_socket(connection, server_hostname=host):
                pass
        except ssl.SSLCertVerificationError as error:
            raise Refused(f"the coordinator at {host}:{port} does not present the certificate derived from this "
                          f"agent's run token ({error.verify_message}): the token differs from the run's (the "
                          f"joiner and the run must share the same Secret), or something else listens there") \
                from None
        except ssl.SSLError as error:  # the TCP connection worked, the TLS handshake did not: no TLS there
            raise Refused(tls_to_plaintext(f"{host}:{port}", error)) from None


def speaks_tls(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """True when whatever listens at `host`:`port` completes a TLS handshake; False when it does not (a
    plaintext gRPC server closes on the hello), or nothing answers within `timeout_s`. It only asks
    whether the peer speaks TLS: no certificate is checked, as nothing is sent once the handshake is done."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])  # as gRPC's client: its server expects HTTP/2
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection, \
                context.wrap_socket(connection):
            return True
    except OSError:  # ssl.SSLError, a reset, a timeout: not a TLS server (or none at all)
        return False


def plaintext_to_tls(address: str) -> str:
    """What to tell a joiner that dialled `address`, a loopback address (so plaintext, `tls.uses_tls`),
    where the coordinator serves TLS: which mismatch it is and how to fix it."""
    return (f"the coordinator at {address} serves TLS, but this joiner dials a loopback address, which minitrain "
            f"reaches in plaintext: the run serves TLS because its JoinConfig's address is not loopback. Dial "
            f"that address (on Kubernetes, MASTER_ADDR or PET_MASTER_ADDR as pod 0 has it), not a loopback "
            f"address or a port forwarded to one: the run's certificate is derived from the token and that "
            f"host, and the joiner derives the same one only from the same host")


def tls_to_plaintext(address: str, error: BaseException) -> str:
    """What to tell a joiner that dialled `address` over TLS (not a loopback address, `tls.uses_tls`: a
    host name counts as crossing the network even when it resolves to this machine) where whatever
    answers does not speak TLS (`error`, its handshake's failure): which mismatch it is and how to fix it."""
    return (f"the coordinator at {address} does not speak TLS (the handshake failed: {error}), but this joiner "
            f"dials it over TLS because {address.rpartition(':')[0]!r} is not a loopback address: a run whose "
            f"JoinConfig address is loopback serves plaintext on loopback only. Dial the address the run's "
            f"JoinConfig names (on Kubernetes, MASTER_ADDR or PET_MASTER_ADDR as pod 0 has it), or give the run a "
            f"JoinConfig address its joiners reach over the network")


def refusal(end_reason: str) -> Optional[str]:
    """What to tell the joiner's user when the coordinator refused it (from its stream's end
    reason), or None when it was not a refusal."""
    if "UNAUTHENTICATED" in end_reason:
        return ("the coordinator refused this agent's run token (wrong token: the joiner and the run must "
                "share the same Secret)")
    if "FAILED_PRECONDITION" in end_reason:
        details = end_reason.split("FAILED_PRECONDITION", 1)[1].strip()
        if details.startswith("(") and details.endswith(")"):
            details = details[1:-1]
        return f"the coordinator refused this agent: {details}"
    return None


def join(address: str, node_id: str, run_id: str, token: str, timeout_s: float) -> int:
    """Join the run at `address` as `node_id`; returns the exit code (see the module docstring)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    procs.die_with_parent(signal.SIGTERM)
    limits.raise_fd_limit()
    cert = tls.join_identity(token, host).cert_pem if tls.uses_tls(host) else b""
    try:
        unreachable = wait_for_coordinator(host, int(port), timeout_s,
                                           connect=lambda h, p, t: _connect_once(h, p, t, cert))
    except Refused as refused:
        print(f"minitrain.launch --join: {refused}", file=sys.stderr)
        return EXIT_REFUSED
    if unreachable is not None:
        print(f"minitrain.launch --join: no coordinator at {address}: {unreachable}. Check the address, "
              f"and that the driver runs (MINITRAIN_JOIN_TIMEOUT_S sets how long to wait).", file=sys.stderr)
        return EXIT_UNREACHABLE
    agent = NodeAgent(address, node_id, run_id, token, tls_cert=cert)
    install_signal_handlers(agent)
    code = agent.run()
    if code == 0 and agent.preempted:
        print("minitrain.launch --join: the run was preempted; it resumes from its agreed checkpoint when the "
              "job runs again", file=sys.stderr)
        return EXIT_PREEMPTED
    if code == 0:
        return 0
    if agent.signalled is not None:  # SIGTERM from Kubernetes: its workers are stopped; retryable, as 128+N
        print(f"minitrain.launch --join: {agent.signalled}; this node's workers were stopped", file=sys.stderr)
        return EXIT_SIGNALLED
    why = refusal(agent.end_reason)
    if why is None and not cert and speaks_tls(host, int(port)):
        # A plaintext agent's calls to a TLS server fail at the handshake, which its stream sees only as
        # a lease that lapsed: asked after the fact, so a join that works costs no extra connection.
        why = plaintext_to_tls(address)
    if why is not None:
        print(f"minitrain.launch --join: {why}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"minitrain.launch --join: the run's coordinator at {address} went away ({agent.end_reason})",
          file=sys.stderr)
    return code
