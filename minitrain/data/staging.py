"""How datasets reach the workers: planned on the driver, turned into shards in each worker.

Driver (`plan_datasets`, at `fit()`): every dataset becomes a `ShardSpec`, which travels inside the
run's pickled payload (the authenticated coordinator -> worker channel):

- a **factory** (zero-argument function) and **files** (`read_csv`/`read_json`/`read_parquet`) travel as
  the function or the file paths; each worker calls the function or reads the files itself;
- an **in-memory table of at most `INLINE_LIMIT_BYTES`** travels inside the payload;
- a **larger in-memory table of numbers or strings** (a dict of arrays, `from_numpy`, `from_pandas`,
  `from_items` of plain values) is written once, one `.npy` file per column, to a staging directory;
  the payload carries only its path. Workers memory-map local files, so the workers of one host share
  one copy through the page cache. Nothing staged is ever unpickled (`allow_pickle=False`);
- a larger table of other Python objects (a torch Dataset object, rows of arbitrary objects) cannot be
  staged without pickle: it travels inside the payload, with a warning that suggests a factory.

The staging directory is a local temporary directory when every worker runs on this machine, else
`<storage_path>/.minitrain_datasets/<name>-<id>/` on the run's (shared) storage: outside the run
directory, whose unknown entries are garbage-collected. It is deleted when `fit()` returns or raises.

Worker (`make_shards`): each spec becomes a lazy `DataIterator` for this rank; nothing is read until
the training function iterates it.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import random
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from minitrain.config import DataConfig
from minitrain.context import TrainContext
from minitrain.data.dataset import Dataset, as_dataset
from minitrain.data.iterator import DataIterator
from minitrain.data.mapping import Mapped
from minitrain.data.sources import InMemory, Staged, column_file
from minitrain.data.tables import ColumnTable
from minitrain.data.transforms import RowMapped
from minitrain.errors import ConfigError
from minitrain.storage.layout import DATASETS_DIR

logger = logging.getLogger("minitrain")

INLINE_LIMIT_BYTES = 4 << 20


@dataclass(frozen=True)
class ShardSpec:
    """One dataset as every worker receives it: the dataset, whether it is split across ranks, and the
    shuffle seed drawn for this run (used when the dataset is shuffled without a seed of its own)."""

    name: str
    dataset: Dataset
    split: bool
    run_seed: int


def validate_datasets(datasets: Any, data_config: DataConfig) -> dict[str, Dataset]:
    """`TorchTrainer(datasets=...)` as {name: Dataset}; ConfigError naming the field, the value and the fix
    for a non-dict, a bad name, a value no rows can be read from, or `datasets_to_split` naming a
    dataset that is not there."""
    if datasets is None:
        datasets = {}
    if not isinstance(datasets, Mapping):
        raise ConfigError(f"TorchTrainer(datasets=...) must be a dict of name -> dataset, got "
                          f"{type(datasets).__name__}. For example datasets={{'train': train_ds}}.")
    built = {}
    for name, value in datasets.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"TorchTrainer(datasets=...) has the name {name!r}; dataset names must be non-empty "
                              "strings (get_dataset_shard(name) looks them up).")
        built[name] = as_dataset(value, f"TorchTrainer(datasets={{{name!r}: ...}})")
    split = data_config.datasets_to_split
    if split != "all":
        unknown = [name for name in split if name not in built]
        if unknown:
            raise ConfigError(f"DataConfig(datasets_to_split={list(split)!r}) names {unknown}, which "
                              f"TorchTrainer(datasets=...) does not have (it has {sorted(built)}). Fix the name, "
                              "or add the dataset.")
    return built


class StagingArea:
    """A directory (`root` on fsspec filesystem `fs`) for datasets staged for one `fit()`."""

    def __init__(self, fs: Any, root: str, remove_parent_if_empty: bool = False):
        self.fs = fs
        self.root = root
        self._remove_parent = remove_parent_if_empty
        self._staged = 0

    @classmethod
    def for_run(cls, storage: Any, all_local: bool) -> "StagingArea":
        """A local temporary directory when `all_local`, else a fresh directory beside the run directory
        of `storage` (a `minitrain.storage.filesystem.Storage`), under `.minitrain_datasets/`."""
        if all_local:
            from fsspec.implementations.local import LocalFileSystem

            return cls(LocalFileSystem(), tempfile.mkdtemp(prefix="minitrain_datasets_"))
        parent, _, name = storage.root.rpartition("/")
        leaf = f"{name}-{uuid.uuid4().hex[:12]}"
        root = posixpath.join(parent or "/", DATASETS_DIR, leaf)
        if storage.is_local:  # a shared storage_path: no planted link or other user's entry is followed
            type(storage)(storage.fs, posixpath.join(parent or "/", DATASETS_DIR), guard_root=True).makedirs(leaf)
        else:
            storage.fs.makedirs(root, exist_ok=True)
        return cls(storage.fs, root, remove_parent_if_empty=True)

    def stage(self, name: str, table: ColumnTable) -> Staged:
        """Write `table`'s columns as `.npy` files under `<root>/dataset_<n>/`; the source reading them back."""
        directory = posixpath.join(self.root, f"dataset_{self._staged}")
        self._staged += 1
        self.fs.makedirs(directory, exist_ok=True)
        for position, array in enumerate(table.columns.values()):
            with self.fs.open(posixpath.join(directory, column_file(position)), "wb") as handle:
                np.save(handle, np.asarray(array), allow_pickle=False)
        return Staged(self.fs, directory, tuple(table.columns))

    def cleanup(self) -> None:
        """Delete the staging directory (and an emptied `.minitrain_datasets/`); errors are logged."""
        try:
            if self.fs.exists(self.root):
                self.fs.rm(self.root, recursive=True)
            if self._remove_parent:
                parent = posixpath.dirname(self.root)
                if self.fs.exists(parent) and not self.fs.ls(parent):
                    self.fs.rmdir(parent)
        except OSError as exc:
            logger.warning("could not delete the staged datasets in %s: %s", self.root, exc)


