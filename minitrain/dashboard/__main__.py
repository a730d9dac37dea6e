"""`python -m minitrain.dashboard RUN_PATH [--port P] [--host H]`: the dashboard of a run, from storage.

RUN_PATH is the run directory `<storage_path>/<name>` (a local path or an fsspec URL). The page
shows what the run wrote there (events.jsonl, telemetry.jsonl, metrics.jsonl, the checkpoint index)
as the run monitor rebuilds it; nothing is written. A sweep's directory (a minitrain.tune experiment,
holding tuner_state.json) is shown as its trial table (minitrain.dashboard.sweep); each trial's own
directory is a run directory again. Serves until Ctrl-C. Exits 2 with a message when
RUN_PATH holds no run or the address is refused.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Optional, Sequence

from minitrain.dashboard import serve
from minitrain.dashboard.settings import DashboardAddress, parse_address
from minitrain.dashboard.sweep import is_sweep_dir, sweep_routes
from minitrain.errors import ConfigError
from minitrain.monitoring.monitor import RunMonitor
from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import EVENTS_NAME, INDEX_NAME, METRICS_NAME


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minitrain.dashboard",
                                     description="Serve the dashboard of a run from its run directory.")
    parser.add_argument("run_path", metavar="RUN_PATH",
                        help="the run directory, <storage_path>/<name> (or a sweep's directory)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other address needs the viewer "
                             "token printed in the URL)")
    return parser


def run_storage(run_path: str) -> Storage:
    """The run directory at `run_path`; ConfigError when it holds nothing a run writes."""
    parent, _, name = run_path.rstrip("/").rpartition("/")
    try:
        storage = Storage.for_run(parent or ".", name)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"RUN_PATH={run_path!r} cannot be opened: {exc}") from None
    if not any(storage.exists(marker) for marker in (EVENTS_NAME, METRICS_NAME, INDEX_NAME)):
        raise ConfigError(f"RUN_PATH={run_path!r} holds no minitrain run (no {EVENTS_NAME}, {METRICS_NAME} or "
                          f"{INDEX_NAME}). Give the run directory: <storage_path>/<name>.")
    return storage


def main(argv: Optional[Sequence[str]] = None, stop: Optional[threading.Event] = None) -> int:
    """Serve until Ctrl-C (or until `stop` is set, for tests); the exit status."""
    args = _parser().parse_args(argv)
    try:
        address = parse_address(f"[{args.host}]" if ":" in args.host else args.host, source="--host")
        if address is None or not 0 <= args.port <= 65535:
            raise ConfigError(f"--host {args.host!r} --port {args.port}: give an address to listen on and a "
                              "port from 0 to 65535 (0: any free port).")
        address = DashboardAddress(address.host, args.port)
        if is_sweep_dir(args.run_path):
            server = serve(None, address, live=False, source="--host/--port",
                           routes=sweep_routes(args.run_path, live=False))
        else:
            server = serve(RunMonitor.from_run_dir(run_storage(args.run_path)), address, live=False,
                           source="--host/--port")
    except ConfigError as exc:
        print(f"minitrain.dashboard: {exc}", file=sys.stderr)
        return 2
    print(f"minitrain dashboard of {args.run_path}: {server.url}  (Ctrl-C stops it)", flush=True)
    try:
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
