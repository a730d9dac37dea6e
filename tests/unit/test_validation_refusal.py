"""Ray's asynchronous checkpoint validation (`TorchTrainer(validation_config=ValidationConfig(fn=...))`,
`report(..., validation=True | ValidationTaskConfig(...))`) is refused where it is set, naming the
argument and the fix (docs/porting.md, "Not supported"); Ray's default `validation=False` reports as
usual. In process: a fake client stands in for the coordinator."""

from __future__ import annotations

import pytest

from minitrain import ConfigError, ScalingConfig
from minitrain.context import TrainContext
from minitrain.storage.filesystem import Storage
from minitrain.torch import TorchTrainer
from minitrain.worker.session import WorkerSession
from test_worker_session import FakeClient


@pytest.fixture
def session(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    return WorkerSession(FakeClient(), TrainContext(experiment_name="run"), storage)


@pytest.mark.parametrize("validation", [True, {"fn_kwargs": {}}, object()])
def test_report_with_validation_raises_naming_it_and_the_fix(session, validation):
    with pytest.raises(ValueError, match=r"report\(validation=.*checkpoint_score_attribute"):
        session.report({"loss": 1.0}, validation=validation)
    assert session.rounds_reported == 0


def test_ray_s_default_reports_as_usual(session):
    session.report({"loss": 1.0}, validation=False)
    assert session.rounds_reported == 1


def test_a_trainer_s_validation_config_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="validation_config"):
        TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1), validation_config=object())
