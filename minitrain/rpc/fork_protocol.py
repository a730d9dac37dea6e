"""The fork server's socket protocol (L1): the datagrams a node agent (`minitrain.agent.fork_servers`)
and its fork server (`minitrain.worker.fork_server`, whose docstring tells the whole exchange) send each
other on their SOCK_SEQPACKET socket pair. One owner, as the two ends may not import each other."""

READY = b"ready"  # fork server -> agent, once: torch.distributed is imported, it can fork workers
WARM = b"warm"  # fork server -> agent, once, after READY, between two answers: every preload is done too
FORK = b"fork"  # agent -> fork server: fork workers (FDS_PER_WORKER file descriptors for each)
FDS_PER_WORKER = 4  # stdin, stdout, stderr, stack-dump file
# A FORK carries at most this many workers' descriptors (the kernel passes at most 253 in one datagram;
# a node with more local ranks sends several requests)
MAX_FORKS_PER_REQUEST = 32
