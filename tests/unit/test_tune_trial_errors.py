"""A failed trial's error keeps its type: `trial_error` unpickles what the trial
process sent, else rebuilds a type of an already imported module by name, else `RemoteWorkerError`."""

from __future__ import annotations

import base64
import sys

import cloudpickle

from minitrain.errors import RemoteWorkerError
from minitrain.storage.sweep_state import TrialError
from minitrain.tune import messages
from minitrain.tune.messages import TrialFailed
from minitrain.tune.result_grid import trial_error
from minitrain.tune.trial_process import _pickled


class Custom(Exception):
    """A user's exception with an attribute (kept by pickling, as fit() keeps a worker's)."""


class TwoArguments(Exception):
    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


def test_the_pickled_exception_comes_back_with_its_type_and_attributes():
    error = TrialError(f"{__name__}.Custom", "7: broken")
    raised = Custom("7: broken")
    raised.code = 7
    rebuilt = trial_error(error, _pickled(raised))
    assert type(rebuilt) is Custom and rebuilt.code == 7


def test_without_the_pickle_a_known_type_is_rebuilt_by_name():
    rebuilt = trial_error(TrialError("builtins.RuntimeError", "boom", "Traceback ..."))
    assert type(rebuilt) is RuntimeError and str(rebuilt) == "boom"
    rebuilt = trial_error(TrialError("minitrain.errors.ConfigError", "bad"))
    assert type(rebuilt).__name__ == "ConfigError"


def test_an_unknown_type_or_module_stays_a_remote_worker_error_and_nothing_is_imported():
    assert "antigravity" not in sys.modules
    error = trial_error(TrialError("antigravity.Fly", "up", "tb"))
    assert isinstance(error, RemoteWorkerError) and error.exc_type == "antigravity.Fly" and error.traceback == "tb"
    assert "antigravity" not in sys.modules
    # a constructor that wants other arguments, a name that is not an exception
    assert isinstance(trial_error(TrialError(f"{__name__}.TwoArguments", "x")), RemoteWorkerError)
    assert isinstance(trial_error(TrialError("builtins.len", "x")), RemoteWorkerError)
    # bytes that are not a pickle of an exception fall back to the name
    junk = base64.b64encode(cloudpickle.dumps([1, 2])).decode()
    assert type(trial_error(TrialError("builtins.ValueError", "v"), junk)) is ValueError


def test_the_failed_message_carries_the_pickle_over_the_wire():
    message = TrialFailed(TrialError("builtins.ValueError", "v", "tb"), _pickled(ValueError("v")))
    assert messages.decode(messages.encode(message)) == message
    assert messages.decode(messages.encode(TrialFailed(TrialError("a", "b", "c")))).pickled is None
