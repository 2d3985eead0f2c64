"""The broker's registry on its own, with no socket and a clock passed in.

Hand-written stories pin the HELLO checks down in PROTOCOL.md's order (range, granted ranks, size,
digest, a live holder), takeover, expiry and the swarm's schema; then a hypothesis state machine
drives connections that follow the protocol through arbitrary interleavings of HELLO, requests,
BYE, silence and expiry, and checks after every step that the table stays one binding per rank
and that no live holder was ever displaced without a same-key takeover.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import topologies
from gossiprl.comms import wire
from gossiprl.comms.registry import Registry, describe, ranges
from gossiprl.comms.turnlocks import TurnLocks
from gossiprl.comms.wire import WireError

DIGEST = "d" * 16
SCHEMA = (("w", "float32", (2, 3)),)


def hello(reg, identity, rank, now, *, key=None, granted=None, **fields):
    """A HELLO header as the broker hands it over (``n``, ``topology``, ``takeover`` when given)."""
    return reg.hello(identity, {"rank": rank, **fields}, now, key=key, granted=granted)


def refusal(fn, *args, **kwargs) -> str:
    with pytest.raises(WireError) as err:
        fn(*args, **kwargs)
    return err.value.code


def test_hello_binds_a_rank_to_its_connection_and_any_message_keeps_it_alive():
    reg = Registry(3, DIGEST, peer_timeout=10.0)
    assert hello(reg, b"a", 1, 0.0, n=3, topology=DIGEST) is None
    peer = reg.seen(b"a", now=7.0)
    assert (peer.rank, peer.identity, peer.registrations, peer.last_seen) == (1, b"a", 1, 7.0)
    assert reg.expired(now=16.0) == [] and reg.expired(now=17.5) == [peer]


def test_hello_checks_come_in_protocol_order_and_a_refusal_changes_nothing():
    reg = Registry(3, DIGEST, peer_timeout=10.0)
    hello(reg, b"holder", 0, 0.0, key="k1")
    before = [(p.identity, p.registrations, p.last_seen) for p in reg.peers]
    # each case breaks every later check too: the first failing check must be the one reported
    assert refusal(hello, reg, b"x", 3, 1.0, n=4, topology="other", granted={1}) == "rank-range"
    assert refusal(hello, reg, b"x", 0, 1.0, n=4, topology="other", granted={1, 2}) == "rank-forbidden"
    assert refusal(hello, reg, b"x", 0, 1.0, n=4, topology="other", granted={0}) == "topology-mismatch"
    assert refusal(hello, reg, b"x", 0, 1.0, n=3, topology="other") == "topology-mismatch"
    assert refusal(hello, reg, b"x", 0, 1.0, n=3, topology=DIGEST) == "rank-taken"
    assert refusal(hello, reg, b"x", 0, 1.0, takeover=True, key="k2") == "rank-taken"
    assert [(p.identity, p.registrations, p.last_seen) for p in reg.peers] == before
    assert set(reg.by_identity) == {b"holder"}


def test_the_forbidden_rank_error_lists_the_granted_ranks():
    reg = Registry(8, DIGEST, peer_timeout=10.0)
    with pytest.raises(WireError, match=r"may hold ranks 0-2,5, not rank 7"):
        hello(reg, b"x", 7, 0.0, granted={0, 1, 2, 5})


def test_takeover_with_the_same_key_displaces_the_live_holder_and_names_it():
    reg = Registry(2, DIGEST, peer_timeout=10.0)
    hello(reg, b"old", 1, 0.0, key="k")
    reg.peers[1].queued.append("unsent")
    assert hello(reg, b"new", 1, 1.0, takeover=True, key="k") == b"old"
    assert set(reg.by_identity) == {b"new"} and reg.peers[1].registrations == 2
    assert not reg.peers[1].queued, "what the socket held for the old connection was kept"
    assert refusal(reg.seen, b"old", 2.0) == "not-registered"


def test_a_silent_holder_may_be_replaced_without_takeover_and_a_repeated_hello_displaces_no_one():
    reg = Registry(2, DIGEST, peer_timeout=10.0)
    hello(reg, b"a", 0, 0.0)
    assert hello(reg, b"a", 0, 5.0) is None and reg.peers[0].registrations == 2
    assert hello(reg, b"b", 0, 15.0) == b"a", "a holder silent for 10 s is no longer live"


def test_leaving_records_bye_and_the_last_to_leave_forgets_the_schema():
    reg = Registry(2, DIGEST, peer_timeout=10.0)
    hello(reg, b"a", 0, 0.0)
    hello(reg, b"b", 1, 0.0)
    reg.pin_schema(SCHEMA, 100)
    assert reg.leave(reg.peers[0], bye=True) is False and reg.schema == SCHEMA
    assert not reg.done(), "rank 1 is still registered"
    assert reg.leave(reg.peers[1]) is True and reg.schema is None
    assert reg.said_bye == {0} and not reg.done(), "rank 1 vanished without BYE: it may come back"
    hello(reg, b"c", 1, 1.0)
    reg.leave(reg.peers[1], bye=True)
    assert reg.done()
    hello(reg, b"d", 0, 2.0)
    assert reg.said_bye == {1}, "a rank that registers again has not said BYE"


def test_a_rank_that_never_came_keeps_the_swarm_unfinished():
    reg = Registry(2, DIGEST, peer_timeout=10.0)
    hello(reg, b"a", 0, 0.0)
    reg.leave(reg.peers[0], bye=True)
    assert not reg.done()


def test_the_first_letter_pins_the_schema_and_a_different_one_is_refused_naming_both():
    reg = Registry(1, DIGEST, peer_timeout=10.0)
    hello(reg, b"a", 0, 0.0)
    reg.pin_schema(SCHEMA, 100)
    other = tuple((f"t{k}", "float16", (k,)) for k in range(5))
    with pytest.raises(WireError, match=r"t0:float16\[0\], t1:float16\[1\], t2:float16\[2\], \.\.\.\] \(5 tensors\)"):
        reg.pin_schema(other, 100)
    assert reg.schema == SCHEMA


def test_stats_join_the_connection_side_with_the_locks_side():
    reg = Registry(2, DIGEST, peer_timeout=10.0)
    locks = TurnLocks(topologies.make("ring", 2))
    hello(reg, b"a", 0, 0.0)
    locks.publish(0, 1, 0, {}, [b"xy"], 2, now=0.0)
    locks.gone(1, now=0.0)
    stats = reg.stats(locks)
    assert stats[0] | {"waited_on": None} == {
        "registered": True,
        "round": 0,
        "publishes": 1,
        "collects": 0,
        "bytes_in": 2,
        "bytes_out": 0,
        "publish_wait_s": 0.0,
        "collect_wait_s": 0.0,
        "waited_on": None,
        "registrations": 1,
        "gone": False,
        "said_bye": False,
        "parked": [],
    }
    assert stats[1]["gone"] and not stats[1]["registered"] and stats[1]["registrations"] == 0


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "60"])
def test_peer_timeout_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match="peer_timeout must be a finite number of seconds > 0"):
        Registry(2, DIGEST, peer_timeout=bad)


def test_a_rank_is_an_int_of_the_swarm_numpy_ints_included():
    reg = Registry(4, DIGEST, peer_timeout=10.0)
    assert reg.rank(np.int64(3)) == 3 and reg.rank(0) == 0
    for bad in (4, -1, 1.0, "1", True, None):
        with pytest.raises(ValueError, match="rank must be an int from 0 to 3"):
            reg.rank(bad)


def test_helpers_for_error_messages():
    assert ranges({7, 0, 1, 2, 3}) == "0-3,7" and ranges([4]) == "4"
    assert describe(SCHEMA) == "[w:float32[2, 3]] (1 tensors)"


# ------------------------------------------------------------ property: any interleaving

N, TIMEOUT = 3, 5.0
ranks = st.integers(0, N - 1)
connections = st.integers(0, 2)
"""Per rank, three connections: a restarted process, a second copy; connection 2 holds another key."""


def identity(rank: int, conn: int) -> bytes:
    return bytes([rank, conn])


def key_of(conn: int) -> str:
    return "other" if conn == 2 else "same"


class Connections(RuleBasedStateMachine):
    """Connections that follow the protocol: each says HELLO only for its own rank."""

    def __init__(self):
        super().__init__()
        self.reg = Registry(N, DIGEST, TIMEOUT)
        self.now = 0.0
        self.successes = [0] * N

    @rule(rank=ranks, conn=connections, takeover=st.booleans())
    def hello(self, rank, conn, takeover):
        me, holder = identity(rank, conn), self.reg.peers[rank]
        live_other = holder.identity not in (None, me) and self.now - holder.last_seen < TIMEOUT
        may_take = takeover and key_of(conn) == holder.key
        was = holder.identity
        try:
            displaced = hello(self.reg, me, rank, self.now, takeover=takeover, key=key_of(conn))
        except WireError as err:
            assert err.code == "rank-taken" and live_other and not may_take
            assert holder.identity == was
            return
        assert not live_other or may_take, "a live holder was displaced without a same-key takeover"
        assert displaced == (was if was not in (None, me) else None)
        self.successes[rank] += 1

    @rule(rank=ranks, conn=connections)
    def request(self, rank, conn):
        me = identity(rank, conn)
        bound = self.reg.peers[rank].identity == me
        try:
            peer = self.reg.seen(me, self.now)
        except WireError as err:
            assert err.code == "not-registered" and not bound
            return
        assert bound and peer.last_seen == self.now

    @rule(rank=ranks, bye=st.booleans())
    def leave(self, rank, bye):
        peer = self.reg.peers[rank]
        if peer.identity is not None:
            self.reg.leave(peer, bye=bye)
            assert (rank in self.reg.said_bye) == bye

    @rule(seconds=st.sampled_from([0.5, 2.0, 6.0]))
    def time_passes(self, seconds):
        self.now += seconds

    @rule()
    def expire(self):
        silent = self.reg.expired(self.now)
        assert all(self.now - p.last_seen > TIMEOUT for p in silent)
        for peer in silent:
            self.reg.leave(peer)
        assert self.reg.expired(self.now) == []

    @rule(other=st.booleans())
    def publish(self, other):
        if not self.reg.by_identity:
            return
        schema = (("w", "float16" if other else "float32", (2,)),)
        try:
            self.reg.pin_schema(schema, 100)
        except WireError as err:
            assert err.code == "schema-mismatch" and self.reg.schema != schema
            return
        assert self.reg.schema == schema

    @invariant()
    def one_binding_per_rank_both_ways(self):
        bound = {p.identity: p for p in self.reg.peers if p.identity is not None}
        assert self.reg.by_identity == bound
        assert all(ident[0] == p.rank for ident, p in bound.items())

    @invariant()
    def registrations_count_successful_hellos(self):
        assert [p.registrations for p in self.reg.peers] == self.successes

    @invariant()
    def no_schema_outlives_the_swarm(self):
        if not self.reg.by_identity:
            assert self.reg.schema is None

    @invariant()
    def done_means_everyone_came_and_said_bye(self):
        expected = all(
            s and self.reg.peers[r].identity is None and r in self.reg.said_bye for r, s in enumerate(self.successes)
        )
        assert self.reg.done() == expected


TestConnections = Connections.TestCase
TestConnections.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_once_the_schema_is_set_it_bounds_a_member_s_header_and_tensor_count():
    """Issue 19 B6: a registered peer's 4,096-spec PUBLISHes cost the broker 37 ms of parsing each."""
    reg = Registry(4, DIGEST, peer_timeout=10.0)
    assert reg.header_limit() is None  # no schema yet: anything the wire limits allow
    reg.pin_schema(SCHEMA, 300)
    limit = 300 + Registry.TENSOR_SLACK * len(SCHEMA) + 9 * 4 + Registry.SLACK
    assert reg.header_limit() == limit
    reg.pin_schema(SCHEMA, 900)
    assert reg.header_limit() == limit, "the letter that set the schema sets the limit, not the latest"
    with pytest.raises(WireError, match=r"schema of 4096 tensors differs from the swarm's \[w:float32") as err:
        reg.check_tensor_count(4096)
    assert err.value.code == "schema-mismatch"
    reg.check_tensor_count(len(SCHEMA))


