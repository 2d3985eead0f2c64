"""Bad input gets a clear ERROR and the broker keeps serving: one test per class of bad input
(PROTOCOL.md section 4), then a fuzz run (hypothesis-built headers, mutations of them, raw random
frames, oversize frames, from 8 raw DEALER sockets) while real agents gossip through the same broker.

Every test talks to a live Broker on tcp://127.0.0.1:0 over real sockets. Replies on one DEALER
socket come back in the order its requests went out, so each reply is matched to the input that
caused it and its ERROR code is checked exactly.
"""

import collections
import random
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from zmq.utils.monitor import recv_monitor_message

import topologies
from brokers import (
    MIB,
    ask,
    assert_error,
    assert_pair_gossips,
    close_broker,
    dealer,
    gossip_rounds,
    head,
    leave,
    letter,
    new_broker,
    publish_frames,
    register,
)
from gossiprl import Broker, GossipClient, mix
from gossiprl.comms import wire
from gossiprl.comms.broker import MAX_HELLO_BYTES
from helpers import wait_for

# Codes a broker answers with (PROTOCOL.md section 4), the keys of stats()["errors"]. What is no
# one's error ("undeliverable", "expired", "letters-dropped-by-rewiring", ...) is in stats()["events"].
REPLY_CODES = {
    "bad-message",
    "bad-dtype",
    "too-large",
    "version",
    "unknown-command",
    "not-registered",
    "rank-range",
    "rank-taken",
    "rank-forbidden",
    "taken-over",
    "topology-mismatch",
    "schema-mismatch",
    "internal",
}


# ---------------------------------------------------------------- helpers


def readable_seq(frames):
    """The seq a refusal must echo (PROTOCOL.md section 4): the request's seq when its header
    reads as a msgpack map under the wire rules and the seq is in range, else nil."""
    try:
        header = msgpack.unpackb(frames[0], raw=False, strict_map_key=True, max_bin_len=0)
    except Exception:  # noqa: BLE001 - unreadable in any way means nil
        return None
    seq = header.get("seq") if isinstance(header, dict) else None
    return seq if type(seq) is int and 0 <= seq <= wire.MAX_UINT else None


@pytest.fixture
def raw(ring2):
    sock = dealer(ring2)
    yield sock
    sock.close(linger=0)


# ---------------------------------------------------------------- one test per class of bad input


