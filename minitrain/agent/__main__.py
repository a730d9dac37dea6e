"""`python -m minitrain.agent --coordinator HOST:PORT --node-id ID --run-id RUN [--local-stream local:PATH]`.

The run token is read from the first line of stdin (never from argv or the environment), and the
rest of stdin, up to its end, is the run's TLS certificate in PEM (empty for a loopback coordinator):
the agent and its workers trust that certificate only. The agent raises its file-descriptor limit to
the hard limit and dies with its parent (SIGTERM, handled: workers are stopped first). `--local-stream`
(given by the launcher to an agent it starts on the coordinator's machine) opens the agent's stream on the
coordinator's local socket instead of over gRPC; HOST:PORT still says which route the node's address is on,
and is what workers dial for a direct stream.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from minitrain import procs
from minitrain.agent.agent import NodeAgent, default_node_id, install_signal_handlers
from minitrain.rpc import limits, local_stream, tls


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, read the token, run the agent; returns its exit code."""
    parser = argparse.ArgumentParser(prog="python -m minitrain.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", required=True, help="host:port of the run's coordinator")
    parser.add_argument("--node-id", default=default_node_id(), help="this node's id in the run")
    parser.add_argument("--run-id", required=True, help="the run this agent serves")
    parser.add_argument("--local-stream", default="",
                        help="local:PATH, the coordinator's socket on this machine: the agent's stream goes there")
    parser.add_argument("--log-level", default="WARNING")
    options = parser.parse_args(argv)
    if options.local_stream and not local_stream.is_local(options.local_stream):
        parser.error(f"--local-stream {options.local_stream!r} is not local:<socket path>; give the coordinator's "
                     "local socket as the launcher printed it, or leave it out to use gRPC")
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
    agent = NodeAgent(options.coordinator, options.node_id, options.run_id, token, tls_cert=tls_cert,
                      local_stream=options.local_stream)
    install_signal_handlers(agent)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
