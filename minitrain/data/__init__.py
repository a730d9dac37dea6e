"""`minitrain.data`: datasets for `TorchTrainer(datasets=...)` without Ray Data.

Ray Data scripts port by changing imports (`ray.data` -> `minitrain.data`) for the constructors they
use to feed a trainer: `range`, `from_items`, `from_numpy`, `from_pandas`, `from_torch`, `read_csv`,
`read_json`, `read_parquet`, and `Dataset.random_shuffle`, `map_batches`, `map`, `flat_map`, `filter` and
`materialize`. This is not a distributed data engine: there is no streaming execution, and transforms
run in each worker over the whole dataset, lazily (again on every pass, as Ray re-runs them each epoch,
unless the dataset was materialized: `minitrain.data.mapping`, `minitrain.data.transforms`). Each
worker reads the rows of its shard itself:

- how rows reach workers: `minitrain.data.staging` (factories and files are read in each worker;
  small tables travel in the run's payload; large numeric tables are staged once as `.npy` files);
- which rows a rank reads in an epoch: `minitrain.data.sharding` (disjoint near-equal blocks of a
  per-epoch order; every row once per epoch, unless `drop_last`);
- what a training function iterates: `minitrain.data.iterator.DataIterator`, returned by
  `minitrain.get_dataset_shard(name)`.

pandas (CSV/JSON readers, `from_pandas`, `batch_format="pandas"`) and pyarrow (`read_parquet`) are
optional; numpy is required.
"""

from __future__ import annotations

from minitrain.data.api import (
    from_items, from_numpy, from_pandas, from_torch, range, read_csv, read_json, read_parquet,
)
from minitrain.data.dataset import Dataset
from minitrain.data.iterator import DataIterator

__all__ = ["Dataset", "DataIterator", "from_items", "from_numpy", "from_pandas", "from_torch", "range",
           "read_csv", "read_json", "read_parquet"]
