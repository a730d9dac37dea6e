"""The control-plane scale simulation: the real coordinator, thousands of fake workers, real gRPC.

Three kinds of process (see docs/benchmarks/scale.md):
  the benchmark (`workload.py`) starts one coordinator process per worker count and samples its CPU
  and RSS from outside;
  the coordinator process (`coordinator.py`) runs the real `run_coordinator` (grpc.aio server, auth
  interceptor, controller, commits, metrics log) with a launcher whose "agents" are
  client processes (`clients.py`): asyncio fake agents and workers speaking the real proto over
  loopback, without torch, so that thousands fit on a small machine. By default the fake agents relay
  their workers' streams (one connection per fake host), as the node agents do; `--transport direct`
  gives each fake worker its own connection.
"""
