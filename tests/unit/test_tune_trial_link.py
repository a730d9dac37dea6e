"""The one seam between minitrain.tune and TorchTrainer.fit() (minitrain._session.TrialLink): a trial
process links its TrialSession; fit() asks `current_trial()` for one forwarding observer per run and
never imports minitrain.tune when the process runs no trial."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest

from minitrain import _session
from minitrain.config import ScalingConfig
from minitrain.dashboard import __main__ as dashboard_cli
from minitrain.dashboard import sweep as dashboard_sweep
from minitrain.driver import trainer as trainer_module
from minitrain.driver.trainer import TorchTrainer
from minitrain.storage import sweep_state
from minitrain.tune.session import ForwardingObserver, TrialSession, TuneContext


@pytest.fixture
def linked():
    context = TuneContext("t_0", "t0", "/tmp/t0", "exp", "/tmp/exp", {"CPU": 1})
    session = TrialSession(context, io.StringIO(), io.StringIO(), None, 0)
    _session.link_trial(session)
    try:
        yield session
    finally:
        _session.link_trial(None)


def _trainer() -> TorchTrainer:
    trainer = TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1))
    trainer._monitor, trainer._console_status = "monitor", "console status"  # what fit() sets before asking
    return trainer


def test_outside_a_trial_fit_gets_no_forwarding_observer():
    assert _session.current_trial() is None
    assert _trainer()._run_observers(None, None) == ["monitor", "console status"]


def test_in_a_trial_each_fit_gets_a_new_forwarding_observer_after_the_console_status(linked):
    assert _session.current_trial() is linked
    first, second = _trainer()._run_observers(None, None), _trainer()._run_observers(None, None)
    assert first[:2] == ["monitor", "console status"] and len(first) == 3
    assert isinstance(first[2], ForwardingObserver) and first[2]._session is linked
    assert first[2] is not second[2]


@pytest.mark.parametrize("module", [trainer_module, _session, dashboard_cli, dashboard_sweep, sweep_state],
                         ids=lambda m: m.__name__)
def test_what_lies_below_tune_never_imports_it(module):
    """fit() and its seam; the dashboard, whose CLI serves a sweep from the state file; that file's module."""
    imported = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.update([node.module] + [f"{node.module}.{alias.name}" for alias in node.names])
    assert not [name for name in imported if name.startswith("minitrain.tune")]


def test_a_tune_report_callback_adds_rays_checkpoint_path_to_the_forwarded_metrics(linked):
    """Ray's TuneReportCallback: rank 0's metrics, plus `checkpoint_path` when the round committed one."""
    from types import SimpleNamespace

    from minitrain.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback

    sent = []
    linked.report = lambda metrics, checkpoint: sent.append((metrics, checkpoint))
    run = SimpleNamespace(run_path="file:///runs/r")
    for callbacks, key in (([TuneReportCallback()], True), ((), False)):
        observer = linked.run_observer(callbacks)
        observer.on_run_start(run)
        observer.on_round(SimpleNamespace(metrics_by_rank=[{"loss": 1.0}, {"loss": 2.0}],
                                          checkpoint=SimpleNamespace(dir_name="checkpoint_000000")))
        observer.on_round(SimpleNamespace(metrics_by_rank=[{"loss": 0.5}], checkpoint=None))
        path = "/runs/r/checkpoint_000000"
        first = {"loss": 1.0, CHECKPOINT_PATH_KEY: path} if key else {"loss": 1.0}
        assert sent == [(first, path), ({"loss": 0.5}, None)]
        sent.clear()
    # every fit() in a trial is forwarded: the callback's own hook adds nothing (each round reaches the trial once)
    assert TuneReportCallback().after_report(None, [{"loss": 1.0}], None) is None