@pytest.mark.timeout(20)
def test_malformed_frames_get_bad_message(ring2, raw):
    spec = {"name": "x", "dtype": "float32", "shape": [2], "nbytes": 8}
    cases = [  # seq is echoed wherever the header reads as a map with an int seq
        [b""],
        [b"\xc1garbage"],
        [b"\x85\xa1v"],  # truncated map
        [b"\x82\xa1v\x01\xa3cmd\xa2\xff\xfe"],  # cmd is not UTF-8
        [msgpack.packb([1, 2])],
        [msgpack.packb(7)],
        [msgpack.packb({1: 2, "v": 1, "cmd": "PING"})],  # non-string map key
        [msgpack.packb({"v": 1, "cmd": "PING", "blob": b"bytes"}, use_bin_type=True)],  # bin value
        [head("PING", seq="1")],
        [head("PING", seq=1), b"extra payload"],
        [head("HELLO", seq=1)],  # no rank
        [head("HELLO", seq=1, rank="0")],
        [head("HELLO", seq=1, rank=True)],
        [head("HELLO", seq=1, rank=[[[[[[[[0]]]]]]]])],
        [head("COLLECT", seq=1)],  # no round
        [head("PUBLISH", round=0, tensors=[spec]), b"\0" * 8],  # no seq
        [head("PUBLISH", seq=1, round=0, tensors=[spec])],  # frame missing
        [head("PUBLISH", seq=1, round=0, tensors=[spec]), b"\0" * 8, b"\0" * 8],  # one too many
        [head("PUBLISH", seq=1, round=0, tensors=[spec]), b"\0" * 7],
        [
            head("PUBLISH", seq=1, round=0, tensors=[]),
        ],
        [head("PUBLISH", seq=1, round=0, tensors="x"), b"\0" * 8],
        [head("PUBLISH", seq=1, round=0, tensors=[spec, spec]), b"\0" * 8, b"\0" * 8],  # duplicate name
        [head("PUBLISH", seq=1, round=0, tensors=[{**spec, "nbytes": 9}]), b"\0" * 9],
        [head("PUBLISH", seq=1, round=0, tensors=[{**spec, "shape": [-2], "nbytes": -8}]), b""],
        [head("PUBLISH", seq=1, round=0, tensors=[{**spec, "shape": [1] * 9, "nbytes": 4}]), b"\0" * 4],
        [head("PUBLISH", seq=1, round=0, tensors=[{**spec, "name": ""}]), b"\0" * 8],
        [head("PUBLISH", seq=1, round=0, tensors=[{**spec, "name": "n" * 257}]), b"\0" * 8],
        [head("DELIVER", seq=1, messages="none")],
        [head("PUBLISH", seq=1, round=-1, tensors=[spec]), b"\0" * 8],  # every int field has its range
        [head("COLLECT", seq=1, round=True)],  # bool is not an int on the wire
        [head("COLLECT", seq=-1, round=0)],
        [head("HELLO", seq=1, rank=0, n=-1)],
        [head("HELLO", seq=1, rank=0, takeover=1)],
        [head("HELLO", seq=1, rank=0, topology=7)],
    ]
    register(raw)
    for frames in cases:
        assert_error(ask(raw, frames), "bad-message", seq=readable_seq(frames))
    assert ring2.stats()["errors"] == {"bad-message": len(cases)}
    assert ring2.stats()["agents"][0]["publishes"] == 0, "a refused letter was kept"
    leave(raw)
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_dtype_outside_the_list_gets_bad_dtype(ring2, raw):
    for dtype, decode_as, nbytes in [
        ("complex64", None, 8),
        ("object", None, 8),
        ("float128", None, 16),
        ("", None, 8),
        (7, None, 8),
        ("float32", "complex64", 8),
        ("int32", "float32", 8),  # only floats may be compressed
        ("float16", "int16", 4),
    ]:
        spec = {"name": "x", "dtype": dtype, "shape": [2], "nbytes": nbytes}
        if decode_as is not None:
            spec["as"] = decode_as
        register(raw)
        reply = ask(raw, [head("PUBLISH", seq=3, round=0, tensors=[spec]), b"\0" * nbytes])
        assert_error(reply, "bad-dtype", seq=3, words=("float",))
    assert ring2.stats()["errors"] == {"bad-dtype": 8}
    leave(raw)
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_header_declared_payload_over_the_limit_gets_too_large():
    """A frame over the payload limit (or over a 1 MiB header, whichever is larger) never reaches the
    broker: ZeroMQ drops it (test_frame_over_maxmsgsize_...). What does reach it is refused by size."""
    limit = 2 * MIB  # above the header limit, so that a header over 1 MiB still gets through ZeroMQ
    broker = new_broker(topologies.make("ring", 2), max_payload_bytes=limit)
    try:
        sock = dealer(broker)
        register(sock)
        big = {"name": "x", "dtype": "uint8", "shape": [2 * limit], "nbytes": 2 * limit}
        halves = [{"name": n, "dtype": "float32", "shape": [limit // 8 + 1], "nbytes": limit // 2 + 4} for n in "ab"]
        for frames in [
            [head("PUBLISH", seq=1, round=0, tensors=[big]), b"\0" * 16],  # small frame, big claim
            [head("PUBLISH", seq=1, round=0, tensors=[{**big, "shape": [1 << 62], "nbytes": 1 << 62}])],
            [head("PUBLISH", seq=1, round=0, tensors=halves), b"", b""],  # the total counts
        ]:
            assert_error(ask(sock, frames), "too-large", seq=1, words=("limit",))
        # A header over 1 MiB (in a frame ZeroMQ still lets through) is refused before parsing: no seq.
        assert_error(ask(sock, [head("PING", seq=1, pad="p" * (MIB + 10))]), "too-large", words=("header",))
        # Exactly at the limit is allowed: what is wrong then is the frame, not the size.
        at_limit = {**big, "shape": [limit], "nbytes": limit}
        assert_error(ask(sock, [head("PUBLISH", seq=1, round=0, tensors=[at_limit]), b"\0"]), "bad-message", seq=1)
        assert broker.stats()["errors"] == {"too-large": 4, "bad-message": 1}
        leave(sock)
        sock.close(linger=0)
        assert_pair_gossips(broker)
    finally:
        assert close_broker(broker)


@pytest.mark.timeout(20)
def test_frame_over_maxmsgsize_drops_that_connection_and_the_broker_serves_on():
    broker = new_broker(topologies.make("ring", 2), max_payload_bytes=MIB)
    try:
        vandal, bystander = dealer(broker), dealer(broker)
        monitor = vandal.get_monitor_socket()
        assert_error(ask(vandal, [head("PING", seq=1)]), "not-registered", seq=1)  # connected
        while monitor.poll(0):
            recv_monitor_message(monitor)
        oversize = max(MIB, wire.MAX_HEADER_BYTES) + 1  # ZMQ_MAXMSGSIZE (a tensor or a header), plus one byte
        for frames in ([head("PUBLISH", seq=2, round=0, tensors=[]), b"\0" * oversize], [b"\xc1" * oversize]):
            vandal.send_multipart(frames)
            events = []
            deadline = time.monotonic() + 3
            while zmq.EVENT_DISCONNECTED not in events and monitor.poll(
                max(1, int((deadline - time.monotonic()) * 1000))
            ):
                events.append(recv_monitor_message(monitor)["event"])
            assert zmq.EVENT_DISCONNECTED in events, "ZeroMQ should drop the connection of an oversize frame"
            assert not vandal.poll(300), "an oversize frame gets no reply: ZeroMQ drops it unread"
            assert_error(ask(bystander, [head("PING", seq=7)]), "not-registered", seq=7)
            # The dropped DEALER reconnects on its own and is served again.
            deadline, reply = time.monotonic() + 5, None
            while reply is None and time.monotonic() < deadline:
                vandal.send_multipart([head("PING", seq=8)])
                if vandal.poll(200):
                    reply = wire.decode(vandal.recv_multipart())
            assert_error(reply, "not-registered", seq=8)
            while vandal.poll(200):  # pings sent while it reconnected may answer late
                assert_error(wire.decode(vandal.recv_multipart()), "not-registered", seq=8)
        errors = broker.stats()["errors"]
        assert set(errors) == {"not-registered"}, errors  # the oversize frames were never read
        assert broker._thread.is_alive()
        vandal.disable_monitor()  # else its inproc://monitor.s-<fd> name outlives it and the next socket
        monitor.close(linger=0)  # with that fd (a GossipClient's watch) cannot bind it
        vandal.close(linger=0)
        bystander.close(linger=0)
        assert_pair_gossips(broker)
    finally:
        assert close_broker(broker)


@pytest.mark.timeout(20)
def test_wrong_protocol_version_gets_version(ring2, raw):
    versions = [0, 2, -1, 2**64 - 1, "1", None, [1], 1.5, 1.0, True]  # 1.0 and True == 1 in Python only
    for v in versions:
        reply = ask(raw, [msgpack.packb({"v": v, "cmd": "HELLO", "seq": 4, "rank": 0})])
        assert_error(reply, "version", seq=4, words=("speaks 1",))
    assert_error(ask(raw, [msgpack.packb({"cmd": "PING", "seq": 4})]), "version", seq=4, words=("None",))
    assert ring2.stats()["errors"] == {"version": len(versions) + 1}
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_unknown_command_gets_unknown_command(ring2, raw):
    commands = ["EVAL", "", "hello", "HELLO ", "PUBLISH\x00", 5, None, ["HELLO"], {"cmd": "HELLO"}]
    for cmd in commands:
        assert_error(
            ask(raw, [msgpack.packb({"v": 1, "cmd": cmd, "seq": 9})]), "unknown-command", seq=9, words=("valid",)
        )
    # The broker's own replies are no requests (seq is readable there, so it is echoed).
    replies = [
        [head("WELCOME", seq=9)],
        [head("ACK", seq=9)],
        [head("PONG", seq=9)],
        [head("ERROR", seq=9, code="x", reason="y")],
        [head("DELIVER", seq=9, messages=[], weights=[])],
    ]
    for frames in replies:
        assert_error(ask(raw, frames), "unknown-command", seq=9, words=("broker reply",))
    assert ring2.stats()["errors"] == {"unknown-command": len(commands) + len(replies)}
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_request_before_hello_or_after_bye_gets_not_registered(ring2, raw):
    requests = [
        [head("PING", seq=11)],
        [head("COLLECT", seq=12, round=0)],
        publish_frames(letter(0, 0, np.zeros(4, np.float32)), 13, 0),
        [head("BYE", seq=14)],
    ]
    for seq, frames in zip(range(11, 15), requests):
        assert_error(ask(raw, frames), "not-registered", seq=seq, words=("HELLO",))
    welcome = ask(raw, [head("HELLO", seq=15, rank=0)])
    assert welcome.cmd == wire.WELCOME and welcome["rank"] == 0
    raw.send_multipart([head("BYE", seq=16)])  # no reply; the rank is free at once
    assert_error(ask(raw, [head("PING", seq=17)]), "not-registered", seq=17)
    assert ring2.stats()["errors"] == {"not-registered": 5}
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_request_after_the_broker_expired_the_agent_gets_not_registered():
    broker = new_broker(topologies.make("ring", 2), peer_timeout=0.3)
    try:
        sock = dealer(broker)
        assert ask(sock, [head("HELLO", seq=1, rank=1)]).cmd == wire.WELCOME
        wait_for(lambda: broker.stats()["events"].get("expired"), 5, "the silent agent never expired", every=0.05)
        assert_error(ask(sock, [head("PING", seq=2)]), "not-registered", seq=2)
        assert broker.stats()["errors"] == {"not-registered": 1}
        assert broker.stats()["events"] == {"expired": 1}
        sock.close(linger=0)
    finally:
        assert close_broker(broker)


@pytest.mark.timeout(20)
def test_rank_out_of_range_gets_rank_range(ring2, raw):
    ranks = [-1, 2, 3, 2**63 - 1, -(2**63), 2**64 - 1]
    for rank in ranks:
        assert_error(ask(raw, [head("HELLO", seq=21, rank=rank)]), "rank-range", seq=21, words=("0..1",))
    # Out of range wins over a takeover request.
    assert_error(ask(raw, [head("HELLO", seq=22, rank=2, takeover=True)]), "rank-range", seq=22)
    assert ring2.stats()["errors"] == {"rank-range": len(ranks) + 1}
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_duplicate_rank_gets_rank_taken_and_does_not_unseat_the_agent(ring2, raw):
    clients = [GossipClient(ring2.address, r, timeout=10) for r in (0, 1)]
    try:
        for fields in [
            {"rank": 0},
            {"rank": 1},
            {"rank": 0, "takeover": False},
            {"rank": 1, "takeover": None},
            {"rank": 0, "n": 2, "topology": ring2.topology.digest()},
        ]:
            assert_error(
                ask(raw, [head("HELLO", seq=31, **fields)]), "rank-taken", seq=31, words=("already registered",)
            )
        assert_error(ask(raw, [head("PING", seq=32)]), "not-registered", seq=32)  # still nobody
        assert gossip_rounds(clients, 3) == []
        stats = ring2.stats()
        assert stats["errors"] == {"rank-taken": 5, "not-registered": 1}
        assert [stats["agents"][r]["registrations"] for r in (0, 1)] == [1, 1]  # nobody re-registered
    finally:
        for c in clients:
            c.close()


@pytest.mark.timeout(20)
def test_topology_disagreement_gets_topology_mismatch(ring2, raw):
    cases = [
        ({"n": 3}, "3 agents"),
        ({"n": 1}, "1 agents"),
        ({"n": 0}, "0 agents"),
        ({"topology": "0" * 16}, "digest"),
        ({"topology": topologies.make("ring", 3).digest()}, "digest"),
        ({"n": 2, "topology": topologies.from_matrix([[0.3, 0.7], [0.5, 0.5]]).digest()}, "digest"),
    ]
    for fields, words in cases:
        assert_error(ask(raw, [head("HELLO", seq=41, rank=1, **fields)]), "topology-mismatch", seq=41, words=(words,))
    assert ring2.stats()["errors"] == {"topology-mismatch": len(cases)}
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_schema_change_mid_run_gets_schema_mismatch_and_the_first_schema_keeps_working(ring2, raw):
    x = np.zeros(4, np.float32)
    assert ask(raw, [head("HELLO", seq=1, rank=0)]).cmd == wire.WELCOME
    ack = ask(raw, publish_frames(letter(0, 0, x), 2, 0))
    assert ack.cmd == wire.ACK and ack["written"] == [1]
    for seq, changed in enumerate(
        [
            {"tag": np.zeros(2, np.float32), "x": np.zeros(5, np.float32)},  # shape
            {"tag": np.zeros(2, np.float32), "x": np.zeros(4, np.float64)},  # dtype
            {"tag": np.zeros(2, np.float32), "y": np.zeros(4, np.float32)},  # name
            {"tag": np.zeros(2, np.float32)},  # a tensor less
            {**letter(0, 1, x), "z": np.zeros(1, np.float32)},
        ],
        start=3,
    ):  # one more
        assert_error(ask(raw, publish_frames(changed, seq, 1)), "schema-mismatch", seq=seq, words=("schema",))
    b = GossipClient(ring2.address, 1, timeout=10)
    try:
        got = b.exchange(letter(1, 0, np.ones(4, np.float32)))
        assert got[0]["tag"].tolist() == [0, 0] and b.last_rounds == {0: 0}
        deliver = ask(raw, [head("COLLECT", seq=20, round=0)])  # the raw agent finishes round 0
        assert deliver.cmd == wire.DELIVER and wire.deliveries(deliver)[1]["tag"].tolist() == [1, 0]
        assert ask(raw, publish_frames(letter(0, 1, x), 21, 1)).cmd == wire.ACK  # first schema: fine
        t = threading.Thread(target=lambda: got.update(b.exchange(letter(1, 1, np.ones(4, np.float32)))))
        t.start()
        deliver = ask(raw, [head("COLLECT", seq=22, round=1)])
        t.join(5)
        assert deliver.cmd == wire.DELIVER and wire.deliveries(deliver)[1]["tag"].tolist() == [1, 1]
        assert got[0]["tag"].tolist() == [0, 1] and b.last_rounds == {0: 1}
        raw.send_multipart([head("BYE", seq=23)])
    finally:
        b.close()
    # A fresh pair takes both ranks over; each continues from the last round it published (1).
    assert_pair_gossips(ring2)
    assert ring2.stats()["errors"] == {"schema-mismatch": 5}


# ---------------------------------------------------------------- regressions: bugs the fuzzing found


@pytest.mark.timeout(20)
def test_unhashable_dtype_gets_bad_dtype_not_internal(ring2, raw):
    """Found by fuzzing: `dtype not in _ITEMSIZE` (a dict) raised TypeError for a list or map as
    `dtype` or `as`, and the broker answered `internal` instead of `bad-dtype`."""
    spec = {"name": "x", "shape": [2], "nbytes": 8}
    cases = [
        [head("PUBLISH", seq=5, round=0, tensors=[{**spec, "dtype": ["float32"]}]), b"\0" * 8],
        [head("PUBLISH", seq=5, round=0, tensors=[{**spec, "dtype": {"a": 1}}]), b"\0" * 8],
        [head("PUBLISH", seq=5, round=0, tensors=[{**spec, "dtype": "float32", "as": []}]), b"\0" * 8],
        [head("DELIVER", seq=5, weights=[], messages=[{"rank": 0, "tensors": [{**spec, "dtype": [1]}]}]), b"\0" * 8],
    ]
    register(raw)
    replies = [ask(raw, frames) for frames in cases]
    leave(raw)
    assert_pair_gossips(ring2)  # it keeps serving either way
    assert [r["code"] for r in replies] == ["bad-dtype"] * len(cases), [r.header for r in replies]


@pytest.mark.timeout(20)
def test_deeply_nested_header_value_gets_bad_message_not_internal(ring2, raw):
    """Found by fuzzing: msgpack accepts nesting down to ~1023 levels, and building the refusal's
    reason with repr(value) raised RecursionError: the broker answered `internal`."""
    depth = 1000
    nested = b"\x91" * depth + b"\x00"  # [[[...[0]...]]], packed by hand
    frames = [b"\x84\xa1v\x01\xa3cmd\xa5HELLO\xa3seq\x05\xa4rank" + nested]
    assert msgpack.unpackb(frames[0])["cmd"] == "HELLO"
    reply = ask(raw, frames)
    assert_pair_gossips(ring2)
    assert_error(reply, "bad-message", seq=5)
    assert len(reply["reason"]) < 300


@pytest.mark.timeout(30)
def test_a_peer_that_never_reads_its_replies_does_not_stall_the_broker():
    """Found by fuzzing (a hang): with blocking sends, once the replies to a peer that does not read
    filled its pipe (SNDHWM) and the TCP buffers, send_multipart blocked the broker's only thread
    for good: no agent was served and broker.close() hung."""
    broker = new_broker(topologies.make("ring", 2))
    pair = [GossipClient(broker.address, r, timeout=5, heartbeat=0.2, liveness=5) for r in (0, 1)]
    vandal = dealer(broker, RCVHWM=1, RCVBUF=4096, SNDTIMEO=200)
    sent = 0
    try:
        frame = head("HELLO", seq=1, rank="x" * 2000)  # a 2 kB request; the reason echoes it
        deadline = time.monotonic() + 5
        while sent < 20_000 and time.monotonic() < deadline:
            try:
                vandal.send(frame)
            except zmq.Again:  # the broker stopped reading
                break
            sent += 1
        problems = gossip_rounds(pair, 3)
        alive_errors = dict(broker.errors)
    finally:
        quiet = 0  # read what was sent back, which unblocks a stuck broker, then clean up
        while quiet < 3 and broker.errors.get("bad-message", 0) < sent:
            quiet = 0 if vandal.poll(300) and vandal.recv_multipart() else quiet + 1
        while vandal.poll(100):
            vandal.recv_multipart()
        vandal.close(linger=0)
        for c in pair:
            c.close()
        assert close_broker(broker)
    assert problems == [], f"the broker stalled after {alive_errors} of {sent} unread replies: {problems}"


@pytest.mark.timeout(30)
def test_a_new_broker_right_after_closing_one_constructs():
    """Found while fuzzing (a crash at start): the broker's inproc endpoints were named by id(self),
    which CPython reuses at once for a new object while ZeroMQ's reaper still holds the closed
    broker's endpoints, so about 1 construction in 10 failed with "Address already in use"."""
    topology, failures = topologies.make("ring", 2), []
    for attempt in range(400):
        try:
            broker = Broker(topology).start()
        except zmq.ZMQError as exc:
            failures.append((attempt, repr(exc)))
            break
        assert close_broker(broker)
        del broker
    assert failures == [], f"construction #{failures[0][0]} failed: {failures[0][1]}"


# ---------------------------------------------------------------- the fuzz run

N_AGENTS = 4  # a ring of exactly the real agents: every valid rank is held by a live agent
ROUNDS = 500
X_LEN = 8
MAX_PAYLOAD = 64 * 1024
N_HYPOTHESIS = 1000  # hypothesis-built messages (hypothesis spends ~3 ms on each on this machine)
N_MUTANTS = 10_000  # seeded mutations of them (field swaps, deletions, valid commands and ranks)
N_RANDOM = 8000  # raw random frames (and bit flips / truncations of valid messages)
N_OVERSIZE = 4  # frames over ZMQ_MAXMSGSIZE: the connection is dropped, nothing is answered
FUZZ_SECONDS = 20  # stop sending after this, whatever is left

WEIRD = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.just(b"")
    | st.lists(st.integers(-3, 3), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(-3, 3), max_size=1)
)
COMMANDS = wire.CLIENT_COMMANDS + wire.BROKER_COMMANDS
SPEC = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "tag"]) | st.text(max_size=4) | WEIRD,
        "dtype": st.sampled_from(wire.DTYPES) | st.sampled_from(["complex64", "object", ""]) | WEIRD,
        "shape": st.lists(st.integers(0, 4), max_size=3)
        | st.lists(st.integers(-(2**63), 2**64 - 1), max_size=9)
        | WEIRD,
    },
    optional={"as": st.sampled_from(wire.DTYPES) | WEIRD, "nbytes": st.integers(-1, 2**64 - 1) | WEIRD},
)


