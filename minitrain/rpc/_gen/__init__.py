"""Generated protobuf/gRPC code; do not edit."""
