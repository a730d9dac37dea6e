"""minitrain.lease: a peer is silent after the timeout plus the delay of its latest stamped message, capped."""

from __future__ import annotations

from minitrain.lease import MAX_BACKLOG_S, Lease, reader_lag_s


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


def test_the_lag_of_a_peer_is_its_delay_beyond_its_quickest_message_so_a_skewed_clock_adds_nothing():
    clocks = Clocks()
    peer = lease(clocks)
    peer.heard(sent_at=clocks.wall - 30.2)  # its clock is 30 s behind, the network takes 0.2 s
    assert abs(peer.backlog_s - 30.2) < 1e-9 and peer.lag_s == 0.0
    clocks.advance(1.0)
    peer.heard(sent_at=clocks.wall - 38.2)  # read 8 s later than it could have been
    assert abs(peer.lag_s - 8.0) < 1e-9
    peer.heard(sent_at=clocks.wall - 30.2)
    assert abs(peer.lag_s) < 1e-9


def test_a_reader_that_falls_behind_judges_no_live_peer_silent_for_its_own_delay():
    """The failure this prevents (bench scale, 4096 x 10 Hz on 2 cores): a live agent whose latest
    message came 4.2 s late went unread for 9.7 s while the coordinator read the others 10 s late."""
    clocks = Clocks()
    quiet, busy = lease(clocks), lease(clocks)
    for peer in (quiet, busy):
        peer.heard(sent_at=clocks.wall - 0.1)  # while the reader kept up
    quiet.heard(sent_at=clocks.wall - 4.3)  # read 4.2 s late
    clocks.advance(9.0)
    since = clocks.mono - 1.0
    busy.heard(sent_at=clocks.wall - 10.1)  # meanwhile the others are read 10 s late
    clocks.advance(0.7)
    lag = reader_lag_s([quiet, busy], since)
    assert abs(lag - 10.0) < 1e-9
    assert quiet.expired() and not quiet.expired(lag)  # 9.7 s > 5 + 4.2, but < 5 + 10
    assert "the coordinator read its agents 10.0 s late" in quiet.describe(lag)
    clocks.advance(5.4)
    assert quiet.expired(lag)  # a dead peer is still found: the reader's lag later
    assert reader_lag_s([quiet, busy], clocks.mono) is None  # nobody read since: unknown


def test_one_peer_on_a_slow_path_does_not_lengthen_every_lease_but_a_reader_behind_on_all_does():
    clocks = Clocks()
    peers = [lease(clocks) for _ in range(20)]
    for peer in peers:
        peer.heard(sent_at=clocks.wall - 0.1)
    since = clocks.mono
    clocks.advance(1.0)
    for peer in peers[1:]:
        peer.heard(sent_at=clocks.wall - 0.1)
    peers[0].heard(sent_at=clocks.wall - 30.1)  # its own link is 30 s slow now
    assert reader_lag_s(peers, since) < 1e-9
    for peer in peers:
        peer.heard(sent_at=clocks.wall - 10.1)  # the reader is 10 s behind on everyone
    assert abs(reader_lag_s(peers, since) - 10.0) < 1e-9