def hello_is_a_hijack(header, n):
    """A HELLO with a truthy `takeover` for a rank in range legitimately takes a live agent's rank over
    (the feature that lets a restarted agent back in; today any truthy value counts, not only True).
    Fuzz input must never carry one: the rounds it would cost the real agents would be the fuzzer's
    doing, not a broker bug. Without takeover such a HELLO must get rank-taken (the fuzz checks that),
    and since the ring is exactly the real agents, no fuzz socket can register a free rank either."""
    rank = header.get("rank")
    return bool(header.get("takeover")) and isinstance(rank, int) and 0 <= rank < n


def disarm(header, n=N_AGENTS):
    if isinstance(header, dict) and hello_is_a_hijack(header, n):
        header["takeover"] = False
    return header


def complete_spec(spec):
    """Fill a missing nbytes in with the right value when the rest allows it (so specs get past that check)."""
    shape, size = spec.get("shape"), wire._ITEMSIZE.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
    if "nbytes" not in spec and size and isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape):
        spec["nbytes"] = int(np.prod(shape, dtype=object)) * size
    return spec


def frames_for(tensors):
    """Payload frames of the declared sizes, when they are small enough to send."""
    frames = []
    for spec in tensors if isinstance(tensors, list) else []:
        nbytes = spec.get("nbytes") if isinstance(spec, dict) else None
        frames.append(b"\x01" * nbytes if type(nbytes) is int and 0 <= nbytes <= 4096 else b"")
    return frames


