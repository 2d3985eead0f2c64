"""The attacks of the hostile review (issue 9, sections A to C and D10), through real sockets.

Each test is one attack or one unlucky accident, and checks both that the broker refuses or
survives it and that real agents keep gossiping afterwards.
"""

import resource
import socket
import threading
import time

import numpy as np
import pytest
import zmq

import gossiprl.comms.broker as broker_module
import topologies
from brokers import (
    MIB,
    ask,
    assert_error,
    assert_pair_gossips,
    close_broker,
    dealer,
    head,
    leave,
    letter,
    new_broker,
    publish_frames,
    register,
)
from gossiprl import Broker, BrokerUnavailable, GossipClient, GossipError
from gossiprl.comms import keys, wire
from helpers import free_port, in_thread, invoke, wait_for

RING2 = topologies.make("ring", 2)


# ---------------------------------------------------------------- A. the broker never stops serving


@pytest.mark.timeout(20)
def test_negative_round_is_refused_unstored_and_a_rewiring_after_it_does_not_kill_the_broker(ring2):
    """A1: round -1 was answered `internal` but stored; the next rewiring raised in the serving thread."""
    sock = dealer(ring2)
    register(sock)
    spec = {"name": "x", "dtype": "float32", "shape": [2], "nbytes": 8}
    for bad in (-1, -(2**63), True, 2**64 - 1):
        assert_error(
            ask(sock, [head("PUBLISH", seq=3, round=bad, tensors=[spec]), b"\0" * 8]),
            "bad-message",
            seq=3,
            words=("round",),
        )
    assert_error(ask(sock, [head("COLLECT", seq=4, round=-1)]), "bad-message", seq=4, words=("round",))
    assert ring2.stats()["agents"][0]["publishes"] == 0 and ring2.stats()["agents"][0]["parked"] == []
    ring2.declare_gone(0)  # a rewiring: it used to meet the stored round -1
    assert ring2.wait(0.2), "the serving thread died"
    assert ring2.stats()["errors"] == {"bad-message": 5}
    sock.close(linger=0)
    assert_pair_gossips(ring2)


class _Boom(BaseException):
    """Something no handler catches (as a bug in the poll loop itself would be)."""


class _DyingBroker(Broker):
    def _handle(self, frames):
        raise _Boom("the serving thread dies here")


@pytest.mark.timeout(20)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the death is the point
def test_a_dead_serving_thread_is_recorded_and_the_broker_command_exits_non_zero(monkeypatch):
    """A1: the process used to stay up answering nobody."""
    broker = _DyingBroker(RING2).start()
    with pytest.raises(BrokerUnavailable):
        GossipClient(broker.address, 0, heartbeat=0.05, liveness=3)
    assert not broker.wait(2) and "_Boom" in broker.failure
    broker.close()

    monkeypatch.setattr(broker_module, "Broker", _DyingBroker)
    port = free_port()
    poke = threading.Thread(target=_poke, args=(f"tcp://127.0.0.1:{port}",), daemon=True)
    poke.start()
    result = invoke("broker", "--bind", f"tcp://127.0.0.1:{port}", "-n", 2, "--stats-every", 0, "--insecure")
    assert result.exit_code == 1, result.output
    assert "stopped serving" in result.output and "_Boom" in result.output


def _poke(address):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    for _ in range(50):
        sock.send_multipart([head("PING", seq=1)])
        time.sleep(0.1)  # the broker starts in invoke() at a moment this thread cannot see: keep knocking
    sock.close()


@pytest.mark.timeout(20)
def test_a_stranger_s_big_header_is_refused_unread(ring2):
    """A2: a PUBLISH with 4,096 tensor specs from an unregistered socket was fully decoded first."""
    specs = [{"name": f"t{k}", "dtype": "float32", "shape": [1], "nbytes": 4} for k in range(wire.MAX_TENSORS)]
    sock = dealer(ring2)
    reply = ask(sock, [head("PUBLISH", seq=5, round=0, tensors=specs), *[b"\0" * 4] * wire.MAX_TENSORS])
    assert_error(reply, "not-registered", seq=None, words=("not read",))
    # A small one is still read far enough to echo its seq.
    assert_error(ask(sock, publish_frames(letter(0, 0, np.zeros(2, np.float32)), 6, 0)), "not-registered", seq=6)
    sock.close(linger=0)
    assert_pair_gossips(ring2)


