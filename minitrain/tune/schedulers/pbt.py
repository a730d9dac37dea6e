"""Ray's `PopulationBasedTraining` (`ray.tune.schedulers.pbt`): exploit the best trials, explore their configs (L3).

At each `perturbation_interval` of a trial (in `time_attr` units, after `burn_in_period`), its score is
ranked among the live trials: a trial in the top `quantile_fraction` has its latest checkpoint recorded;
a trial in the bottom one exploits a random top trial: it takes that trial's recorded checkpoint and a
config explored from that trial's (`hyperparam_mutations`: a list shifts to a neighbour or is resampled,
a domain or a callable is resampled or its value multiplied by a `perturbation_factors` entry, ints stay
ints; `resample_probability`; then `custom_explore_fn`). The trial keeps its id: it is paused (its process
stops), and starts again with the new config, its trainable reading the donor's checkpoint through
`tune.get_checkpoint()`; `result.config` is then the explored config. The explore rules are Ray's `_explore`.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import shutil
from typing import Any, Callable, Optional

from minitrain.errors import ConfigError
from minitrain.tune.schedulers.trial_scheduler import CONTINUE, NOOP, PAUSE, FIFOScheduler
from minitrain.tune.search_space import Domain

logger = logging.getLogger("minitrain")


class _TrialState:
    """PBT's view of one trial (Ray's `_PBTTrialState`)."""

    def __init__(self, tag: str):
        self.orig_tag = tag
        self.last_score: Optional[float] = None
        self.last_checkpoint: Optional[tuple] = None  # (path, training_iteration, result) when in the top quantile
        self.last_perturbation_time = 0.0
        self.last_train_time = 0.0
        self.last_result: Optional[dict] = None
        self.finished = False


def explore(config: dict, mutations: dict, resample_probability: float, perturbation_factors: tuple,
            custom_explore_fn: Optional[Callable] = None, rng: Any = random) -> tuple[dict, dict]:
    """A new config from `config` (Ray's `_explore`) and the operation applied to each mutated key."""
    operations: dict = {}
    new_config = copy.deepcopy(config)
    for key, distribution in mutations.items():
        if isinstance(distribution, dict):
            new_config[key], operations[key] = explore(config[key], distribution, resample_probability,
                                                       perturbation_factors, None, rng)
        elif isinstance(distribution, (list, tuple)):
            if rng.random() < resample_probability or config[key] not in distribution:
                new_config[key] = rng.choice(distribution)
                operations[key] = "resample"
            else:
                shift = rng.choice([-1, 1])
                old = list(distribution).index(config[key])
                new = min(max(old + shift, 0), len(distribution) - 1)
                new_config[key] = distribution[new]
                operations[key] = f"shift {'left' if shift == -1 else 'right'}{' (noop)' if old == new else ''}"
        elif isinstance(distribution, Domain) or callable(distribution):
            if rng.random() < resample_probability:
                new_config[key] = distribution.sample() if isinstance(distribution, Domain) else distribution()
                operations[key] = "resample"
            else:
                factor = rng.choice(perturbation_factors)
                new_config[key] = config[key] * factor
                operations[key] = f"* {factor}"
                if isinstance(config[key], int):  # an int hyperparameter (a batch size) stays an int
                    new_config[key] = int(new_config[key])
        else:
            raise ConfigError(f"PopulationBasedTraining(hyperparam_mutations={{{key!r}: {distribution!r}}}): each "
                              "value must be a list, a dict, a tune domain or a callable.")
    if custom_explore_fn:
        new_config = custom_explore_fn(new_config)
        if new_config is None:
            raise ConfigError("PopulationBasedTraining(custom_explore_fn=...) returned None; it must return the "
                              "new config.")
    return new_config, operations


def fill_config(config: dict, mutations: dict) -> None:
    """Sample each mutated key `config` lacks (Ray's PBT fills them in when a trial is added)."""
    for key, distribution in mutations.items():
        if isinstance(distribution, dict):
            fill_config(config.setdefault(key, {}), distribution)
        elif key not in config:
            config[key] = random.choice(distribution) if isinstance(distribution, (list, tuple)) else \
                distribution.sample() if isinstance(distribution, Domain) else distribution()


class PopulationBasedTraining(FIFOScheduler):
    """Ray's asynchronous PBT (see the module docstring). Every trial must report a checkpoint with
    `tune.report(metrics, checkpoint=...)` at least every `perturbation_interval`: a top trial that has
    none when a bottom one would exploit it fails the sweep with a ConfigError saying so (Ray only logs
    and skips the exploit, so PBT silently does nothing). `synch=True` is not supported (ConfigError)."""

    def __init__(self, time_attr: str = "time_total_s", metric: Optional[str] = None, mode: Optional[str] = None,
                 perturbation_interval: float = 60.0, burn_in_period: float = 0.0,
                 hyperparam_mutations: Optional[dict] = None, quantile_fraction: float = 0.25,
                 resample_probability: float = 0.25, perturbation_factors: tuple = (1.2, 0.8),
                 custom_explore_fn: Optional[Callable] = None, log_config: bool = True, require_attrs: bool = True,
                 synch: bool = False):
        super().__init__(metric, mode)
        mutations = hyperparam_mutations or {}
        if not isinstance(mutations, dict):
            raise ConfigError(f"PopulationBasedTraining(hyperparam_mutations={mutations!r}) must be a dict.")
        _check_mutations(mutations)
        if not mutations and not custom_explore_fn:
            raise ConfigError("PopulationBasedTraining: pass hyperparam_mutations= or custom_explore_fn= (at least "
                              "one), so that a trial can explore a config.")
        if not 0 <= quantile_fraction <= 0.5:
            raise ConfigError(f"PopulationBasedTraining(quantile_fraction={quantile_fraction!r}) must be between 0 "
                              "and 0.5.")
        if not perturbation_interval > 0:
            raise ConfigError(f"PopulationBasedTraining(perturbation_interval={perturbation_interval!r}) must be "
                              "> 0.")
        if synch:
            raise ConfigError("PopulationBasedTraining(synch=True) is not supported by minitrain.tune: pausing every "
                              "trial at each interval would restart every trial process each time. Leave synch=False "
                              "(asynchronous PBT, Ray's default).")
        self.time_attr, self.perturbation_interval, self.burn_in_period = time_attr, perturbation_interval, \
            burn_in_period
        self.hyperparam_mutations, self.quantile_fraction = mutations, quantile_fraction
        self.resample_probability, self.perturbation_factors = resample_probability, tuple(perturbation_factors)
        self.custom_explore_fn, self.log_config, self.require_attrs = custom_explore_fn, log_config, require_attrs
        self.states: dict[str, _TrialState] = {}
        self.num_checkpoints = self.num_perturbations = 0

    def describe(self) -> str:
        return "PopulationBasedTraining"

    def check_sweep(self, trainable: Any) -> None:
        if not (self.metric and self.mode):
            raise ConfigError("PopulationBasedTraining needs a metric and a mode: pass them to it or to TuneConfig.")
        from minitrain.driver.trainer import DataParallelTrainer

        if isinstance(trainable, DataParallelTrainer):
            raise ConfigError("Tuner(TorchTrainer, scheduler=PopulationBasedTraining(...)): a TorchTrainer trial "
                              "resumes from its own run directory, so it cannot take another trial's checkpoint. "
                              "Use a function trainable that builds the TorchTrainer with "
                              "resume_from_checkpoint=tune.get_checkpoint() and reports through tune.report.")

    def on_trial_add(self, trial_id: str) -> None:
        self.states[trial_id] = _TrialState(trial_id)
        if self.controller is not None and self.hyperparam_mutations:
            config = self.controller.config(trial_id)
            if isinstance(config, dict):
                fill_config(config, self.hyperparam_mutations)

    def _score(self, result: dict) -> float:
        return float(result[self.metric]) * (1.0 if self.mode == "max" else -1.0)

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        for field, attr in (("time_attr", self.time_attr), ("metric", self.metric)):
            if attr not in result:
                message = (f"PopulationBasedTraining({field}={attr!r}): the result of trial {trial_id} has no "
                           f"{attr!r}; report it with every result")
                if self.require_attrs:
                    raise ConfigError(message + " (or pass require_attrs=False to skip such results).")
                logger.warning("%s.", message)
        if self.time_attr not in result or self.metric not in result:
            return CONTINUE
        state = self.states.setdefault(trial_id, _TrialState(trial_id))
        now = result[self.time_attr]
        if now < self.burn_in_period or now - state.last_perturbation_time < self.perturbation_interval:
            return CONTINUE
        state.last_score, state.last_train_time, state.last_result = self._score(result), now, result
        state.last_perturbation_time = now
        lower, upper = self._quantiles()
        decision = CONTINUE
        if self.controller is not None and self.controller.has_waiting_trials():
            decision = PAUSE  # Ray's: give a waiting trial the room
        if self._checkpoint_or_exploit(trial_id, upper, lower):
            return NOOP  # paused by the exploit
        return decision

    def _quantiles(self) -> tuple[list, list]:
        trials = sorted((t for t, s in self.states.items() if s.last_score is not None and not s.finished),
                        key=lambda t: self.states[t].last_score)
        if len(trials) <= 1:
            return [], []
        count = int(math.ceil(len(trials) * self.quantile_fraction))
        if count > len(trials) / 2:
            count = int(math.floor(len(trials) / 2))
        return trials[:count], trials[-count:] if count else []

    def _checkpoint_or_exploit(self, trial_id: str, upper: list, lower: list) -> bool:
        """Record a top trial's checkpoint; make a bottom trial exploit a top one. True when it exploited."""
        state = self.states[trial_id]
        if trial_id in upper:
            state.last_checkpoint = self.controller.checkpoint(trial_id) if self.controller is not None else None
            self.num_checkpoints += 1
        else:
            state.last_checkpoint = None
        if trial_id not in lower or self.controller is None:
            return False
        donor = random.choice(upper)
        donor_state = self.states[donor]
        if donor_state.last_checkpoint is None:
            donor_state.last_checkpoint = self.controller.checkpoint(donor)
        if donor_state.last_checkpoint is None:
            raise ConfigError(
                f"PopulationBasedTraining: trial {trial_id} should exploit trial {donor} (a top trial at "
                f"{self.time_attr}={donor_state.last_train_time}), but {donor} has reported no checkpoint. Report one "
                f"with tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(...)) at least every "
                f"perturbation_interval={self.perturbation_interval}, and resume from tune.get_checkpoint().")
        self._exploit(trial_id, donor)
        return True

    def _exploit(self, trial_id: str, donor: str) -> None:
        state, donor_state = self.states[trial_id], self.states[donor]
        donor_config = self.controller.config(donor)
        new_config, operations = explore(donor_config, self.hyperparam_mutations, self.resample_probability,
                                         self.perturbation_factors, self.custom_explore_fn)
        logger.info("[PopulationBasedTraining] [Exploit] cloning trial %s (score = %.4f) into trial %s (score = %.4f)",
                    donor, donor_state.last_score, trial_id, state.last_score)
        logger.info("[PopulationBasedTraining] [Explore] trial %s: %s", trial_id, operations)
        old_iteration = (state.last_result or {}).get("training_iteration", 0)
        self.controller.exploit(trial_id, new_config, donor_state.last_checkpoint)
        self.num_perturbations += 1
        state.last_perturbation_time = donor_state.last_perturbation_time
        state.last_train_time = donor_state.last_train_time
        if self.log_config:
            self._log_policy(trial_id, donor, old_iteration, donor_config, new_config)

    def _log_policy(self, trial_id: str, donor: str, old_iteration: int, donor_config: dict, new_config: dict) -> None:
        """Ray's policy log: a JSON line [trial tag, donor tag, trial's iteration, donor's iteration, donor's
        config, new config] in `pbt_global.txt` and `pbt_policy_<trial_id>.txt` (the donor's history first)."""
        path = self.controller.experiment_path
        donor_iteration = (self.states[donor].last_result or {}).get("training_iteration", 0)
        policy = json.dumps([trial_id, donor, old_iteration, donor_iteration, donor_config, new_config], default=repr)
        with open(os.path.join(path, "pbt_global.txt"), "a") as f:
            f.write(policy + "\n")
        target, source = (os.path.join(path, f"pbt_policy_{t}.txt") for t in (trial_id, donor))
        if os.path.exists(source):
            shutil.copyfile(source, target)
        with open(target, "a") as f:
            f.write(policy + "\n")

    def on_trial_complete(self, trial_id: str, result: Optional[dict]) -> None:
        if trial_id in self.states:
            self.states[trial_id].finished = True

    def on_trial_remove(self, trial_id: str) -> None:
        self.on_trial_complete(trial_id, None)


def _check_mutations(mutations: dict) -> None:
    for key, value in mutations.items():
        if isinstance(value, Domain) and value.kind == "function":
            raise ConfigError(f"PopulationBasedTraining(hyperparam_mutations={{{key!r}: tune.sample_from(...)}}): "
                              "sample_from is not supported (Ray's rule); use a list, tune.uniform & co., or a "
                              "plain callable.")
        if isinstance(value, dict):
            _check_mutations(value)
        elif not isinstance(value, (list, tuple, Domain)) and not callable(value):
            raise ConfigError(f"PopulationBasedTraining(hyperparam_mutations={{{key!r}: {value!r}}}): each value must "
                              "be a list, a dict, a tune domain (tune.uniform, ...) or a callable.")