@st.composite
def garbage(draw, digest):
    """A header of random, partly valid fields, and payload frames matching its schema or random."""
    header = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "v": st.just(1) | st.just(1) | WEIRD,
                "cmd": st.sampled_from(COMMANDS) | st.sampled_from(COMMANDS) | st.text(max_size=8) | WEIRD,
                "seq": st.integers(-(2**63), 2**64 - 1) | WEIRD,
                "rank": st.sampled_from(range(N_AGENTS))
                | st.sampled_from([-1, N_AGENTS, 2**63 - 1, -(2**63)])
                | st.integers(-(2**63), 2**64 - 1)
                | WEIRD,
                "n": st.none() | st.just(N_AGENTS) | st.integers(-2, 10) | WEIRD,
                "topology": st.none() | st.just(digest) | st.text(max_size=16) | WEIRD,
                "takeover": st.booleans() | WEIRD,
                "round": st.integers(-(2**63), 2**64 - 1) | WEIRD,
                "tensors": st.lists(SPEC.map(complete_spec), max_size=3) | WEIRD,
                "messages": st.lists(
                    st.fixed_dictionaries(
                        {"rank": st.integers(-1, N_AGENTS)},
                        optional={"tensors": st.lists(SPEC.map(complete_spec), max_size=2)},
                    ),
                    max_size=2,
                )
                | WEIRD,
                "weights": st.lists(st.tuples(st.integers(-1, N_AGENTS), st.floats(0, 1)).map(list), max_size=2)
                | WEIRD,
            },
        )
    )
    header.update(draw(st.dictionaries(st.text(max_size=6), WEIRD, max_size=2)))
    if draw(st.booleans()):
        frames = frames_for(header.get("tensors"))
        for entry in header.get("messages") if isinstance(header.get("messages"), list) else []:
            frames += frames_for(entry.get("tensors") if isinstance(entry, dict) else None)
    else:
        frames = draw(st.lists(st.binary(max_size=40), max_size=3))
    return disarm(header), frames


