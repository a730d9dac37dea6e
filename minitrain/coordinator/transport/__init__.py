"""The coordinator's wire edge, where protobuf is allowed: the gRPC server, the agent streams' service, the
workers' direct streams and the local agents' Unix socket. Messages are turned into events here and nowhere else."""
