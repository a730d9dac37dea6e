"""`prepare_trainer`: let a `transformers.Trainer` consume iterables of ready-made batches."""

from __future__ import annotations

import collections.abc
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from minitrain.huggingface.transformers._compat import Trainer


def prepare_trainer(trainer: Trainer) -> Trainer:
    """Return `trainer`, changed so that it accepts iterables of ready-made batches as datasets.

    A `train_dataset` or `eval_dataset` (also one inside an `eval_dataset` dict) that is an iterable
    of batches rather than a dataset of examples (for instance
    `minitrain.get_dataset_shard("train").iter_torch_batches(batch_size=8)`, or any object that
    yields batches afresh each time it is iterated) is served as it is: each batch passes through
    unchanged, without sampler, collator or sharding (the iterable already holds this worker's share).
    Torch datasets, Hugging Face `datasets` objects, sequences and mappings are left to the Trainer's
    own loaders. As in Ray, the Trainer's
    class is swapped for a subclass in place; calling it twice changes nothing more. Such iterables
    have no length, so give `TrainingArguments(max_steps=...)`.
    """
    if not isinstance(trainer, _BatchIterableTrainerMixin):
        trainer.__class__ = _prepared_class(type(trainer))
    return trainer


class _BatchIterableTrainerMixin:
    def get_train_dataloader(self) -> DataLoader:
        if _is_batch_iterable(self.train_dataset):
            return _pass_through_loader(self.train_dataset)
        return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        dataset = eval_dataset
        if isinstance(eval_dataset, str) and isinstance(self.eval_dataset, collections.abc.Mapping):
            dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            dataset = self.eval_dataset
        if _is_batch_iterable(dataset):
            return _pass_through_loader(dataset)
        return super().get_eval_dataloader(eval_dataset)


_PREPARED: dict[type, type] = {}


def _prepared_class(base: type) -> type:
    if base not in _PREPARED:
        _PREPARED[base] = type(base.__name__, (_BatchIterableTrainerMixin, base),
                               {"__module__": base.__module__, "__qualname__": base.__qualname__})
    return _PREPARED[base]


def _is_batch_iterable(dataset: Any) -> bool:
    if dataset is None or isinstance(dataset, (Dataset, collections.abc.Sequence, collections.abc.Mapping)):
        return False
    if type(dataset).__module__.split(".")[0] == "datasets":  # Hugging Face datasets: the Trainer's own job
        return False
    return isinstance(dataset, collections.abc.Iterable)


class _BatchIterable(IterableDataset):
    """An iterable of batches seen as a torch IterableDataset (each item is one whole batch)."""

    def __init__(self, batches: Any) -> None:
        self._batches = batches

    def __iter__(self):
        return iter(self._batches)


def _first(items: list) -> Any:
    return items[0]


def _pass_through_loader(batches: Any) -> DataLoader:
    return DataLoader(_BatchIterable(batches), batch_size=1, collate_fn=_first)