@st.composite
def wellformed(draw, digest):
    """Valid requests an unregistered socket might send: each must get not-registered, rank-taken,
    rank-range or topology-mismatch, and never reach the agents' mailboxes."""
    cmd = draw(st.sampled_from(wire.CLIENT_COMMANDS))
    header = {"v": 1, "cmd": cmd, "seq": draw(st.integers(0, 2**31))}
    frames = []
    if cmd == "HELLO":
        header["rank"] = draw(st.integers(-1, N_AGENTS))
        header.update(
            draw(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "n": st.sampled_from([None, N_AGENTS, N_AGENTS + 1]),
                        "topology": st.sampled_from([None, digest, "bad"]),
                        "takeover": st.just(False),
                    },
                )
            )
        )
    elif cmd in ("PUBLISH", "COLLECT"):
        header["round"] = draw(st.integers(0, ROUNDS))
    if cmd == "PUBLISH":  # a perfect letter in the real agents' schema, claiming to be from a real rank
        rank = draw(st.integers(0, N_AGENTS - 1))
        schema, buffers = wire.pack_tensors(letter(rank, header["round"], np.full(X_LEN, 1e6, np.float32)))
        header["tensors"], frames = schema, [bytes(memoryview(b)) for b in buffers]
    return header, frames


@st.composite
def near_valid_publish(draw):
    """A valid PUBLISH envelope around a random, partly valid tensor schema, with frames of the declared
    sizes (or not): this is what reaches the schema checks."""
    tensors = draw(st.lists(SPEC.map(complete_spec), min_size=1, max_size=3))
    header = {
        "v": 1,
        "cmd": "PUBLISH",
        "seq": draw(st.integers(0, 2**31)),
        "round": draw(st.integers(0, 9)),
        "tensors": tensors,
    }
    frames = frames_for(tensors)
    if frames and draw(st.booleans()):
        frames = draw(st.permutations(frames + draw(st.lists(st.binary(max_size=8), max_size=1))))
    return header, frames