def _publish(tensors: dict) -> wire.Message:
    """A PUBLISH as the broker holds it before check_letter: header decoded, specs not yet parsed."""
    schema, buffers = wire.pack_tensors(tensors)
    frames = wire.encode(wire.PUBLISH, {"seq": 1, "round": 0, "tensors": schema}, buffers)
    return wire.decode_header([bytes(memoryview(f)) for f in frames])


def test_check_letter_pins_the_first_schema_and_refuses_another_count_or_shape():
    reg = Registry(2, DIGEST, peer_timeout=10.0)
    first = _publish({"w": np.zeros((2, 3), np.float32)})
    reg.check_letter(first, wire.DEFAULT_MAX_PAYLOAD_BYTES)
    assert reg.schema == (first.specs[0].schema_key,) and reg.letter_header == first.header_bytes
    reg.check_letter(_publish({"w": np.ones((2, 3), np.float32)}), wire.DEFAULT_MAX_PAYLOAD_BYTES)
    two = _publish({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)})
    assert refusal(reg.check_letter, two, wire.DEFAULT_MAX_PAYLOAD_BYTES) == "schema-mismatch"
    assert two.specs == [], "a letter of another tensor count is refused before its specs are parsed"
    other = _publish({"w": np.zeros((3, 2), np.float32)})
    assert refusal(reg.check_letter, other, wire.DEFAULT_MAX_PAYLOAD_BYTES) == "schema-mismatch"
