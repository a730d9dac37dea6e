"""Shared pytest fixtures.

``s3``: a real S3-compatible HTTP server (moto's ThreadedMotoServer on 127.0.0.1, see tests/s3server.py)
with a fresh, uniquely named bucket per test. One server per test module (per xdist worker); buckets
are unique so tests never see each other's keys. Skipped when s3fs or moto[server] is missing.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # the default "prepend" import mode already does this; importlib doesn't
    sys.path.insert(0, _TESTS_DIR)


@pytest.fixture(scope="module")
def _s3_server():
    from s3server import s3_server, skip_unless_available

    skip_unless_available()

    with s3_server() as server:
        yield server


@pytest.fixture
def s3(_s3_server):
    """The running server (endpoint_url, access_key, secret_key, region, filesystem(), storage_options(),
    make_bucket()) with ``.bucket`` set to a new empty bucket that only this test uses."""
    bucket = _s3_server.make_bucket(f"mt-{uuid.uuid4().hex[:16]}")
    yield _s3_server.with_bucket(bucket)
    try:  # free moto's in-memory objects; moto state lives as long as the worker process
        _s3_server.remove_bucket(bucket)
    except Exception:
        pass