def hypothesis_inputs(digest):
    """N_HYPOTHESIS (header, payload) pairs from hypothesis: fixed by derandomize, never shrunk."""
    out = []

    @settings(
        max_examples=N_HYPOTHESIS,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(garbage(digest), garbage(digest), wellformed(digest), near_valid_publish()))
    def collect(example):
        out.append(example)

    collect()
    return out


def mutants(examples, count, seed):
    """Seeded mutations of hypothesis' headers: swap in another example's value for a key, drop a key,
    make cmd / v / rank valid, so more inputs get past the first checks."""
    rng = random.Random(seed)
    pool = collections.defaultdict(list)
    for header, _ in examples:
        for k, v in header.items():
            pool[k].append(v)
    keys = sorted(pool)
    for _ in range(count):
        header, frames = rng.choice(examples)
        header = dict(header)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            if op == 0:
                k = rng.choice(keys)
                header[k] = rng.choice(pool[k])
            elif op == 1 and header:
                del header[rng.choice(sorted(header))]
            elif op == 2:
                header["cmd"] = rng.choice(COMMANDS)
            elif op == 3:
                header["v"] = 1
            else:
                header["rank"] = rng.randrange(-1, N_AGENTS + 1)
        if rng.random() < 0.5:
            frames = frames_for(header.get("tensors"))
        yield disarm(header), frames


def random_frames(count, seed, digest):
    """Raw random frames: random count, random lengths, random bytes; a third are bit flips or
    truncations of valid messages (so the msgpack parser sees near-misses, not just noise)."""
    rng = np.random.default_rng(seed)
    schema, buffers = wire.pack_tensors(letter(0, 0, np.zeros(X_LEN, np.float32)))
    valid = [
        [head("HELLO", seq=1, rank=1, n=N_AGENTS, topology=digest)],
        [head("PING", seq=2)],
        [head("COLLECT", seq=3, round=4)],
        [head("BYE", seq=4)],
        [head("PUBLISH", seq=5, round=0, tensors=schema), *[bytes(memoryview(b)) for b in buffers]],
    ]
    for _ in range(count):
        kind = rng.random()
        if kind < 0.33:
            frames = [bytearray(f) for f in valid[rng.integers(len(valid))]]
            f = frames[0]
            if rng.random() < 0.5:
                for pos in rng.integers(0, len(f), int(rng.integers(1, 4))):
                    f[pos] ^= 1 << int(rng.integers(8))
            else:
                del f[int(rng.integers(0, len(f))) :]
            frames = [bytes(f) for f in frames]
        else:
            lengths = rng.integers(0, 4096 if rng.random() < 0.05 else 64, int(rng.integers(1, 6)))
            frames = [rng.bytes(int(k)) for k in lengths]
            if kind < 0.5 and frames[0]:  # start with a fixmap, so the header parses further
                frames[0] = bytes([0x80 | int(rng.integers(16))]) + frames[0][1:]
        yield frames


def expected_reply(frames, topology):
    """(code, seq) the broker must answer an unregistered socket with, per PROTOCOL.md section 4.
    Checks run cheapest first: the header, then registration (so an unregistered PUBLISH gets
    not-registered whatever its tensor schema). Every valid rank is held by a live real agent and
    no input asks for a takeover, so a HELLO that passes the range and topology checks gets rank-taken."""
    if len(frames[0]) > MAX_HELLO_BYTES:  # refused unread
        return "not-registered", None
    try:
        msg = wire.decode_header(frames, MAX_PAYLOAD)
    except wire.WireError as err:
        return err.code, err.seq
    except Exception:  # a decode bug: the broker can only answer "internal"
        return "internal", None
    seq = msg.get("seq")
    if msg.cmd not in wire.CLIENT_COMMANDS:
        return "unknown-command", seq
    if msg.cmd != wire.HELLO:
        return "not-registered", seq
    if not 0 <= msg["rank"] < topology.n:
        return "rank-range", seq
    if msg.get("n") is not None and msg.get("n") != topology.n:
        return "topology-mismatch", seq
    if msg.get("topology") is not None and msg.get("topology") != topology.digest():
        return "topology-mismatch", seq
    assert not msg.get("takeover"), "fuzz input must not take a live rank over"
    return "rank-taken", seq