def test_the_broker_raises_its_open_file_limit_and_shortens_the_handshake_window():
    """A3: 1,100 idle connections exhausted a 1,024-fd broker."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 512), hard))
    try:
        with Broker(RING2) as broker:
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
            assert broker._sockets.router.getsockopt(zmq.HANDSHAKE_IVL) == broker_module.HANDSHAKE_MS
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timeout(20)
def test_a_refused_connection_is_counted_and_logged(ring2, caplog):
    """A3: the log said nothing while connections failed."""
    host, port = ring2.address.removeprefix("tcp://").rsplit(":", 1)
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\0" * 32
    with socket.create_connection((host, int(port))) as s:
        s.sendall(greeting)  # ZMTP 3.0 asking for CURVE from a broker without keys
        wait_for(lambda: ring2.stats()["events"].get("connections-refused", 0) >= 1, 5, "the refusal was not counted")
    assert any("handshake failed" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- B. memory stays bounded


@pytest.fixture
def mib_broker():
    broker = new_broker(RING2, max_payload_bytes=MIB)
    yield broker
    assert close_broker(broker), "broker.close() hung"


@pytest.mark.timeout(20)
def test_a_message_whose_frames_add_up_past_the_limit_is_too_large(mib_broker):
    """B4: the limit was per frame (ZMQ_MAXMSGSIZE), not per message."""
    sock = dealer(mib_broker)
    register(sock)
    spec = {"name": "x", "dtype": "float32", "shape": [2], "nbytes": 8}
    frames = [head("PUBLISH", seq=2, round=0, tensors=[spec]), *[b"\0" * (MIB // 2)] * 5]
    assert_error(ask(sock, frames), "too-large", seq=None, words=("limit",))
    assert mib_broker.stats()["agents"][0]["publishes"] == 0
    leave(sock)
    assert_pair_gossips(mib_broker)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "limit, why", [({"max_queued_bytes": MIB}, "bytes of letters unread"), ({"max_queued_replies": 4}, "queued")]
)
def test_a_registered_peer_that_stops_reading_is_treated_as_gone(limit, why, caplog):
    """B5: a registered socket that sent COLLECTs and never read made the broker queue every DELIVER."""
    broker = new_broker(RING2, **limit)
    vandal = dealer(broker, RCVHWM=1, RCVBUF=4096, SNDTIMEO=2000)
    a = GossipClient(broker.address, 0, timeout=10)
    x = np.zeros(64 * 1024, np.float32)  # 256 KiB letters
    stop, rounds = threading.Event(), []

    def honest():
        while not stop.is_set():
            try:
                a.exchange({"x": x}, timeout=0.5)
                rounds.append(a.round)
            except Exception:  # noqa: BLE001 - the vandal's turn lock may time out; it keeps trying
                pass

    t = threading.Thread(target=honest, daemon=True)
    try:
        register(vandal, 1)
        t.start()
        deadline = time.monotonic() + 15
        r = 0
        while not broker.stats()["agents"][1]["gone"] and time.monotonic() < deadline:
            try:
                vandal.send_multipart(publish_frames({"x": x}, 100 + 2 * r, r))
                vandal.send_multipart([head("COLLECT", seq=101 + 2 * r, round=r)])
            except zmq.Again:
                break
            r += 1
        wait_for(lambda: broker.stats()["agents"][1]["gone"], 5, "the vandal was never treated as gone", every=0.05)
        stats = broker.stats()
        assert stats["agents"][1]["gone"] and stats["events"].get("stopped-reading") == 1, stats["events"]
        assert any("stopped reading" in r.getMessage() and why in r.getMessage() for r in caplog.records)
        done = len(rounds)
        wait_for(lambda: len(rounds) > done, 0.5, "rank 0 does not go on alone once the vandal is gone", every=0.01)
    finally:
        stop.set()
        if t.is_alive():  # closing a socket while the thread polls it crashed the whole test run (SIGSEGV)
            t.join(10)
            assert not t.is_alive(), "the honest agent's exchange outlived its 0.5 s timeout"
        vandal.close(linger=0)
        a.close()
        assert close_broker(broker)


# ---------------------------------------------------------------- C. clients never hang


def _exchanger(client, stop, done_at):
    x = np.zeros(4, np.float32)
    while not stop.is_set():
        try:
            client.exchange({"x": x})
        except Exception:  # the broker closed for good at the end of the test
            if stop.is_set():
                return
            raise
        done_at.append(time.monotonic())


@pytest.mark.timeout(60)
def test_gossip_resumes_within_two_heartbeats_of_a_fast_broker_restart():
    """C7: a broker restarted inside the liveness window left clients with timeout=None waiting forever."""
    heartbeat = 0.2
    broker = Broker(RING2).start()
    address = broker.address
    clients = [GossipClient(address, r, heartbeat=heartbeat, liveness=10) for r in (0, 1)]
    stop, done = threading.Event(), [[], []]
    threads = [threading.Thread(target=_exchanger, args=(c, stop, d), daemon=True) for c, d in zip(clients, done)]
    for t in threads:
        t.start()
    resumed_after = []
    try:
        since = time.monotonic()
        for _ in range(3):
            # both agents in their stride: three exchanges each since the start or the last restart
            wait_for(lambda since=since: all(sum(t > since for t in d) >= 3 for d in done), 10, "no gossip", every=0.01)
            broker.close()
            time.sleep(0.05)  # far inside the liveness window (2 s)
            broker = Broker(RING2, bind=address).start()
            restarted = time.monotonic()
            wait_for(
                lambda restarted=restarted: all(d and d[-1] > restarted for d in done),
                10,
                "gossip did not resume after the restart",
                every=0.01,
            )
            resumed_after.append(max(min(t for t in d if t > restarted) for d in done) - restarted)
            since = restarted
    finally:
        stop.set()
        broker.close()
        for t in threads:
            t.join(5)
        for c in clients:
            c.close()
    print(
        f"restart-to-resume (both agents exchanged again): {[f'{s * 1000:.0f} ms' for s in resumed_after]}"
        f" with heartbeat {heartbeat * 1000:.0f} ms"
    )
    assert max(resumed_after) < 2 * heartbeat + 0.3, resumed_after


@pytest.mark.timeout(20)
def test_a_takeover_while_the_victim_is_parked_ends_the_victim_s_call(ring2):
    """C8: the victim of a takeover waited forever on its parked COLLECT."""
    victim = GossipClient(ring2.address, 0, heartbeat=0.1)
    t, box = in_thread(victim.collect)
    wait_for(lambda: ring2.stats()["agents"][0]["parked"] == ["collect"], 5, "the collect never parked", every=0.01)
    thief = GossipClient(ring2.address, 0, takeover=True)
    t.join(5)
    assert not t.is_alive(), "the victim still waits"
    assert box["error"].code == "taken-over" and "registered again" in str(box["error"])
    thief.close()


@pytest.mark.timeout(20)
def test_a_letter_over_the_broker_s_limit_fails_at_once_instead_of_blocking_forever(mib_broker):
    """C8: a frame over the size limit made ZeroMQ drop the connection, and the publisher waited forever."""
    client = GossipClient(mib_broker.address, 0)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="at most 1048576"):
        client.publish({"x": np.zeros(MIB, np.float32)})
    assert time.monotonic() - t0 < 1
    client.publish({"x": np.zeros(4, np.float32)})  # and it is still registered
    client.close()


# ---------------------------------------------------------------- D10. the schema belongs to the agents


@pytest.mark.timeout(20)
def test_a_stray_publisher_that_leaves_does_not_fix_the_schema(ring2):
    """D10: one 1-float PUBLISH then BYE made every later agent fail with schema-mismatch."""
    sock = dealer(ring2)
    register(sock)
    assert ask(sock, publish_frames({"poison": np.zeros(1, np.float32)}, 2, 0)).cmd == wire.ACK
    leave(sock)
    sock.close(linger=0)
    assert_pair_gossips(ring2)


@pytest.mark.timeout(20)
def test_a_mismatching_agent_is_told_both_schemas_and_its_neighbour_is_untouched(ring2):
    a, b = GossipClient(ring2.address, 0, timeout=5), GossipClient(ring2.address, 1, timeout=5)
    a.publish({"x": np.zeros(4, np.float32)})
    with pytest.raises(GossipError, match=r"x:float64\[4\].*x:float32\[4\]") as err:
        b.publish({"x": np.zeros(4, np.float64)})
    assert err.value.code == "schema-mismatch"
    b.publish({"x": np.zeros(4, np.float32)})
    assert set(b.collect()) == {0} and set(a.collect()) == {1}
    a.close(), b.close()


# ---------------------------------------------------------------- E11. a HELLO costs O(1) in n


@pytest.mark.timeout(30)
def test_a_large_swarm_registers_with_a_small_welcome():
    """E11: WELCOME carried the n x n matrix: at n = 342 it passed the 1 MiB header limit."""
    topo = topologies.make("sparse", 1024)
    broker = new_broker(topo)
    try:
        sock = dealer(broker)
        sock.send_multipart([head("HELLO", seq=1, rank=1000, n=1024, topology=topo.digest())])
        assert sock.poll(5000)
        frames = sock.recv_multipart()
        assert len(frames[0]) < 4096, len(frames[0])
        welcome = wire.decode(frames)
        assert welcome.cmd == wire.WELCOME and topologies.from_dict(welcome["topology"]).digest() == topo.digest()
        sock.close(linger=0)
    finally:
        assert close_broker(broker)


# ---------------------------------------------------------------- D9. with CURVE, keys are bound to ranks


@pytest.fixture
def bound_keys(tmp_path):
    """agent-0 may hold rank 0 only; agent-1 ranks 1-2; spare has no ranks line (any rank, as before)."""
    keys.generate(tmp_path / "broker", "broker")
    for name, ranks in (("agent-0", "0"), ("agent-1", "1-2"), ("spare", None)):
        public, _ = keys.generate(tmp_path / "agents", name)
        if ranks is not None:
            public.write_text(public.read_text().replace("metadata\n", f'metadata\n    ranks = "{ranks}"\n'))
    return tmp_path


def _curve(root, name):
    return root / "agents" / f"{name}.key_secret", root / "broker" / "broker.key"


@pytest.mark.timeout(20)
def test_a_key_holds_only_its_ranks_and_only_its_holder_takes_a_rank_over(bound_keys):
    """D9: any allowed key could take over a live rank, or re-register a dead one."""
    broker = Broker(
        topologies.make("ring", 3), curve=(bound_keys / "broker/broker.key_secret", bound_keys / "agents")
    ).start()
    try:
        with pytest.raises(GossipError, match=r"ranks 1-2, not rank 0") as err:
            GossipClient(broker.address, 0, curve=_curve(bound_keys, "agent-1"))
        assert err.value.code == "rank-forbidden"
        owner = GossipClient(broker.address, 0, curve=_curve(bound_keys, "agent-0"))
        with pytest.raises(GossipError, match="another key") as err:
            GossipClient(broker.address, 0, takeover=True, curve=_curve(bound_keys, "spare"))
        assert err.value.code == "rank-taken"
        again = GossipClient(broker.address, 0, takeover=True, curve=_curve(bound_keys, "agent-0"))
        again.close()  # rank 0 is gone now: still only agent-0's key (or one with no ranks line) may have it
        with pytest.raises(GossipError, match="not rank 0"):
            GossipClient(broker.address, 0, curve=_curve(bound_keys, "agent-1"))
        GossipClient(broker.address, 2, curve=_curve(bound_keys, "agent-1")).close()
        owner.close()
    finally:
        broker.close()


def test_a_bad_ranks_line_is_refused_with_the_file_named(bound_keys):
    path = bound_keys / "agents" / "agent-0.key"
    path.write_text(path.read_text().replace('ranks = "0"', 'ranks = "3-1"'))
    with pytest.raises(ValueError, match=r"agent-0.key: ranks = \"3-1\""):
        keys.load_grants(bound_keys / "agents")


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), True, "60"])
def test_a_peer_timeout_that_would_disable_or_break_expiry_is_refused(bad):
    """Issue 9 item 16: nan silently disabled dead-agent detection."""
    with pytest.raises(ValueError, match="peer_timeout must be a finite number"):
        Broker(RING2, peer_timeout=bad)


def test_declare_gone_takes_numpy_ints_and_refuses_the_rest(ring2):
    ring2.declare_gone(np.int64(1))
    for bad in (2, -1, 1.0, "1", True):
        with pytest.raises(ValueError, match="rank must be an int from 0 to 1"):
            ring2.declare_gone(bad)


@pytest.mark.timeout(20)
def test_a_member_s_outsized_publishes_are_refused_before_their_schema_is_parsed(ring2, monkeypatch):
    """B6: each 4,096-spec PUBLISH of a registered peer cost the broker 37 ms of decoding and parsing,
    and a flood of them cut a legitimate pair's exchanges about tenfold. Once the swarm's letters have
    set the schema, a header larger than any member needs is refused before it is decoded, and a
    schema of another length before it is parsed."""
    parsed = []
    parse = wire.parse_specs
    monkeypatch.setattr(wire, "parse_specs", lambda raw, *rest: parsed.append(len(raw)) or parse(raw, *rest))
    sock = dealer(ring2)
    register(sock)
    assert ask(sock, publish_frames(letter(0, 0, np.zeros(4, np.float32)), 1, 0)).cmd == wire.ACK
    assert parsed == [2]
    specs = [{"name": f"t{k}", "dtype": "float32", "shape": [1], "nbytes": 4} for k in range(wire.MAX_TENSORS)]
    for seq in (2, 3):  # a letter with its frames, and a data-plane one that left them at home
        frames = [head("PUBLISH", seq=seq, round=1, tensors=specs), *[b"\0" * 4] * (len(specs) if seq == 2 else 0)]
        assert_error(ask(sock, frames), "too-large", seq=None, words=("need at most",))
    few = specs[:200]  # a header no larger than a member's may be, with a schema of another length
    assert_error(
        ask(sock, [head("PUBLISH", seq=4, round=1, tensors=few), *[b"\0" * 4] * len(few)]),
        "schema-mismatch",
        seq=4,
        words=("200 tensors",),
    )
    assert parsed == [2], "an outsized schema was parsed"
    leave(sock)
    sock.close(linger=0)
    assert_pair_gossips(ring2)
