"""minitrain.lease: a peer is silent after the timeout plus the delay of its latest stamped message, capped."""

from __future__ import annotations

from minitrain.lease import MAX_BACKLOG_S, Lease


class Clocks:
    def __init__(self):
        self.mono, self.wall = 100.0, 1_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def lease(clocks: Clocks, timeout_s: float = 5.0) -> Lease:
    return Lease(timeout_s, clock=lambda: clocks.mono, wall=lambda: clocks.wall)


def test_silence_past_the_timeout_expires_and_any_message_renews():
    clocks = Clocks()
    peer = lease(clocks)
    clocks.advance(4.9)
    assert not peer.expired()
    peer.heard()
    clocks.advance(5.0)
    assert not peer.expired() and peer.silent_s() == 5.0
    clocks.advance(0.1)
    assert peer.expired()
    assert peer.describe().startswith("nothing for 5.1 s (lease 5 s, plus 0.0 s")


def test_a_heartbeat_read_late_extends_the_lease_by_its_delay_until_one_arrives_on_time():
    clocks = Clocks()
    peer = lease(clocks)
    peer.heard(sent_at=clocks.wall - 12.0)  # queued 12 s behind the peer's data
    clocks.advance(16.0)
    assert not peer.expired()  # 16 s < 5 + 12
    clocks.advance(1.5)
    assert peer.expired()
    peer.heard(sent_at=clocks.wall - 0.2)  # the backlog drained: back to the plain timeout
    clocks.advance(5.3)
    assert peer.expired()


def test_clock_skew_never_shortens_and_never_switches_off_the_lease():
    clocks = Clocks()
    peer = lease(clocks)
    peer.heard(sent_at=clocks.wall + 30.0)  # the peer's clock is ahead: no negative backlog
    assert peer.backlog_s == 0.0
    peer.heard(sent_at=clocks.wall - 3600.0)  # an hour behind: capped
    assert peer.backlog_s == MAX_BACKLOG_S
    clocks.advance(5.0 + MAX_BACKLOG_S + 0.1)
    assert peer.expired()
    peer.heard(sent_at=0.0)  # not stamped: the delay stays as it was
    assert peer.backlog_s == MAX_BACKLOG_S


def test_an_agent_owes_a_heartbeat_only_after_a_whole_interval_of_quiet():
    from minitrain.lease import until_heartbeat_s

    assert until_heartbeat_s(0.0, 1.0) == 1.0  # it just sent something: a whole interval to go
    assert until_heartbeat_s(0.25, 1.0) == 0.75
    assert until_heartbeat_s(1.0, 1.0) == 0.0 and until_heartbeat_s(7.0, 1.0) == 0.0  # due now