def readable(frames):
    """An input as (header, payload frame lengths), for failure messages."""
    try:
        header = msgpack.unpackb(frames[0], strict_map_key=False)
    except Exception:
        header = frames[0][:100]
    return header, [len(f) for f in frames[1:]]


class Fuzzer(threading.Thread):
    """One raw DEALER socket sending a stream of inputs, pipelined, and checking every reply in order."""

    WINDOW = 32

    def __init__(self, broker, topology, inputs, deadline, name):
        super().__init__(name=name, daemon=True)
        self.broker, self.topology, self.inputs, self.deadline = broker, topology, inputs, deadline
        self.sent = self.replies = self.skipped = 0
        self.codes = collections.Counter()
        self.mismatches, self.internal, self.errors = [], [], []
        self.started_at = self.ended_at = None

    def run(self):
        self.started_at = time.monotonic()
        sock = dealer(self.broker)
        pending = collections.deque()
        try:
            for frames in self.inputs:
                if time.monotonic() > self.deadline:
                    break
                if isinstance(frames, tuple):  # (header, payload) from hypothesis or a mutation
                    header, payload = frames
                    frames = [msgpack.packb(header, use_bin_type=True), *payload]
                code, seq = expected_reply(frames, self.topology)
                while len(pending) >= self.WINDOW:
                    self._receive(sock, pending, 10_000)
                sock.send_multipart(frames)
                pending.append((code, seq, frames))
                self.sent += 1
                while pending and sock.poll(0):
                    self._receive(sock, pending, 0)
            while pending and self._receive(sock, pending, 10_000):
                pass
            if pending:
                self.errors.append(f"{len(pending)} inputs never answered, first: {pending[0][2]!r:.300}")
        except Exception as exc:
            self.errors.append(repr(exc))
        finally:
            sock.close(linger=0)
            self.ended_at = time.monotonic()

    def _receive(self, sock, pending, timeout_ms):
        if not sock.poll(timeout_ms):
            return False
        reply = wire.decode(sock.recv_multipart())
        code, seq, frames = pending.popleft()
        self.replies += 1
        self.codes[reply.get("code")] += 1
        reason = reply.get("reason")
        if (
            reply.cmd != wire.ERROR
            or reply.get("code") != code
            or reply.get("seq") != seq
            or not isinstance(reason, str)
            or not reason.strip()
            or "\n" in reason
        ):
            self.mismatches.append((code, seq, reply.header, frames))
        if reply.get("code") == "internal":
            self.internal.append(frames)
        return True


class OversizeFuzzer(threading.Thread):
    """Sends frames over ZMQ_MAXMSGSIZE: ZeroMQ drops the connection, the broker never sees them and
    answers nothing; the DEALER reconnects by itself and its next PING gets not-registered."""

    def __init__(self, broker, count, deadline):
        super().__init__(name="oversize", daemon=True)
        self.broker, self.count, self.deadline = broker, count, deadline
        self.sent = self.probes = self.replies = 0
        self.errors = []

    def run(self):
        sock = dealer(self.broker)
        size = max(self.broker.max_payload_bytes, wire.MAX_HEADER_BYTES) + 1
        try:
            for i in range(self.count):
                if time.monotonic() > self.deadline:
                    break
                big_seq = 10_000 + i
                sock.send_multipart([head("PUBLISH", seq=big_seq, round=0, tensors=[]), b"\0" * size])
                self.sent += 1
                got = None
                for _ in range(50):  # probe until served again (pings lost while reconnecting are lost)
                    self.probes += 1
                    sock.send_multipart([head("PING", seq=i)])
                    if sock.poll(200):
                        got = self._read(sock, i, big_seq)
                        break
                while sock.poll(200):  # late answers to earlier probes
                    self._read(sock, i, big_seq)
                if got is None:
                    self.errors.append(f"oversize #{i}: never served again")
        except Exception as exc:
            self.errors.append(repr(exc))
        finally:
            sock.close(linger=0)

    def _read(self, sock, probe_seq, big_seq):
        reply = wire.decode(sock.recv_multipart())
        self.replies += 1
        if reply.get("seq") == big_seq:
            self.errors.append(f"the oversize message was answered: {reply.header}")
        elif reply.cmd != wire.ERROR or reply.get("code") != "not-registered" or reply.get("seq") != probe_seq:
            self.errors.append(f"unexpected reply to a probe: {reply.header}")
        return reply


