"""`DataConfig`: which datasets are split across workers (L0: stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minitrain.config._ray_compat import _default_only, _ray_words
from minitrain.config._validate import _fail, _suggests_fields


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    """Which datasets are split across workers: "all" or a list of dataset names (stored as a tuple).

    Split datasets give each rank a disjoint shard; the others give every rank the full data. Anything
    other than "all" or a list/tuple of str raises `TypeError`, as Ray does; `TorchTrainer` refuses a
    name that is not in its `datasets`. `execution_options` steers Ray Data's streaming executor,
    which minitrain does not have: only None (the default) is accepted, anything else raises
    `ConfigError`. `enable_shard_locality` must be a bool; True and False give identical runs: Ray
    uses it to hand each worker blocks already stored on its node, while in minitrain there is no
    locality to enable: a rank's rows are a pure function of the row count, world size, rank,
    epoch, seeds and batching options (`minitrain.data.sharding`), and each worker reads them itself
    from where the dataset lives (its files, the staging directory, the run's payload, or the
    function that builds it), so the value cannot change which rows a rank reads, their order, or
    where they are read from.
    """

    datasets_to_split: Any = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True

    def __post_init__(self) -> None:
        value = self.datasets_to_split
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            object.__setattr__(self, "datasets_to_split", tuple(value))
        elif not (isinstance(value, str) and value == "all"):
            raise TypeError(
                f"DataConfig.datasets_to_split must be 'all' or a list of dataset names (str), got "
                f"{value!r}. For example DataConfig(datasets_to_split=['train'])."
                + _ray_words("`datasets_to_split` should be a 'all' or a list of strings of dataset names. "
                             f"Received {type(value).__name__} with value {value}."))
        _default_only(self.execution_options, "DataConfig", "execution_options", None,
                      "execution options steer Ray Data's streaming executor, which minitrain does not have",
                      "Remove execution_options: each worker reads its own shard directly (see "
                      "minitrain.data); size batches with iter_torch_batches(batch_size=...).")
        if not isinstance(self.enable_shard_locality, bool):
            raise _fail("DataConfig", "enable_shard_locality", "True or False", self.enable_shard_locality,
                        "Pass a bool; either value gives the same run (see DataConfig).")

    def should_split(self, name: str) -> bool:
        """Whether the dataset called `name` is split across workers."""
        return self.datasets_to_split == "all" or name in self.datasets_to_split
