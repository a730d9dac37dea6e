"""The node agent's one stream with the coordinator: the agent's transport edge (L2).

`CoordinatorStream` holds the `Coordinator.AgentStream` call (or, for an agent on the coordinator's
machine, its local counterpart, minitrain.agent.transport.local_call) and everything that travels on it, so the
agent's supervision (minitrain.agent.agent) never sees protobuf:
- upward, one FIFO queue: the hello (from a `NodeInfo`), the facts the agent reports through typed
  methods (`spawned`, `exited`, `log_line`, `stack_dump`), in the order they were called,
  interleaved with the relayed worker streams (minitrain.agent.transport.relay, owned here: its items share
  this queue, so a worker's Done goes up before its WorkerExited), and a heartbeat when nothing else
  was queued for HEARTBEAT_INTERVAL_S. What is queued together goes up as one message
  (`minitrain.agent.transport.relay.coalesce`: runs of relayed items as one RelayedUp, several messages as one
  AgentBatch). Every message carries `sent_at`, the wall clock when it was
  queued, from which the coordinator's lease allows for its own backlog (minitrain.lease): at one
  report a second, heartbeats sent anyway were half of what thousands of agents sent the coordinator;
- downward, a reader thread: every message renews the lease on the coordinator (minitrain.lease),
  relayed worker commands go straight to the relay, and commands are converted to the records of
  `minitrain.commands` (minitrain.rpc.convert) and queued for `next_command`. A Shutdown is not
  queued: it ends the stream at once (read later as `shutdown`), and nothing after it is read.

The stream ends, once, with a reason: the coordinator's Shutdown, the coordinator closing the
stream, the connection breaking, the lease running out (nothing heard for LEASE_TIMEOUT_S plus the
latest stamped message's delay), or the agent's `end(reason)`. Its end wakes `next_command` at once.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Optional

import grpc

from minitrain import commands as cmd
from minitrain.agent.transport.local_call import LocalAgentCall, LocalStreamBroken
from minitrain.agent.transport.relay import RelayServer, coalesced_requests
from minitrain.lease import HEARTBEAT_INTERVAL_S, LEASE_CHECK_INTERVAL_S, LEASE_TIMEOUT_S, Lease, until_heartbeat_s
from minitrain.records import NodeInfo
from minitrain.rpc import convert
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.auth import call_metadata
from minitrain.rpc.channel import END_OF_STREAM, client_channel
from minitrain.rpc.digest import fold_reports


_WAKE = object()  # on the command queue: the stream ended, the command loop should look now
# How long close() lets a local stream write what was queued before it ends the stream.
LOCAL_CLOSE_TIMEOUT_S = 2.0


class CoordinatorStream:
    """The agent's stream with the coordinator at `address`; see the module docstring.

    `open(node)` once, then the fact methods and `next_command` from any thread, `close()` once at the
    end (after the workers are stopped: their last messages go up first). `tls_cert` is the run's
    certificate (PEM) to pin, empty for a loopback coordinator. With `local_address` (the coordinator's
    local socket, "local:<path>", for an agent on its machine) the stream goes there instead of over gRPC
    (`minitrain.agent.transport.local_call`); everything on it is the same.
    """

    def __init__(self, address: str, node_id: str, run_id: str, token: str,
                 lease_timeout_s: float = LEASE_TIMEOUT_S, tls_cert: bytes = b"", local_address: str = ""):
        self._address = address
        self._local_address = local_address
        self._node_id = node_id
        self._run_id = run_id
        self._token = token
        self._tls_cert = tls_cert
        self._outbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._commands: "queue.SimpleQueue" = queue.SimpleQueue()
        self._lease = Lease(lease_timeout_s)  # the coordinator's (see minitrain.lease)
        self._ended = threading.Event()
        self._end_lock = threading.Lock()
        self._end_reason = ""
        self._shutdown: Optional[cmd.Shutdown] = None
        self._channel: Optional[grpc.Channel] = None
        self._call = None
        # Workers dial this relay, not the coordinator: their messages go up on this one stream, in
        # the outbox's order with the agent's (minitrain.agent.transport.relay). Started by open().
        self._relay = RelayServer(token, send_up=self._queue_relayed)
        self._last_queued = time.monotonic()  # when anything was last queued upward (heartbeats skip then)

    # ------------------------------------------------------------------ life

    def open(self, node: NodeInfo) -> None:
        """Start the relay, say hello as `node`, open the call and its reader and heartbeat threads.

        Raises (leaving nothing open) when the relay cannot start or the local socket cannot be reached.
        Commands come once the coordinator read the hello, so the relay listens before any worker can
        be started.
        """
        self._relay.start()
        self._put(hello=convert.hello_from_node(node))
        requests = coalesced_requests(self._outbox, self._relayed_batch, self._bundle)
        try:
            if self._local_address:
                self._call = LocalAgentCall(self._local_address, self._token, requests)
            else:
                self._channel = client_channel(self._address, self._tls_cert)
                stub = pb_grpc.CoordinatorStub(self._channel)
                # wait_for_ready: a connection refused by a flooded server is retried; the lease bounds the wait.
                self._call = stub.AgentStream(requests, metadata=call_metadata(self._token), wait_for_ready=True)
        except BaseException:
            if self._channel is not None:
                self._channel.close()
            self._relay.stop()
            raise
        threading.Thread(target=self._receive, name="agent-commands", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="agent-heartbeat", daemon=True).start()

    def close(self) -> None:
        """Stop the relay (its streams' last messages and ends go up first), send what is queued, end
        the call. After `open()` only."""
        self._relay.stop()
        self._outbox.put(END_OF_STREAM)
        if self._channel is None:
            self._call.close(LOCAL_CLOSE_TIMEOUT_S)
        else:
            self._call.cancel()
            self._channel.close()

    def end(self, reason: str) -> None:
        """End the stream with `reason` (the first reason given stays): heartbeats stop, `ended`
        turns True, a waiting `next_command` returns. Takes a lock: never from a signal handler."""
        with self._end_lock:
            if not self._ended.is_set():
                self._end_reason = reason
                self._ended.set()
        self._commands.put(_WAKE)

    def wake(self) -> None:
        """Make a waiting `next_command` return now. Safe in a signal handler: SimpleQueue.put is
        reentrant (Python documents it for signal handlers and __del__)."""
        self._commands.put(_WAKE)

    @property
    def ended(self) -> bool:
        """True once the stream ended (see the module docstring for why it does)."""
        return self._ended.is_set()

    @property
    def end_reason(self) -> str:
        """Why the stream ended, for the agent's log ("" while it has not)."""
        return self._end_reason

    @property
    def shutdown(self) -> Optional[cmd.Shutdown]:
        """The coordinator's Shutdown, once it came (the stream ended with it); None otherwise."""
        return self._shutdown

    @property
    def relay_address(self) -> str:
        """What this node's workers dial for a relayed stream ("local:...", after `open()`)."""
        return self._relay.address

    # ------------------------------------------------------------------ downward

    def next_command(self, timeout_s: float) -> Optional[cmd.AgentCommand]:
        """The coordinator's next command (never a Shutdown: see `shutdown`), or None when none came
        within `timeout_s` or the stream ended meanwhile."""
        try:
            command = self._commands.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return None if command is _WAKE else command

    def _receive(self) -> None:
        reason = ""
        try:
            for message in self._call:
                kind = message.WhichOneof("body")
                self._lease.heard(message.heartbeat.sent_at if kind == "heartbeat" else None)
                if kind == "relayed":
                    # Straight to the workers' streams: the command loop may be busy spawning.
                    self._relay.deliver(message.relayed)
                    continue
                command = convert.agent_command_from_message(message)
                if isinstance(command, cmd.Shutdown):
                    self._shutdown = command  # before the end: whoever sees the end sees why
                    reason = f"the coordinator shut the run down ({command.reason})"
                    break
                if command is not None:
                    self._commands.put(command)
            else:
                reason = "the coordinator closed the stream"
        except grpc.RpcError as exc:
            details = exc.details() if hasattr(exc, "details") else ""
            reason = f"the connection broke: {exc.code().name}" + (f" ({details})" if details else "")
        except LocalStreamBroken as exc:
            reason = str(exc)
        finally:
            self.end(reason)  # wakes the command loop now, not at its next poll

    def _heartbeat(self) -> None:
        """Check the lease on the coordinator every LEASE_CHECK_INTERVAL_S, and send a heartbeat whenever
        nothing else was queued for HEARTBEAT_INTERVAL_S (any message renews the agent's lease at the
        coordinator)."""
        wait_s = min(HEARTBEAT_INTERVAL_S, LEASE_CHECK_INTERVAL_S)
        while not self._ended.wait(wait_s):
            if self._lease.expired():
                self.end(f"the coordinator sent {self._lease.describe()}")
                return
            until_s = until_heartbeat_s(time.monotonic() - self._last_queued, HEARTBEAT_INTERVAL_S)
            if not until_s:
                self._put(heartbeat=pb.Heartbeat())  # (stamped like every message: the lease reads `sent_at`)
                until_s = HEARTBEAT_INTERVAL_S
            wait_s = min(until_s, LEASE_CHECK_INTERVAL_S)

    # ------------------------------------------------------------------ upward

    def _put(self, **body) -> None:
        """Queue one message of the agent's own, stamped now."""
        self._last_queued = time.monotonic()
        self._outbox.put(pb.AgentMessage(run_id=self._run_id, node_id=self._node_id,
                                         sent_at=time.time(), **body))

    def _queue_relayed(self, items: list) -> None:
        """The relay's `send_up`: queue worker streams' items (one read's) with the time (see
        coalesced_requests)."""
        self._last_queued = time.monotonic()
        self._outbox.put((time.time(), items))

    def _bundle(self, messages: list) -> pb.AgentMessage:
        # Messages queued together go as one (an AgentBatch), stamped with the first one's time.
        return pb.AgentMessage(run_id=self._run_id, node_id=self._node_id, sent_at=messages[0].sent_at,
                               batch=pb.AgentBatch(messages=messages))

    def _relayed_batch(self, items: list, queued_at: float) -> pb.AgentMessage:
        # Runs of plain reports go up as progress digests (minitrain.rpc.digest): one packed item per
        # run instead of a nested message per report for the coordinator to walk.
        return pb.AgentMessage(run_id=self._run_id, node_id=self._node_id, sent_at=queued_at,
                               relayed=pb.RelayedUp(items=fold_reports(items, self._run_id)))

    def spawned(self, attempt: int, rank: int, pid: int) -> None:
        """Report that worker `rank` of `attempt` runs as process `pid`."""
        self._put(spawned=pb.WorkerSpawned(attempt=attempt, rank=rank, pid=pid))

    def exited(self, attempt: int, rank: int, pid: int, *, exit_code: Optional[int], signal: Optional[int],
               stopped_by_agent: bool, exited_at: float, spawn_error: str = "",
               oom_suspected: bool = False) -> None:
        """Report the end of worker `rank` of `attempt`: its exit code, or the signal that killed it
        (None for the other), whether the agent stopped it, when; `spawn_error` when it could not be
        started at all (pid 0), `oom_suspected` when the kernel's OOM killer probably killed it.

        What the worker wrote to its relayed stream goes up first: the relay reads it now (a worker
        killed outright leaves its last reports in its socket, and the relay reads on an interval)."""
        if pid:
            self._relay.drain()
        self._put(exited=pb.WorkerExited(
            attempt=attempt, rank=rank, pid=pid, exit_code=exit_code or 0, signal=signal or 0,
            stopped_by_agent=stopped_by_agent, exited_at=exited_at, spawn_error=spawn_error,
            oom_suspected=oom_suspected))

    def log_line(self, attempt: int, rank: int, stderr: bool, line: str) -> None:
        """Forward one output line (without its newline) of worker `rank` of `attempt`."""
        self._put(logs=pb.LogLines(attempt=attempt, rank=rank, stderr=stderr, lines=[line]))

    def preemption(self, signal_name: str, received_at: float) -> None:
        """Say this agent received the preemption signal `signal_name`."""
        self._put(preemption=pb.PreemptionSignal(signal=signal_name, received_at=received_at))

    def warmed(self, ready: bool, detail: str) -> None:
        """Answer a warm-up for a start: its fork server is `ready`, or there will be none (`detail`)."""
        self._put(warmed=pb.WarmedUp(ready=ready, detail=detail))

    def persisted(self, attempt: int, dir_name: str, ranks: tuple[int, ...], error: str = "",
                  to_peer: str = "") -> None:
        """Say the shards of `ranks` of checkpoint `dir_name` (attempt `attempt`) are on storage (or, with
        `to_peer`, in that node's tier), or, with `error`, that they could not be written there."""
        self._put(persisted=pb.ShardsPersisted(attempt=attempt, dir_name=dir_name, ranks=list(ranks), error=error,
                                               to_peer=to_peer))

    def replica_ready(self, port: int) -> None:
        """Say this node's tier takes replicas on `port` of the node's address."""
        self._put(replica=pb.ReplicaReady(port=port))

    def stack_dump(self, attempt: int, rank: int, text: str) -> None:
        """Send the thread stacks worker `rank` of `attempt` wrote ("" when it wrote none in time)."""
        self._put(stack_dump=pb.StackDump(attempt=attempt, rank=rank, text=text))
