"""`TuneReportCallback` (Ray: `ray.tune.integration.ray_train`): a TorchTrainer's reports, run in a Tune trial,
become the trial's results (L3).

Ray Train v2's pattern for tuning a distributed run: a function trainable builds a `TorchTrainer` with
`RunConfig(callbacks=[TuneReportCallback()])` and calls `fit()`. Each report round of that fit() then
reaches the trial as one result: rank 0's metrics, plus `checkpoint_path` (the committed checkpoint's
directory) when the round committed a checkpoint, as Ray's callback adds it. minitrain also registers that
checkpoint as the trial's latest (`tune.get_checkpoint()`, `Result.checkpoint`, retention), where Ray only
passes its path.

The forwarding itself is done by the trial for every fit() it runs (`minitrain.tune.session.
ForwardingObserver`, on the run's controller thread, so the scheduler's STOP stops the fit() at once); a fit()
whose callbacks hold a `TuneReportCallback` has `checkpoint_path` added to its forwarded metrics. Its
`after_report` hook therefore does nothing more: each round reaches the trial once.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from minitrain import _session
from minitrain.callbacks.base import TrainRunContext, UserCallback
from minitrain.checkpoint import Checkpoint

CHECKPOINT_PATH_KEY = "checkpoint_path"


class TuneReportCallback(UserCallback):
    """Forward each report of the TorchTrainer whose `RunConfig(callbacks=...)` holds it to the Tune trial
    running it, with `checkpoint_path` (Ray's `TuneReportCallback`). Made outside a trial, it raises
    RuntimeError, as Ray's."""

    def __init__(self):
        if _session.current_trial() is None:
            raise RuntimeError("TuneReportCallback must be used in a Tune session: create it inside the function "
                               "trainable that a minitrain.tune.Tuner runs, in the RunConfig(callbacks=[...]) of "
                               "the TorchTrainer that function builds.")

    def after_report(self, run_context: TrainRunContext, metrics: List[Dict[str, Any]],
                     checkpoint: Optional[Checkpoint]) -> None:
        """Nothing: the trial's forwarding observer already sent this round (see the module doc)."""
