"""What `Tuner.restore(path, trainable)` needs beyond the state file, stored once when a sweep starts (L3).

Ray pickles the Tuner (param space, TuneConfig with its searcher and scheduler, RunConfig) into the
experiment directory and unpickles it on restore. minitrain unpickles nothing unauthenticated, so
`.tune/sweep_spec.json` (minitrain.storage.sweep_state.SPEC_FILE) holds:

- `param_space` as JSON when it is plain values, lists, dicts, `grid_search` and the sampling domains
  (`tune.uniform` & co., written as `{"__minitrain_domain__": {...}}`): read back without any pickle, on any
  machine;
- `basic_tune_config`: the TuneConfig as JSON when it uses only the default searcher (BasicVariantGenerator,
  JSON points) and the FIFO scheduler and no name creators, else null; `basic_run_config`: the RunConfig as
  JSON when its `stop` is None or a dict and the rest plain values, else null (these restore on any machine);
- `sealed`: cloudpickles of the param space (only when it is not JSON: `sample_from` functions, classes,
  other objects), the TuneConfig and the RunConfig, each sealed with the user's key
  (minitrain.storage.user_key) and unpickled only when the seal verifies;
- `not_kept`: for each of those that could not be sealed, why (it cannot be pickled, there is no key).

The same seal keeps a trial's config that is not JSON (`seal_value`/`unseal_value`), so an unfinished trial
whose config holds objects resumes with the very config it had, unless `Tuner.restore(param_space=...)`
re-specifies those objects: then `respecify` hands the new ones to every trial that runs again (Ray's
semantics for re-specified object references).
"""

from __future__ import annotations

import base64
import dataclasses
import math
from typing import Any, Optional

import cloudpickle
import numpy as np

from minitrain.config import LoggingConfig
from minitrain.driver import code_pickle
from minitrain.storage import sweep_state as tr
from minitrain.storage import user_key
from minitrain.tune.run_config import CheckpointConfig, FailureConfig, RunConfig, SyncConfig
from minitrain.tune.schedulers import FIFOScheduler
from minitrain.tune.search import BasicVariantGenerator
from minitrain.tune.search_space import Domain
from minitrain.tune.tune_config import TuneConfig

SPEC_VERSION = 1
DOMAIN_KEY = "__minitrain_domain__"
_KINDS = {"uniform", "loguniform", "normal", "randint", "lograndint", "choice"}
_SEALED = ("param_space", "tune_config", "run_config")


class _NotJson(Exception):
    """The value holds something JSON cannot carry back as itself."""


# ---------------------------------------------------------------------------------- the param space as JSON


def encode_space(node: Any) -> Any:
    """`node` (a param space or part of one) as JSON values; _NotJson when it holds anything else."""
    if isinstance(node, Domain):
        if node.kind not in _KINDS:  # sample_from: a function
            raise _NotJson(node)
        return {DOMAIN_KEY: {"kind": node.kind, "lower": _number(node.lower), "upper": _number(node.upper),
                             "categories": [encode_space(c) for c in node.categories],
                             "mean": _number(node.mean), "sd": _number(node.sd), "q": _number(node.q)}}
    if isinstance(node, dict):
        if DOMAIN_KEY in node or not all(isinstance(k, str) for k in node):
            raise _NotJson(node)
        return {k: encode_space(v) for k, v in node.items()}
    if isinstance(node, list):
        return [encode_space(v) for v in node]
    if node is None or type(node) in (str, bool, int) or (type(node) is float and math.isfinite(node)):
        return node
    raise _NotJson(node)


def _number(value: Any) -> Any:
    if value is None or (type(value) in (int, float) and math.isfinite(value)):
        return value
    if isinstance(value, (np.integer, np.floating)) and math.isfinite(value):
        return value.item()
    raise _NotJson(value)


