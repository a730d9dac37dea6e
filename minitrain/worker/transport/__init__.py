"""The worker's wire edge, where protobuf is allowed: the report client and its two transports (to the agent's
relay over a local socket, or straight to the coordinator over gRPC)."""
