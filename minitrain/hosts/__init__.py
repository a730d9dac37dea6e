"""The machines of a run (L1): which hosts, how to reach them, and how an agent is started on each.

- `cluster`: the cluster spec (`minitrain.init(hosts=...)`, hostfiles, `ClusterConfig`).
- `hostinfo`: facts about this machine (addresses, routes, GPUs) that the launcher and agent need.
- `ssh`: the ssh command lines that start a remote agent.
- `slurm_env`: a Slurm allocation's nodes and slots, parsed from its environment variables.
- `srun`: the srun command lines that start an agent as a job step inside a Slurm allocation.
- `launcher`: starts one agent per host (locally, over SSH or with srun) and stops them.

This `__init__` imports nothing.
"""
