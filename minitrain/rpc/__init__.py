"""gRPC plumbing (L1): generated code, auth, channel/server factories, proto <-> record conversion."""
