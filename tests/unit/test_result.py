"""minitrain.Result: Ray's constructor, get_best_checkpoint, from_path, and the lazy metrics_dataframe."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from minitrain.checkpoint import Checkpoint
from minitrain.result import Result


def _ckpt(tmp_path: Path, name: str) -> Checkpoint:
    (tmp_path / name).mkdir(exist_ok=True)
    return Checkpoint.from_directory(tmp_path / name)


# ------------------------------------------------------------------ construction


def test_keyword_construction_as_ray(tmp_path):
    ckpt = _ckpt(tmp_path, "c1")
    result = Result(metrics={"loss": 0.1}, checkpoint=ckpt, error=None, path=str(tmp_path),
                    metrics_dataframe=None, best_checkpoints=None, _storage_filesystem=None,
                    return_value=42)
    assert result.metrics == {"loss": 0.1} and result.checkpoint is ckpt and result.error is None
    assert result.path == str(tmp_path) and result.return_value == 42
    assert result.best_checkpoints == [] and result.metrics_dataframe is None
    assert result.filesystem is None
    minimal = Result(metrics=None, checkpoint=None, error=None, path=None)
    assert minimal.best_checkpoints == [] and minimal.return_value is None
    assert "metrics={'loss': 0.1}" in repr(result)


def test_a_given_dataframe_is_returned_as_is():
    marker = object()  # any object: the constructor does not need pandas
    result = Result(metrics=None, checkpoint=None, error=None, path=None, metrics_dataframe=marker,
                    _metrics_history=[{"a": 1}])
    assert result.metrics_dataframe is marker


def test_config_is_removed():
    with pytest.raises(DeprecationWarning):
        Result(metrics=None, checkpoint=None, error=None, path=None).config


# ------------------------------------------------------------------ get_best_checkpoint


@pytest.fixture
def ranked(tmp_path):
    c1, c2, c3, c4 = (_ckpt(tmp_path, f"c{i}") for i in range(1, 5))
    best = [(c1, {"loss": 0.5, "eval": {"acc": 0.7}}), (c2, {"loss": 0.2, "eval": {"acc": 0.6}}),
            (c3, {"loss": 0.9}), (c4, {"eval": {"acc": 0.9}})]
    result = Result(metrics={}, checkpoint=c4, error=None, path=str(tmp_path), best_checkpoints=best)
    return result, (c1, c2, c3, c4)


def test_best_checkpoint_max_and_min(ranked):
    result, (c1, c2, c3, c4) = ranked
    assert result.get_best_checkpoint("loss", "min") is c2
    assert result.get_best_checkpoint("loss", "max") is c3  # c4 has no loss: skipped


def test_best_checkpoint_nested_metric(ranked):
    result, (c1, c2, c3, c4) = ranked
    assert result.get_best_checkpoint("eval/acc", "max") is c4
    assert result.get_best_checkpoint("eval/acc", "min") is c2


def test_best_checkpoint_invalid_metric_lists_the_choices(ranked):
    result, _ = ranked
    with pytest.raises(RuntimeError, match=r"Invalid metric name 'acc'.*'eval/acc'.*'loss'"):
        result.get_best_checkpoint("acc", "max")


def test_best_checkpoint_bad_mode(ranked):
    result, _ = ranked
    with pytest.raises(ValueError, match="Unsupported mode"):
        result.get_best_checkpoint("loss", "maximum")


def test_best_checkpoint_without_checkpoints():
    result = Result(metrics={"loss": 1.0}, checkpoint=None, error=None, path=None)
    with pytest.raises(RuntimeError, match="No checkpoint exists"):
        result.get_best_checkpoint("loss", "min")


# ------------------------------------------------------------------ from_path


def _entry(name: str, metrics: dict, index: int) -> dict:
    return {"version": 0, "checkpoint_dir_name": name, "metrics": metrics, "report_index": index}


def _write_run(run: Path, *, retained: list, latest, history=None) -> Path:
    run.mkdir(parents=True)
    (run / ".validate_storage_marker").write_text("")
    for entry in retained + ([latest] if latest else []):
        (run / entry["checkpoint_dir_name"]).mkdir(exist_ok=True)
        (run / entry["checkpoint_dir_name"] / "model.txt").write_text(entry["checkpoint_dir_name"])
    snapshot = {"checkpoint_results": retained, "latest_checkpoint_result": latest,
                "current_report_index": len(history or []),
                "checkpoint_config": {"num_to_keep": 2, "checkpoint_score_attribute": "loss",
                                      "checkpoint_score_order": "min"}}
    (run / "checkpoint_manager_snapshot.json").write_text(json.dumps(snapshot))
    if history is not None:
        lines = [json.dumps({"metrics": m, "report_index": i, "attempt": 0, "time": 1000.0 + i})
                 for i, m in enumerate(history)]
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_from_path_reads_snapshot_and_history(tmp_path):
    a, b = _entry("checkpoint_000001", {"loss": 0.3, "epoch": 1}, 1), _entry("checkpoint_000002",
                                                                              {"loss": 0.2, "epoch": 2}, 2)
    history = [{"loss": 0.5, "epoch": 0}, {"loss": 0.3, "epoch": 1}, {"loss": 0.2, "epoch": 2},
               {"loss": 0.25, "epoch": 3}]
    run = _write_run(tmp_path / "exp" / "run", retained=[a, b], latest=b, history=history)
    result = Result.from_path(str(run))
    assert result.path == str(run) and result.error is None and result.return_value is None
    assert isinstance(result._storage_filesystem, LocalFileSystem)  # shown as pyarrow's: test_pyarrow_filesystems
    assert result.metrics == {"loss": 0.25, "epoch": 3}  # the last report, not the last checkpoint's
    assert [c.path for c, _ in result.best_checkpoints] == [str(run / "checkpoint_000001"),
                                                              str(run / "checkpoint_000002")]
    assert [m for _, m in result.best_checkpoints] == [a["metrics"], b["metrics"]]
    assert result.checkpoint is result.best_checkpoints[1][0]
    with result.checkpoint.as_directory() as d:
        assert (Path(d) / "model.txt").read_text() == "checkpoint_000002"
    assert result.get_best_checkpoint("loss", "min") is result.checkpoint
    assert result._metrics_history == history


def test_from_path_includes_a_latest_outside_the_retained(tmp_path):
    """Ray quirk 3: the latest checkpoint is listed even when it is not in the top K."""
    a = _entry("ckpt_a", {"loss": 0.1}, 1)
    latest = _entry("ckpt_latest", {"loss": 0.9}, 3)
    run = _write_run(tmp_path / "run", retained=[a], latest=latest)  # no metrics.jsonl
    result = Result.from_path(str(run))
    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == ["ckpt_a", "ckpt_latest"]
    assert result.checkpoint is result.best_checkpoints[-1][0]
    assert result.metrics == {"loss": 0.9}  # no history: the latest checkpoint's metrics
    assert result.metrics_dataframe is None


def test_from_path_with_an_empty_snapshot(tmp_path):
    run = _write_run(tmp_path / "run", retained=[], latest=None, history=[{"x": 1}])
    result = Result.from_path(str(run))
    assert result.checkpoint is None and result.best_checkpoints == [] and result.metrics == {"x": 1}


def test_from_path_ignores_a_torn_last_line(tmp_path):
    a = _entry("c", {"loss": 0.1}, 0)
    run = _write_run(tmp_path / "run", retained=[a], latest=a, history=[{"loss": 0.1}])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"metrics": {"loss": 0.')
    assert Result.from_path(str(run)).metrics == {"loss": 0.1}


def test_from_path_expands_home_and_accepts_urls(tmp_path, monkeypatch):
    a = _entry("c", {"loss": 0.1}, 0)
    run = _write_run(tmp_path / "home" / "run", retained=[a], latest=a)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Result.from_path("~/run").path == str(run)
    assert Result.from_path(f"file://{run}").path == str(run)
    assert Result.from_path(str(run), storage_filesystem=LocalFileSystem()).path == str(run)


def test_from_path_on_a_remote_filesystem():
    fs = fsspec.filesystem("memory")
    root = f"/minitrain-test-{uuid.uuid4().hex}/run"
    try:
        a = _entry("c1", {"loss": 0.4}, 1)
        fs.pipe_file(f"{root}/c1/model.txt", b"m")
        fs.pipe_file(f"{root}/checkpoint_manager_snapshot.json",
                     json.dumps({"checkpoint_results": [a], "latest_checkpoint_result": a}).encode())
        result = Result.from_path(f"memory://{root}")
        assert result.path == root and result._storage_filesystem is fs
        assert result.checkpoint.path == f"{root}/c1" and result.checkpoint._fs is fs
        with result.checkpoint.as_directory() as d:
            assert (Path(d) / "model.txt").read_bytes() == b"m"
        assert Result.from_path(root, storage_filesystem=fs).metrics == {"loss": 0.4}
    finally:
        fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_from_path_missing_folder(tmp_path):
    with pytest.raises(RuntimeError, match=r"Experiment folder .*nope doesn't exist\."):
        Result.from_path(str(tmp_path / "nope"))


def test_from_path_without_snapshot(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".validate_storage_marker").write_text("")
    with pytest.raises(RuntimeError, match="checkpoint_manager_snapshot.json doesn't exist"):
        Result.from_path(str(tmp_path / "run"))


def test_from_path_corrupt_files_name_the_file(tmp_path):
    run = _write_run(tmp_path / "run", retained=[], latest=None)
    (run / "checkpoint_manager_snapshot.json").write_text("{not json")
    with pytest.raises(ValueError, match="checkpoint_manager_snapshot.json is not valid JSON"):
        Result.from_path(str(run))
    (run / "checkpoint_manager_snapshot.json").write_text(json.dumps({"checkpoint_results": [{"x": 1}]}))
    with pytest.raises(ValueError, match="checkpoint_dir_name"):
        Result.from_path(str(run))


# ------------------------------------------------------------------ metrics_dataframe


def test_metrics_dataframe_with_pandas(tmp_path):
    pandas = pytest.importorskip("pandas", reason="pandas is an optional dependency")
    history = [{"loss": 0.5, "epoch": 0}, {"loss": 0.3, "epoch": 1, "eval": {"acc": 0.9}}]
    a = _entry("c", {"loss": 0.3}, 1)
    result = Result.from_path(str(_write_run(tmp_path / "run", retained=[a], latest=a, history=history)))
    df = result.metrics_dataframe
    assert isinstance(df, pandas.DataFrame)
    assert list(df["loss"]) == [0.5, 0.3] and list(df["epoch"]) == [0, 1]
    assert df["eval"].iloc[1] == {"acc": 0.9}  # nested dicts stay dict cells, as in Ray
    assert result.metrics_dataframe is df  # built once


def test_metrics_dataframe_without_pandas(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    with_history = Result(metrics=None, checkpoint=None, error=None, path=None,
                          _metrics_history=[{"loss": 1.0}])
    with pytest.raises(ImportError, match=r"Result.metrics_dataframe needs pandas: pip install pandas"):
        with_history.metrics_dataframe
    assert "metrics_dataframe" not in repr(with_history)  # repr and == never build it
    assert with_history == Result(metrics=None, checkpoint=None, error=None, path=None)
    without_history = Result(metrics=None, checkpoint=None, error=None, path=None)
    assert without_history.metrics_dataframe is None
    assert Result(metrics=None, checkpoint=None, error=None, path=None, _metrics_history=[]).metrics_dataframe \
        is None
