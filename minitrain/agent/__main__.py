"""`python -m minitrain.agent --coordinator HOST:PORT --node-id ID --run-id RUN`.

The run token is read from the first line of stdin (never from argv or the environment), and the
rest of stdin, up to its end, is the run's TLS certificate in PEM (empty for a loopback coordinator):
the agent and its workers trust that certificate only. The agent raises its file-descriptor limit to
the hard limit and dies with its parent (SIGTERM, handled: workers are stopped first).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from minitrain import procs
from minitrain.agent.agent import NodeAgent, default_node_id, install_signal_handlers
from minitrain.rpc import limits, tls


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, read the token, run the agent; returns its exit code."""
    parser = argparse.ArgumentParser(prog="python -m minitrain.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", required=True, help="host:port of the run's coordinator")
    parser.add_argument("--node-id", default=default_node_id(), help="this node's id in the run")
    parser.add_argument("--run-id", required=True, help="the run this agent serves")
    parser.add_argument("--log-level", default="WARNING")
    options = parser.parse_args(argv)
    logging.basicConfig(level=options.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    procs.die_with_parent(signal.SIGTERM)
    limits.raise_fd_limit()
    stdin = sys.stdin.buffer
    token = stdin.readline().decode("ascii", "replace").strip()
    if not token:
        print("minitrain.agent: expected the run token on the first line of stdin", file=sys.stderr)
        return 2
    tls_cert = stdin.read()  # the launcher closes stdin after the certificate
    try:
        tls.require_cert(options.coordinator, tls_cert)
    except ValueError as exc:
        print(f"minitrain.agent: {exc}", file=sys.stderr)
        return 2
    agent = NodeAgent(options.coordinator, options.node_id, options.run_id, token, tls_cert=tls_cert)
    install_signal_handlers(agent)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
