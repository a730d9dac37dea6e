"""Reading faulthandler stack dumps of hung ranks (pure).

When one rank hangs, its peers soon block in a collective waiting for it. Both stop reporting, but
only the first is the cause: a rank whose main thread sits inside torch.distributed is waiting on
another rank, so its hang is marked a consequence and not chosen as the root cause.
"""

from __future__ import annotations

import re

_THREAD_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):", re.M)
_MAIN_MARKER = "minitrain/worker/bootstrap.py"
# Where a rank waits on its peers: a torch.distributed call, DDP's forward (buffer broadcast),
# minitrain.collective's barrier or broadcast, or autograd's engine, where DDP's gradient
# all-reduce runs in backward hooks (under DDP, loss.backward() blocks there when a peer stops:
# its innermost Python frame is torch/autograd/graph.py).
_COLLECTIVE = re.compile(r"torch/distributed/|torch/nn/parallel/distributed\.py|torch/autograd/|"
                         r"minitrain/collective\.py")


def main_thread_stack(dump: str) -> str:
    """The section of a faulthandler dump that belongs to the worker's main thread (runs the user's
    training function under minitrain's bootstrap); "" when it cannot be found."""
    starts = [m.start() for m in _THREAD_HEADER.finditer(dump)] + [len(dump)]
    for begin, end in zip(starts, starts[1:]):
        section = dump[begin:end]
        if _MAIN_MARKER in section:
            return section
    return ""


def waits_in_collective(dump: str) -> bool:
    """True when the main thread's innermost frame is in torch.distributed (waiting on a peer)."""
    section = main_thread_stack(dump)
    frames = [line for line in section.splitlines() if line.strip().startswith("File ")]
    return bool(frames) and bool(_COLLECTIVE.search(frames[0]))
