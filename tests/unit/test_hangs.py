"""Reading faulthandler dumps: which hung rank waits in a collective (a consequence) and which is the cause."""

from __future__ import annotations

from minitrain.coordinator.policy.hangs import main_thread_stack, waits_in_collective
from minitrain.worker.session import WorkerSession

_READER = """Thread 0x00007f28c37fe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/venv/lib/python3.11/site-packages/grpc/_channel.py", line 956 in _next
  File "/work/main/minitrain/worker/client.py", line 58 in _read

"""

_IN_COLLECTIVE = _READER + """Current thread 0x00007f28e1d2f740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2811 in all_reduce
  File "/tmp/train.py", line 12 in train_func
  File "/work/main/minitrain/worker/bootstrap.py", line 131 in execute
  File "/work/main/minitrain/worker/bootstrap.py", line 201 in main
"""

_IN_DDP_BACKWARD = _READER + """Current thread 0x00007f28e1d2f740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 364 in backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 630 in backward
  File "/tmp/train.py", line 14 in train_func
  File "/work/main/minitrain/worker/bootstrap.py", line 131 in execute
"""

_IN_USER_LOOP = _READER + """Current thread 0x00007f28e1d2f740 (most recent call first):
  File "/tmp/train.py", line 15 in train_func
  File "/work/main/minitrain/worker/bootstrap.py", line 131 in execute
"""


def test_main_thread_is_the_one_running_the_bootstrap():
    section = main_thread_stack(_IN_COLLECTIVE)
    assert section.startswith("Current thread") and "all_reduce" in section and "_read" not in section


def test_a_rank_blocked_in_a_collective_is_a_consequence():
    assert waits_in_collective(_IN_COLLECTIVE)


def test_a_rank_blocked_in_ddp_backward_is_a_consequence():
    # DDP's gradient all-reduce runs inside autograd hooks: the innermost Python frame is autograd's.
    assert waits_in_collective(_IN_DDP_BACKWARD)


def test_a_rank_waiting_in_a_minitrain_collective_is_a_consequence():
    dump = _READER + """Current thread 0x00007f28e1d2f740 (most recent call first):
  File "/work/main/minitrain/collective.py", line 122 in _wait
  File "/work/main/minitrain/collective.py", line 107 in barrier
  File "/tmp/train.py", line 14 in train_func
  File "/work/main/minitrain/worker/bootstrap.py", line 131 in execute
"""
    assert waits_in_collective(dump)


def test_a_jax_rank_blocked_on_a_result_is_a_consequence():
    # A jitted step with a psum returns at once; the rank waits for its peers when it reads the result.
    dump = _READER + """Current thread 0x00007f28e1d2f740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/jax/_src/array.py", line 610 in _value
  File "/venv/lib/python3.11/site-packages/jax/_src/array.py", line 301 in __float__
  File "/tmp/train.py", line 21 in train_func
  File "/work/main/minitrain/worker/bootstrap.py", line 131 in execute
"""
    assert waits_in_collective(dump)


def test_a_rank_spinning_in_user_code_is_a_cause():
    assert not waits_in_collective(_IN_USER_LOOP)


def test_no_answer_is_not_a_consequence():
    # An empty dump (a stopped process) is never explained away.
    assert not waits_in_collective("")


def test_a_rank_whose_checkpoint_report_waits_for_its_round_s_commit_is_a_consequence():
    """The round commits only once every rank reported it: waiting for the commit is waiting on a peer."""
    dump = _READER + """Current thread 0x00007f28e1d2f740 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/work/main/minitrain/worker/client.py", line 279 in _wait_until
  File "/work/main/minitrain/worker/client.py", line 296 in wait_report_ack
  File "/work/main/minitrain/worker/session.py", line 299 in """ + WorkerSession._wait_for_commit.__name__ + """
  File "/work/main/minitrain/worker/session.py", line 285 in _put_in_tier
  File "/work/main/minitrain/worker/session.py", line 270 in _report_checkpoint
  File "/work/main/minitrain/worker/session.py", line 160 in report
  File "/tmp/train.py", line 15 in train_func
  File "/work/main/minitrain/worker/bootstrap.py", line 131 in execute
"""
    assert waits_in_collective(dump)
    # ...but a rank waiting for the report window (the coordinator, not a peer) is not.
    window = dump.replace(f"in {WorkerSession._wait_for_commit.__name__}", "in _wait_for_window")
    assert not waits_in_collective(window)
