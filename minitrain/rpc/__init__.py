"""gRPC plumbing (L1): generated code, auth, channel/server factories, proto <-> record conversion; and
the fork server's socket protocol (`fork_protocol`), which the agent and the worker share."""
