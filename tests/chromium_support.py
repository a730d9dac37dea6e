"""A real headless Chromium (Debian `chromium`) for the dashboard's end-to-end tests; the session-scoped
`chromium` fixture (tests/e2e/conftest.py) skips, saying why, where it is not installed."""

from __future__ import annotations

import shutil
import subprocess
from typing import Optional

DEADLINE_S = 120.0  # generous: the machine is shared


class Chromium:
    """One headless Chromium profile for the session; each call renders one page and exits."""

    def __init__(self, binary: str, profile: str):
        self.binary, self.profile = binary, profile

    def _run(self, url: str, *flags: str) -> subprocess.CompletedProcess:
        # --virtual-time-budget lets the page's script (and its first fetches) run before the dump.
        command = [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   f"--user-data-dir={self.profile}", "--window-size=1280,1500",
                   "--virtual-time-budget=4000", *flags, url]
        return subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE_S, check=True)

    def dom(self, url: str) -> str:
        """The DOM after the page's scripts ran, serialized."""
        return self._run(url, "--dump-dom").stdout

    def screenshot(self, url: str, path: str) -> None:
        """A PNG of the rendered page at `path`."""
        self._run(url, f"--screenshot={path}")


def chromium_binary() -> Optional[str]:
    """The Chromium on PATH, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")
