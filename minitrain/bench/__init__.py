"""`python -m minitrain.bench`: minitrain's benchmarks beside their closest peers, in one command.

A development tool, not part of the library: nothing in minitrain imports it. Each workload runs
minitrain and its peer (torchrun, a plain file copy, ...) back to back on the same machine and returns
rows for one table of medians, ratios and targets (see `minitrain.bench.cli`). The control-plane scale
simulation (`python -m minitrain.bench scale`) drives the real coordinator with thousands of fake
workers (see `minitrain.bench.scale`).

Only the standard library is imported at module level anywhere under this package, except in the
fake clients of the scale simulation (grpc, no torch), so a measured process pays nothing for it.
"""
