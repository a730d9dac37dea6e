"""The run directory (L0/L1): where a run's files live and who may write them.

- `layout`: the ONE module that names the files and folders of a run directory (L0).
- `filesystem`: `Storage`, the run directory on any fsspec filesystem (local, NFS, S3, memory://).
- `retention`: the pure top-K core (L0). `checkpoint_manager`: the index, commits and deletions.
- `run_lock`: one `fit()` per run directory. `mirror`: a local copy of an in-process filesystem.

This `__init__` imports nothing, so `minitrain.storage.layout` stays as light as the standard library.
"""
