"""Fixtures shared by the end-to-end tests."""

import pytest

from chromium_support import Chromium, chromium_binary


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """A headless Chromium for the session (skips when chromium is not installed)."""
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium is not installed (scripts/install_system_deps.sh installs it)")
    return Chromium(binary, str(tmp_path_factory.mktemp("chromium-profile")))
