"""`python -m bench`: minitrain's benchmarks beside their closest peers, in one command.

A development tool at the project root, not part of the installed library: nothing in minitrain
imports it, and it uses only the public API and the exported seams (`run_coordinator(observers=)` with
`RunObserver` (minitrain.coordinator.observers), `WorkerSession.phase_seconds`, the wire protocol; tests/unit/test_layering.py
checks). Run it from a checkout: `python -m bench` in the project root. Each workload runs
minitrain and its peer (torchrun, a plain file copy, ...) back to back on the same machine and returns
rows for one table of medians, ratios and targets (see `bench.cli`). The control-plane scale
simulation (`python -m bench scale`) drives the real coordinator with thousands of fake
workers (see `bench.scale`).

Only the standard library is imported at module level anywhere under this package, except in the
fake clients of the scale simulation (grpc, no torch), so a measured process pays nothing for it.
"""

import os as _os

# Measured processes run `python -m bench.<module>` in temporary directories, and workers unpickle
# training functions of bench modules: they find this package through PYTHONPATH.
_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _ROOT not in _os.environ.get("PYTHONPATH", "").split(_os.pathsep):
    _os.environ["PYTHONPATH"] = _os.pathsep.join(p for p in (_ROOT, _os.environ.get("PYTHONPATH")) if p)

