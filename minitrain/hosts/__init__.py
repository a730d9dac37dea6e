"""The machines of a run (L1): which hosts, how to reach them, and how an agent is started on each.

- `cluster`: the cluster spec (`minitrain.init(hosts=...)`, hostfiles, `ClusterConfig`).
- `hostinfo`: facts about this machine (addresses, routes, GPUs) that the launcher and agent need.
- `ssh`: the ssh command lines that start a remote agent.
- `launcher`: starts one agent per host (locally or over SSH) and stops them.

This `__init__` imports nothing.
"""
