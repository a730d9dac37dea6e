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
from typing import Iterator, Optional

from minitrain.config import env_var
from minitrain.dashboard.api import RunView
from minitrain.dashboard.server import DashboardServer, StackDumper
from minitrain.dashboard.settings import ENV_VAR, DashboardAddress, parse_address
from minitrain.errors import ConfigError

logger = logging.getLogger("minitrain")

__all__ = ["DashboardServer", "live_dashboard", "serve", "dashboard_address"]


def dashboard_address() -> Optional[DashboardAddress]:
    """Where `MINITRAIN_DASHBOARD` asks the live dashboard to listen; None when it is turned off.
    Raises ConfigError for a value that names no address."""
    return parse_address(env_var(ENV_VAR))


def serve(view: RunView, address: DashboardAddress, live: bool, dump_stacks: Optional[StackDumper] = None,
          source: str = ENV_VAR) -> DashboardServer:
    """A started server for `view` at `address`; ConfigError naming `source` when it cannot bind."""
    try:
        return DashboardServer(view, address, live=live, dump_stacks=dump_stacks).start()
    except OSError as exc:
        raise ConfigError(f"{source}: the dashboard cannot listen on {address.host}:{address.port} ({exc}). "
                          f"Choose a free port, 0 for any port, or turn the dashboard off with "
                          f"{ENV_VAR}=0.") from None


@contextlib.contextmanager
def live_dashboard(view: RunView, dump_stacks: Optional[StackDumper] = None) -> Iterator[Optional[DashboardServer]]:
    """Serve `view` while the block runs (as `MINITRAIN_DASHBOARD` says) and stop it, its threads and
    its port, when the block ends however it ends. Yields the server, or None when turned off."""
    address = dashboard_address()
    if address is None:
        yield None
        return
    server = serve(view, address, live=True, dump_stacks=dump_stacks)
    try:
        logger.info("dashboard: %s (%s=0 turns it off)", server.url, ENV_VAR)
        yield server
    finally:
        server.stop()