def decode_space(node: Any, where: str = "param_space") -> Any:
    """The param space `encode_space` wrote; ValueError naming the part that is not what it writes."""
    if isinstance(node, dict):
        if DOMAIN_KEY in node:
            if len(node) != 1:
                raise ValueError(f"{where} mixes {DOMAIN_KEY!r} with other keys")
            return _domain(node[DOMAIN_KEY], where)
        return {k: decode_space(v, f"{where}.{k}") for k, v in node.items()}
    if isinstance(node, list):
        return [decode_space(v, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def _domain(record: Any, where: str) -> Domain:
    fields = {"kind", "lower", "upper", "categories", "mean", "sd", "q"}
    if not isinstance(record, dict) or set(record) != fields or record["kind"] not in _KINDS \
            or not isinstance(record["categories"], list):
        raise ValueError(f"{where} is not a sampling domain as minitrain.tune writes one: {record!r}")
    for key in ("lower", "upper", "mean", "sd", "q"):
        value = record[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ValueError(f"{where}.{key} is {value!r}, not a finite number")
    return Domain(record["kind"], record["lower"], record["upper"],
                  categories=decode_space(record["categories"], f"{where}.categories"),
                  mean=record["mean"], sd=record["sd"], q=record["q"])


# ---------------------------------------------------------------------------------- the default TuneConfig


def _basic_tune_config(config: TuneConfig) -> Optional[dict]:
    """`config` as JSON when a fresh copy can be rebuilt from it, else None."""
    searcher = config.search_alg
    if config.trial_name_creator or config.trial_dirname_creator or \
            (config.scheduler is not None and type(config.scheduler) is not FIFOScheduler):
        return None
    if searcher is not None and (type(searcher) is not BasicVariantGenerator or
                                 (searcher.seed is None and not isinstance(searcher._rng, type(np.random)))):
        return None  # another searcher, or a numpy Generator as random_state: only a pickle keeps it
    try:
        points = encode_space(searcher._points) if searcher is not None else []
    except _NotJson:
        return None
    return {"metric": config.metric, "mode": config.mode, "num_samples": config.num_samples,
            "max_concurrent_trials": config.max_concurrent_trials, "time_budget_s": config.time_budget_s,
            "points_to_evaluate": points, "max_concurrent": searcher.max_concurrent if searcher else 0,
            "constant_grid_search": searcher.constant_grid_search if searcher else False,
            "seed": searcher.seed if searcher else None}


def _tune_config_from(record: Any, where: str) -> TuneConfig:
    keys = {"metric", "mode", "num_samples", "max_concurrent_trials", "time_budget_s", "points_to_evaluate",
            "max_concurrent", "constant_grid_search", "seed"}
    if not isinstance(record, dict) or set(record) != keys:
        raise ValueError(f"{where} is not a TuneConfig as minitrain.tune writes one")
    try:
        searcher = BasicVariantGenerator(points_to_evaluate=decode_space(record["points_to_evaluate"]) or None,
                                         max_concurrent=record["max_concurrent"],
                                         constant_grid_search=record["constant_grid_search"],
                                         random_state=record["seed"])
        return TuneConfig(metric=record["metric"], mode=record["mode"], num_samples=record["num_samples"],
                          max_concurrent_trials=record["max_concurrent_trials"],
                          time_budget_s=record["time_budget_s"], search_alg=searcher)
    except Exception as exc:  # noqa: BLE001 - the constructors' ConfigError/TypeError name the field
        raise ValueError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------------- a plain RunConfig


def _basic_run_config(config: Any) -> Optional[dict]:
    """Tune's `config` as JSON when it holds only plain values (`stop` None or a dict), else None."""
    if not isinstance(config, RunConfig) or config.sync_config not in (None, SyncConfig()):
        return None
    try:
        stop = encode_space(config.stop) if isinstance(config.stop, dict) else None
        log_to_file = encode_space(config.log_to_file)
    except _NotJson:
        return None
    if (config.stop is not None and stop is None) or not isinstance(config.verbose, (int, type(None))):
        return None
    failure, keep = config.failure_config, config.checkpoint_config
    return {"stop": stop, "verbose": None if config.verbose is None else int(config.verbose),
            "log_to_file": log_to_file, "log_level": config.logging_config.log_level,
            "failure_config": {"max_failures": failure.max_failures, "fail_fast": failure.fail_fast},
            "checkpoint_config": dataclasses.asdict(keep)}


def _run_config_from(record: Any, where: str) -> RunConfig:
    keys = {"stop", "verbose", "log_to_file", "log_level", "failure_config", "checkpoint_config"}
    if not isinstance(record, dict) or set(record) != keys or not isinstance(record["failure_config"], dict) \
            or not isinstance(record["checkpoint_config"], dict):
        raise ValueError(f"{where} is not a RunConfig as minitrain.tune writes one")
    try:
        return RunConfig(stop=record["stop"], verbose=record["verbose"], log_to_file=record["log_to_file"],
                         logging_config=LoggingConfig(log_level=record["log_level"]),
                         failure_config=FailureConfig(**record["failure_config"]),
                         checkpoint_config=CheckpointConfig(**record["checkpoint_config"]))
    except Exception as exc:  # noqa: BLE001 - the constructors' ConfigError/TypeError name the field
        raise ValueError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------------- re-specified objects


def _is_object(value: Any) -> bool:
    """A value Ray would put behind a placeholder: not a plain scalar, dict, list, domain or grid."""
    return not (value is None or isinstance(value, (str, bytes, bool, int, float, dict, list, Domain)))


def _same(a: Any, b: Any) -> bool:
    """`a` and `b` are the same grid entry: identical, equal, or (objects unpickled from the sweep's
    sealed copies compare by identity) pickled to the same bytes."""
    if a is b:
        return True
    try:
        if bool(a == b):
            return True
    except Exception:  # noqa: BLE001 - arrays, objects whose == raises: compare their pickles
        pass
    try:
        return code_pickle.dumps(a) == code_pickle.dumps(b)
    except Exception:  # noqa: BLE001 - not picklable: not the same
        return False


def _is_grid(node: Any) -> bool:
    return isinstance(node, dict) and len(node) == 1 and isinstance(node.get("grid_search"), list)


def respecify(config: Any, old_space: Any, new_space: Any) -> Any:
    """`config` (a trial's resolved config) with the objects of `new_space` (the param space passed again
    to `Tuner.restore`) in place of those it took from the sweep's `old_space` (None when not stored).

    As Ray's restore: only objects are replaced (a data set, a model, a function: anything but plain
    scalars, dicts, lists, domains and grids), at the same path; sampled values and plain constants stay
    what the trial had. Inside a `grid_search`, the entry the trial took is found in `old_space`'s grid
    (else in the new one) and its objects are replaced by the new entry's at the same index. The space's
    structure is expected unchanged (Ray's rule); a path the config lacks is left alone."""
    if _is_grid(new_space):
        old_values = old_space["grid_search"] if _is_grid(old_space) else None
        candidates = old_values if old_values is not None and len(old_values) == len(new_space["grid_search"]) \
            else new_space["grid_search"]
        for index, entry in enumerate(candidates):
            if _same(entry, config):
                return respecify(config, entry, new_space["grid_search"][index])
        return config
    if isinstance(new_space, dict) and isinstance(config, dict):
        old = old_space if isinstance(old_space, dict) else {}
        return {key: respecify(value, old.get(key), new_space[key]) if key in new_space else value
                for key, value in config.items()}
    if isinstance(new_space, list) and isinstance(config, list) and len(new_space) == len(config):
        old = old_space if isinstance(old_space, list) and len(old_space) == len(config) else [None] * len(config)
        return [respecify(value, old[i], new_space[i]) for i, value in enumerate(config)]
    if _is_object(new_space) and _is_object(config):  # the trial took its object from this path
        return new_space
    return config


# ---------------------------------------------------------------------------------- sealed pickles


def seal_value(value: Any) -> str:
    """`value` cloudpickled and sealed with the user's key, as base64 text. Raises what pickling raises,
    or user_key.KeyUnavailable."""
    return base64.b64encode(user_key.seal(code_pickle.dumps(value))).decode("ascii")


def unseal_value(text: str) -> Any:
    """The value `seal_value` sealed, unpickled only after its seal verified; ValueError (the seal does
    not verify, or the text is not base64) or user_key.KeyUnavailable otherwise."""
    try:
        blob = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError("it is not base64 text") from None
    return cloudpickle.loads(user_key.unseal(blob))


# ---------------------------------------------------------------------------------- the spec file


def capture(param_space: dict, tune_config: TuneConfig, run_config: Any) -> dict:
    """The spec record of a sweep about to start (call it before the searcher or scheduler change):
    everything is pickled now, so a later change to these objects is not in it."""
    record: dict = {"version": SPEC_VERSION, "param_space": None, "basic_tune_config": None,
                    "basic_run_config": _basic_run_config(run_config), "sealed": {}, "not_kept": {}}
    objects = {"tune_config": tune_config, "run_config": run_config}
    try:
        record["param_space"] = encode_space(param_space)
    except _NotJson:
        objects["param_space"] = param_space
    record["basic_tune_config"] = _basic_tune_config(tune_config)
    for name, value in objects.items():
        try:
            record["sealed"][name] = seal_value(value)
        except user_key.KeyUnavailable as exc:
            record["not_kept"][name] = f"there is no key to seal it with: {exc}"
        except Exception as exc:  # noqa: BLE001 - whatever pickling raises: the object stays unstored
            record["not_kept"][name] = f"it cannot be pickled ({type(exc).__name__}: {exc})"
    return record


@dataclasses.dataclass
class Stored:
    """What a sweep's spec file gives back; None where it holds nothing usable, and `why` says why."""

    param_space: Optional[dict] = None
    tune_config: Optional[TuneConfig] = None
    run_config: Any = None
    why: dict = dataclasses.field(default_factory=dict)
    present: bool = False  # the sweep has a spec file (one started before it existed has none)


def load(experiment_path: str) -> Stored:
    """The sweep's param space, TuneConfig and RunConfig as stored; ValueError naming what is malformed.
    A sealed object whose seal does not verify is not unpickled: it is None and `why` says so."""
    where = f"{experiment_path}/{tr.SPEC_FILE}"
    record = tr.read_spec(experiment_path)
    stored = Stored()
    if record is None:
        stored.why = {name: f"the sweep has no {tr.SPEC_FILE} (it was started by an older minitrain)"
                      for name in _SEALED}
        return stored
    stored.present = True
    if record.get("version") != SPEC_VERSION or not isinstance(record.get("sealed"), dict) \
            or not isinstance(record.get("not_kept"), dict) or set(record["sealed"]) - set(_SEALED):
        raise ValueError(f"{where} is not a sweep spec of version {SPEC_VERSION} as minitrain.tune writes one")
    if record.get("param_space") is not None:
        stored.param_space = decode_space(record["param_space"], f"{where}: param_space")
    if record.get("basic_tune_config") is not None:
        stored.tune_config = _tune_config_from(record["basic_tune_config"], f"{where}: basic_tune_config")
    if record.get("basic_run_config") is not None:
        stored.run_config = _run_config_from(record["basic_run_config"], f"{where}: basic_run_config")
    for name in _SEALED:
        text = record["sealed"].get(name)
        if text is None:
            stored.why[name] = str(record["not_kept"].get(name, "it was not stored"))
            continue
        try:
            value = unseal_value(text) if isinstance(text, str) else None
        except (ValueError, user_key.KeyUnavailable) as exc:
            stored.why[name] = f"its sealed copy in {where} is not unpickled: {exc}"
            continue
        if name == "tune_config" and not isinstance(value, TuneConfig):
            stored.why[name] = f"its sealed copy in {where} is not a TuneConfig"
            continue
        setattr(stored, name, value)
    return stored
