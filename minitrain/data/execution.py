"""Ray Data's execution arguments, each either honoured or refused (never accepted and ignored).

Honoured: `override_num_blocks` and its older name `parallelism` set the number of blocks (which is
what `map_batches(batch_size=None)` hands to its function, and what `Dataset.num_blocks()` reports);
`concurrency` runs map functions or file reads on that many threads; the readers' `shuffle="files"`,
`partition_filter` and `ignore_missing_paths` are applied to the file list (see `minitrain.data.api`).
Refused unless left at their defaults: arguments that place Ray tasks (`ray_remote_args`, `num_cpus`,
`num_gpus`, `memory`, `compute`, `ray_remote_args_fn`, `local_read`) and arguments that take Ray's own
objects (`meta_provider`, `partitioning`, `arrow_open_stream_args`): there are no Ray tasks here, and
each worker reads its rows itself.
"""

from __future__ import annotations

from typing import Any, Optional

from minitrain.errors import ConfigError

# Ray argument -> why minitrain cannot honour a value other than the default.
_TASK_PLACEMENT = ("there are no Ray tasks here: each training worker reads and maps its rows in its own "
                   "process (use ScalingConfig(resources_per_worker=...) for the workers' resources)")
REFUSED = {
    "ray_remote_args": _TASK_PLACEMENT,
    "ray_remote_args_fn": _TASK_PLACEMENT,
    "num_cpus": _TASK_PLACEMENT,
    "num_gpus": _TASK_PLACEMENT,
    "memory": _TASK_PLACEMENT,
    "compute": "Ray deprecated it for concurrency=; minitrain takes concurrency= (threads)",
    "local_read": "files are always read by each worker itself",
    "meta_provider": "minitrain reads file metadata itself (there is no Ray metadata provider)",
    "partitioning": "minitrain does not derive columns from Hive-style directory names; add them "
                    "with map_batches",
    "arrow_open_stream_args": "files are opened through fsspec (pass storage options in the filesystem= "
                              "object instead)",
}
DEFAULTS = {"local_read": False}


def refuse_unsupported(where: str, given: dict[str, Any]) -> None:
    """ConfigError naming the first argument of `given` that is in `REFUSED` with a non-default value
    (None, an empty dict, or `DEFAULTS[name]`); TypeError for an argument Ray does not have either."""
    for name, value in given.items():
        if name not in REFUSED:
            raise TypeError(f"{where} got an unexpected keyword argument {name!r}.")
        if value is None or value == DEFAULTS.get(name) or (isinstance(value, dict) and not value):
            continue
        raise ConfigError(f"{where}: {name}={value!r} cannot be honoured: {REFUSED[name]}. Remove {name}= "
                          "(its default is accepted).")


def num_blocks(where: str, parallelism: Any = -1, override_num_blocks: Any = None) -> Optional[int]:
    """The block count asked for (`override_num_blocks`, else `parallelism` unless it is -1), or None for
    the default. ConfigError naming the argument for anything but an int >= 1 (-1 for `parallelism`)."""
    for name, value, default in (("override_num_blocks", override_num_blocks, None), ("parallelism", parallelism, -1)):
        if value == default and not isinstance(value, bool):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {name}={value!r} must be an int >= 1 (the number of blocks), or "
                              f"{default!r} for the default.")
        return value
    return None
