"""The agent's wire edge, where protobuf is allowed: its stream to the coordinator (gRPC or the local socket) and
the relay its workers write their reports to."""