def _stageable(table: Any) -> bool:
    # Pandas extension columns (categorical, ...) and object columns cannot be .npy files without pickle.
    return isinstance(table, ColumnTable) and all(isinstance(a, np.ndarray) and not a.dtype.hasobject
                                                  for a in table.columns.values())


class _CountingFile:
    def __init__(self) -> None:
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return len(data)


def pickled_size(obj: Any) -> int:
    """Bytes `obj` takes when cloudpickled, measured without holding the bytes."""
    import cloudpickle

    counter = _CountingFile()
    cloudpickle.CloudPickler(counter).dump(obj)
    return counter.size


def plan_datasets(datasets: Mapping[str, Dataset], data_config: DataConfig, *, num_workers: int = 1,
                  staging: Optional[Any] = None) -> dict[str, ShardSpec]:
    """The `ShardSpec` of every dataset (module doc). `staging()` returns the `StagingArea` for large
    tables; it is called at most once, and only when a table needs it. Without it (local mode) nothing
    is staged or measured. ConfigError naming the dataset when an in-memory one cannot be pickled."""
    area: list[StagingArea] = []
    specs = {}
    for name, dataset in datasets.items():
        source = dataset.source
        dataset = _ship_tables(name, dataset, num_workers, staging, area)
        specs[name] = ShardSpec(name, dataset, data_config.should_split(name), random.SystemRandom().getrandbits(63))
    return specs


def _ship_tables(name: str, dataset: Dataset, num_workers: int, staging: Any, area: list) -> Dataset:
    """`dataset` with its in-memory table, or the one under its `map_batches`, shipped (`_shipped`)."""
    source = dataset.source
    if isinstance(source, InMemory):
        return _shipped(name, dataset, source, num_workers, staging, area)
    if isinstance(source, (Mapped, RowMapped)):
        parent = _ship_tables(name, source.parent, num_workers, staging, area)
        if parent is not source.parent:
            return dataset.with_source(dataclasses.replace(source, parent=parent))
    return dataset


def _shipped(name: str, dataset: Dataset, source: InMemory, num_workers: int, staging: Any,
             area: list) -> Dataset:
    table = source.table
    if _stageable(table):
        size = sum(array.nbytes for array in table.columns.values())
        if size <= INLINE_LIMIT_BYTES or staging is None:
            return dataset
        if not area:
            area.append(staging())
        staged = area[0].stage(name, table)
        return dataset.with_source(staged)
    if staging is None:  # local mode: nothing travels
        return dataset
    try:
        size = pickled_size(source)
    except Exception as exc:
        raise ConfigError(f"TorchTrainer(datasets={{{name!r}: ...}}) cannot be pickled ({type(exc).__name__}: "
                          f"{exc}); it is sent to every worker. Pass a zero-argument function that builds it "
                          "instead (it is called in each worker).") from exc
    if size > INLINE_LIMIT_BYTES:
        logger.warning(
            "datasets[%r] is %.1f MB pickled and travels inside the run's payload to each of the %d workers. To "
            "send less, pass a zero-argument function that builds it (it is called in each worker), or use columns "
            "of numbers (a dict of arrays, from_numpy, from_pandas), which are staged once as .npy files.",
            name, size / 1e6, num_workers)
    return dataset


def make_shards(specs: Optional[Mapping[str, ShardSpec]], context: TrainContext) -> dict[str, DataIterator]:
    """This rank's lazy `DataIterator` for every dataset: split ones over `context`'s world, the others
    over a world of one (all rows)."""
    shards = {}
    for name, spec in (specs or {}).items():
        world_size, rank = (context.world_size, context.world_rank) if spec.split else (1, 0)
        shards[name] = DataIterator(spec.dataset, world_size=world_size, rank=rank, run_seed=spec.run_seed,
                                    context=context, name=name)
    return shards
