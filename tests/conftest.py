"""Shared pytest fixtures.

``s3``: a real S3-compatible HTTP server (moto's ThreadedMotoServer on 127.0.0.1, see tests/s3server.py)
with a fresh, uniquely named bucket per test. One server per test module (per xdist worker); buckets
are unique so tests never see each other's keys. Skipped when s3fs or moto[server] is missing.

``_private_key_dir`` (automatic): MINITRAIN_KEY_DIR for the whole session, so no test makes a key in the home
directory.

``_private_ledger_dir`` (automatic): MINITRAIN_LEDGER_DIR for the whole session, so the runs of the tests
claim resources in a ledger of their own, never in the host's /var/tmp one (which other users' runs share),
and wait at most 300 s for what other runs hold there (MINITRAIN_RESOURCE_WAIT_S).

``_private_temp_dir`` (automatic): TMPDIR for the whole session, so what the tests' processes put in the
temporary directory (`Checkpoint.from_dict`'s directories, torch's and gloo's files, a killed worker's
scratch) is left under pytest's own base directory, never in /tmp.

``_private_memory_tier_dir`` (automatic): MINITRAIN_MEMORY_TIER_DIR for the whole session, so the node
agents' memory tiers (and what a killed agent leaves there) are made under pytest's base directory, never
in the host's /dev/shm.

``relay``: a started agent relay for the modules that test worker streams through it (each module gives
its ``TOKEN`` and an ``upward`` fixture that receives the relayed items).

The soak tier: tests marked ``soak`` (the fault matrix and properties, real wall-clock straggles, the
benchmark smoke runs) are deselected unless the ``-m`` expression names the marker (``-m soak``, which
``bash scripts/test.sh --soak`` passes), so that the default run keeps its time budget
(docs/development.md).
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # the default "prepend" import mode already does this; importlib doesn't
    sys.path.insert(0, _TESTS_DIR)


def pytest_collection_modifyitems(config, items):
    """Deselect the soak tier's tests unless the -m expression names the marker (`-m soak`, `-m "soak or
    not soak"`): the default run, and any -m that does not mention it, leaves them out."""
    if "soak" in (config.option.markexpr or ""):
        return
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


@contextmanager
def _session_env(name: str, value: str):
    """Set the environment variable `name` to `value` for the test session (subprocesses inherit it), then
    put back what was there."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@pytest.fixture(scope="session", autouse=True)
def _private_key_dir(tmp_path_factory):
    """Sweeps seal what they store for Tuner.restore with the user's key (minitrain.storage.user_key): the
    tests' key lives in a session temp directory, never in the home directory (subprocesses inherit it)."""
    path = tmp_path_factory.mktemp("minitrain_keys")
    path.chmod(0o700)
    with _session_env("MINITRAIN_KEY_DIR", str(path)):
        yield path


@pytest.fixture(scope="session", autouse=True)
def _private_ledger_dir(tmp_path_factory):
    """Runs claim what they hold in their host's resource ledger (minitrain.hosts.ledger): the tests' runs
    use a session temp directory (subprocesses inherit it), so a GPU machine's real ledger is left alone
    and nothing stays behind. Tests of the ledger itself set their own."""
    path = tmp_path_factory.mktemp("minitrain_ledger")
    # A run waits for what others hold as long as it takes by default: in the tests, a claim left held
    # by mistake must fail the next run (naming the holder) instead of hanging the session.
    with _session_env("MINITRAIN_LEDGER_DIR", str(path)), _session_env("MINITRAIN_RESOURCE_WAIT_S", "300"):
        yield path


@pytest.fixture(scope="session", autouse=True)
def _private_memory_tier_dir(tmp_path_factory):
    """The agents of the session's runs make their memory tiers in a session temp directory."""
    path = tmp_path_factory.mktemp("memory_tiers")
    with _session_env("MINITRAIN_MEMORY_TIER_DIR", str(path)):
        yield path


@pytest.fixture(scope="session", autouse=True)
def _private_temp_dir(tmp_path_factory):
    """Everything the session's processes make with `tempfile` lands in a session temp directory that
    pytest removes with its old base directories; subprocesses inherit TMPDIR. `tempfile` caches the
    directory it found first, so the cache is reset both ways."""
    path = tmp_path_factory.mktemp("tmp")
    with _session_env("TMPDIR", str(path)):
        tempfile.tempdir = None
        try:
            yield path
        finally:
            tempfile.tempdir = None


@pytest.fixture
def relay(request, upward):
    """A started agent relay (minitrain.agent.transport.relay.RelayServer) that takes the test module's `TOKEN` and
    hands every relayed item to the module's `upward` fixture's `send_up`; stopped after the test."""
    from minitrain.agent.transport.relay import RelayServer

    server = RelayServer(request.module.TOKEN, upward.send_up).start()
    yield server
    server.stop()


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


# ---------------------------------------------------------------------------------- hypothesis profiles
# Registered here, loaded nowhere. The fault-injection properties (tests/faults, in the soak tier) apply
# "faults-ci" unless `--hypothesis-profile=NAME` or the environment variable MINITRAIN_FAULTS_PROFILE names
# another. Every example there is a real fit() (15-25 s with its faults on a 2-core machine), so
# "faults-ci" keeps few examples and skips shrinking: 8 per property, about 100 s each on 2 cores (each
# run draws new schedules, so the runs together still cover the space); a failure prints its
# reproduction blob (`@reproduce_failure(...)`). "soak" runs hundreds and shrinks: the release soak.
# Not named "ci": hypothesis ships a "ci" profile that it loads by itself when a CI environment
# variable is set, and re-registering that name would cut every other property test to 12 examples.
from hypothesis import HealthCheck as _HealthCheck  # noqa: E402
from hypothesis import Phase as _Phase  # noqa: E402
from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile(
    "faults-ci", max_examples=8, deadline=None, print_blob=True, database=None,
    phases=[_Phase.explicit, _Phase.reuse, _Phase.generate],
    suppress_health_check=[_HealthCheck.too_slow])
_settings.register_profile(
    "soak", max_examples=500, deadline=None, print_blob=True,
    suppress_health_check=[_HealthCheck.too_slow])


# ---------------------------------------------------------------------------------- fake multi-host cluster
@pytest.fixture
def netns_cluster(request, tmp_path):
    """A running fake cluster (tests/cluster.py; scripts/netns_cluster.py): hosts h0.. in their own network
    namespaces with their own IP and sshd. 2 hosts, or `@pytest.mark.parametrize("netns_cluster", [3],
    indirect=True)`. Skips when not root, without `ip netns`, or without sshd; always torn down."""
    from cluster import fixture_body

    yield from fixture_body(request, tmp_path)


# ---------------------------------------------------------------------------------- a real Slurm cluster
@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running Slurm cluster (tests/slurm_cluster.py): munged, slurmctld and two slurmd, each node a
    network namespace named by its address. One per session (per xdist worker); installs Debian's Slurm
    packages when missing, skips with the reason where it cannot run; always torn down."""
    from slurm_cluster import session_cluster

    yield from session_cluster(tmp_path_factory)