@pytest.mark.timeout(60)
def test_fuzz_the_broker_while_real_agents_gossip():
    t_begin = time.monotonic()
    topo = topologies.make("ring", N_AGENTS)
    digest = topo.digest()
    hyp = hypothesis_inputs(digest)
    t_generated = time.monotonic()
    x0 = np.random.default_rng(3).standard_normal((N_AGENTS, X_LEN)).astype(np.float32)

    broker = new_broker(topo, max_payload_bytes=MAX_PAYLOAD)
    clients = [GossipClient(broker.address, r, n=N_AGENTS, topology=topo, timeout=15) for r in range(N_AGENTS)]
    # Only now, with every rank held by a live agent, may the fuzzers start; the agents say BYE
    # only after the fuzzers are done.
    go, fuzz_done = threading.Event(), threading.Event()
    results = {r: {"x": x0[r].copy(), "rounds": 0, "problems": [], "round_times": []} for r in range(N_AGENTS)}

    def agent(c):
        res, x = results[c.rank], results[c.rank]["x"]
        go.wait()
        try:
            for r in range(ROUNDS):
                got = c.exchange(letter(c.rank, r, x))
                (peer,) = topo.in_peers(c.rank, r)
                if set(got) != {peer} or c.last_rounds != {peer: r}:
                    res["problems"].append(f"round {r}: letters from {c.last_rounds}, expected {{{peer}: {r}}}")
                elif got[peer]["tag"].tolist() != [peer, r]:
                    res["problems"].append(f"round {r}: letter tagged {got[peer]['tag'].tolist()}")
                if c.last_weights != topo.weights(c.rank, r):
                    res["problems"].append(f"round {r}: weights {c.last_weights}")
                mix({"x": x}, {p: {"x": m["x"]} for p, m in got.items()}, c.last_weights, c.rank)
                res["rounds"] += 1
                res["round_times"].append(time.monotonic())
        except Exception as exc:
            res["problems"].append(f"after {res['rounds']} rounds: {exc!r}")
        fuzz_done.wait(60)
        c.close()

    agents = [threading.Thread(target=agent, args=(c,), name=f"agent-{c.rank}", daemon=True) for c in clients]
    deadline = time.monotonic() + FUZZ_SECONDS
    n_sockets = 5
    structured = hyp + list(mutants(hyp, N_MUTANTS, seed=11))
    fuzzers = [Fuzzer(broker, topo, structured[k::n_sockets], deadline, f"structured-{k}") for k in range(n_sockets)]
    fuzzers += [
        Fuzzer(broker, topo, random_frames(N_RANDOM // 2, seed=100 + k, digest=digest), deadline, f"random-{k}")
        for k in range(2)
    ]
    oversize = OversizeFuzzer(broker, N_OVERSIZE, deadline)
    try:
        for t in agents + fuzzers + [oversize]:
            t.start()
        t_fuzz = time.monotonic()
        go.set()
        for t in fuzzers + [oversize]:
            t.join(FUZZ_SECONDS + 15)
        fuzz_end = time.monotonic()
        fuzz_done.set()
        for t in agents:
            t.join(30)
        broker_alive = broker._thread.is_alive()
        stats = broker.stats()
    finally:
        fuzz_done.set()
        closed = close_broker(broker)

    # What was tried, and when.
    inputs = {
        "hypothesis+mutants": sum(f.sent for f in fuzzers[:n_sockets]),
        "random frames": sum(f.sent for f in fuzzers[n_sockets:]),
        "oversize frames": oversize.sent,
        "oversize probes": oversize.probes,
    }
    total_inputs = sum(inputs.values())
    replies = collections.Counter()
    for f in fuzzers:
        replies.update(f.codes)
    rounds_during_fuzz = sum(t_fuzz <= t <= fuzz_end for res in results.values() for t in res["round_times"])
    agents_done = max((res["round_times"] or [t_fuzz])[-1] for res in results.values()) - t_fuzz
    print(
        f"\nfuzz: {total_inputs} inputs tried {inputs} (from {len(hyp)} hypothesis examples, "
        f"generated in {t_generated - t_begin:.1f}s) in {fuzz_end - t_fuzz:.1f}s on {len(fuzzers) + 1} sockets; "
        f"agents: {N_AGENTS} x {ROUNDS} rounds in {agents_done:.1f}s, {rounds_during_fuzz} of them while fuzzing; "
        f"replies by code: {dict(sorted(replies.items(), key=str))}; broker errors: {stats['errors']}"
    )

    # The broker is alive, answers stats, and closes.
    assert broker_alive and closed
    assert all(not t.is_alive() for t in fuzzers + [oversize] + agents)
    # Zero lost or garbled rounds: every agent did every round, reading exactly its in-peer's letter of
    # that round; and mixing them gives exactly the matrix iteration, bit for bit.
    for r, res in results.items():
        assert res["problems"] == [] and res["rounds"] == ROUNDS, (r, res["problems"][:5])
    expected = x0.copy()
    for t in range(ROUNDS):
        before = expected.copy()
        for i in range(N_AGENTS):
            mix({"x": expected[i]}, {p: {"x": before[p]} for p in topo.in_peers(i, t)}, topo.weights(i, t), i)
    np.testing.assert_array_equal(np.stack([results[r]["x"] for r in range(N_AGENTS)]), expected)
    for r in range(N_AGENTS):
        a = stats["agents"][r]
        assert (a["publishes"], a["collects"], a["registrations"], a["parked"]) == (ROUNDS, ROUNDS, 1, []), a
    # Every input that reached the broker got exactly one ERROR, with the code PROTOCOL.md prescribes,
    # its seq echoed when readable, and a one-line reason. None went unanswered.
    for f in fuzzers:
        assert f.errors == [] and f.replies == f.sent, (f.name, f.errors[:3])
        assert f.mismatches == [], (f.name, len(f.mismatches), f.mismatches[:3])
    assert oversize.errors == [] and oversize.sent == N_OVERSIZE, oversize.errors
    # The broker counted exactly one error per reply: the fuzzers' replies plus the oversize probes'
    # (the oversize frames themselves never reached it); the real agents caused none.
    replies["not-registered"] += oversize.replies
    assert set(stats["errors"]) <= REPLY_CODES, stats["errors"]
    assert collections.Counter(stats["errors"]) == replies
    assert sum(stats["errors"].values()) == sum(f.sent for f in fuzzers) + oversize.replies
    assert sum(f.sent for f in fuzzers) >= 0.9 * (len(structured) + N_RANDOM), "fuzzing hit its time limit"
    # A clear error for every input: "internal" means a bug in the broker (see the tests above).
    internal = [readable(fr) for f in fuzzers for fr in f.internal]
    assert internal == [], f"{len(internal)} inputs got ERROR internal, e.g. {internal[:3]!r:.1500}"
