"""The run directory (L0/L1): where a run's files live and who may write them.

- `layout`: the ONE module that names the files and folders of a run directory (L0).
- `filesystem`: `Storage`, the run directory on any fsspec filesystem (local, NFS, S3, memory://).
- `retention`: the pure top-K core (L0). `checkpoint_manager`: the index, commits and deletions.
- `run_lock`: one `fit()` per run directory. `mirror`: a local copy of an in-process filesystem.
- `user_filesystems`: the filesystems users pass (fsspec or pyarrow), as fsspec.
- `sweep_state`: a `minitrain.tune` sweep's trials and its state file, read by the tuner and the
  dashboard (below both, so the dashboard never imports tune).

This `__init__` imports nothing, so `minitrain.storage.layout` stays as light as the standard library.
"""
