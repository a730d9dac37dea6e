"""minitrain's web dashboard and Prometheus endpoint for one run.

Live: `TorchTrainer.fit()` serves its run monitor with `live_dashboard(...)` while it runs, at the
address `MINITRAIN_DASHBOARD` names (default: 127.0.0.1, a free port; "0" turns it off; see
`settings`), and logs the page's URL once. Post hoc: `python -m minitrain.dashboard RUN_PATH`
serves a finished run from its run directory. Pages, JSON views, `/metrics` and the access rules are
in `server`, `pages`, `api`, `prometheus` and `auth`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator, Optional

from minitrain import knobs
from minitrain.dashboard.api import RunView
from minitrain.dashboard.server import DashboardServer, Route, StackDumper
from minitrain.dashboard.settings import ENV_VAR, DashboardAddress, parse_address
from minitrain.errors import ConfigError

logger = logging.getLogger("minitrain")

__all__ = ["DashboardServer", "live_dashboard", "serve", "dashboard_address"]


def dashboard_address() -> Optional[DashboardAddress]:
    """Where `MINITRAIN_DASHBOARD` asks the live dashboard to listen; None when it is turned off.
    Raises ConfigError for a value that names no address."""
    return parse_address(knobs.DASHBOARD.get())


def serve(view: Optional[RunView], address: DashboardAddress, live: bool, dump_stacks: Optional[StackDumper] = None,
          source: str = ENV_VAR, routes: Optional[dict[str, Route]] = None) -> DashboardServer:
    """A started server for `view` (and the extra GET `routes`, see server) at `address`; ConfigError
    naming `source` when it cannot bind."""
    try:
        return DashboardServer(view, address, live=live, dump_stacks=dump_stacks, routes=routes).start()
    except OSError as exc:
        raise ConfigError(f"{source}: the dashboard cannot listen on {address.host}:{address.port} ({exc}). "
                          f"Choose a free port, 0 for any port, or turn the dashboard off with "
                          f"{ENV_VAR}=0.") from None


# The fixed addresses (MINITRAIN_DASHBOARD=HOST:PORT) that a live dashboard of this process holds now.
_fixed_in_use: set = set()
_fixed_lock = threading.Lock()


@contextlib.contextmanager
def live_dashboard(view: Optional[RunView], dump_stacks: Optional[StackDumper] = None,
                   routes: Optional[dict[str, Route]] = None, what: str = "dashboard"
                   ) -> Iterator[Optional[DashboardServer]]:
    """Serve `view` while the block runs (as `MINITRAIN_DASHBOARD` says) and stop it, its threads and
    its port, when the block ends however it ends. Yields the server, or None when turned off.
    `routes` are extra GET routes (see server; `view` may then be None); `what` names the page in the
    log line with its URL.

    Several runs at once in this process (fit()s on several threads) each get their own server: the
    first takes a fixed port that MINITRAIN_DASHBOARD names, a run that starts while it holds it
    listens on a free port of the same host instead and logs that URL with a warning. A fixed port
    held by another process is a ConfigError, as before."""
    address = dashboard_address()
    if address is None:
        yield None
        return
    fixed = address.port != 0
    with _fixed_lock:
        taken_here = fixed and address in _fixed_in_use
        if fixed and not taken_here:
            _fixed_in_use.add(address)
    try:
        if taken_here:
            server = serve(view, DashboardAddress(address.host, 0), live=True, dump_stacks=dump_stacks,
                           routes=routes)
            logger.warning("%s: %s (%s names port %d, which another run of this process serves "
                           "now; this run's dashboard took a free port)", what, server.url, ENV_VAR, address.port)
        else:
            server = serve(view, address, live=True, dump_stacks=dump_stacks, routes=routes)
            logger.info("%s: %s (%s=0 turns it off)", what, server.url, ENV_VAR)
        try:
            yield server
        finally:
            server.stop()
    finally:
        if fixed and not taken_here:
            with _fixed_lock:
                _fixed_in_use.discard(address)
