"""The attacks of hostile review round 3 (issue 19) on the data planes, through real sockets and memfds.

A peer's segment, its letter server and its references are written by another process: each test
here is one way a hostile peer (or a careless one) tried to stop or poison an honest agent, and
checks that the honest agent refused it, counted it and went on gossiping.
"""

import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import msgpack
import numpy as np
import pytest
import zmq

import topologies
from brokers import MIB, ask, assert_error, dealer, head, register
from gossiprl import Broker, GossipClient, mix, monitor
from gossiprl.comms import dataplane, wire
from gossiprl.comms.dataplane import HEADER_BYTES, MAGIC, SEALS, AgentPlane, Segment, ShmReader, host_id
from gossiprl.comms.wire import Message, TensorSpec
from helpers import wait_for

FAST = {"heartbeat": 0.1, "liveness": 10}
RING2 = topologies.make("ring", 2)


def _both(clients, tensors):
    """One exchange of every client at once (a sync ring needs them all); their letters by rank."""
    got = {}

    def agent(r):
        got[r] = clients[r].exchange(tensors[r])

    threads = [threading.Thread(target=agent, args=(r,)) for r in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(got) == len(clients), "an exchange hung"
    return got


# ---------------------------------------------------------------- A. shared memory


def test_a_segment_is_sealed_against_resizing_before_it_is_announced():
    """A1: an unsealed segment could be shrunk under its readers."""
    seg = Segment()
    seg.write({"x": np.ones(16, np.float32)}, 0)
    try:
        assert fcntl.fcntl(seg.fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        with pytest.raises(PermissionError):
            os.ftruncate(seg.fd, HEADER_BYTES)
    finally:
        seg.close()


READER = """
import json, sys, numpy as np
from gossiprl import GossipClient
c = GossipClient(sys.argv[1], 1, timeout=10, heartbeat=0.1, liveness=10)
letters = c.exchange({"x": np.zeros(1 << 16, np.float32)})
print("collected", flush=True)
sys.stdin.readline()  # the writer shrinks its segment now
total = sum(float(v["x"].sum()) for v in letters.values())
print(json.dumps({"ranks": sorted(letters), "total": total, "counts": c.plane_counts}), flush=True)
c.close()
"""


@pytest.mark.timeout(30)
def test_a_writer_that_shrinks_its_segment_cannot_kill_its_reader(monkeypatch):
    """A1: a writer that truncated its memfd after announcing it killed every reader with SIGBUS (exit -7)."""
    monkeypatch.setattr(dataplane, "SEALS", 0, raising=False)  # the hostile writer (this process) seals nothing
    with Broker(RING2, data_plane="shm").start() as broker:
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, broker.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            with GossipClient(broker.address, 0, timeout=10, **FAST) as writer:
                writer.exchange({"x": np.ones(1 << 16, np.float32)})
                assert reader.stdout.readline().strip() == "collected"
                os.ftruncate(writer._plane.segment.fd, HEADER_BYTES)
                out, _ = reader.communicate("go\n", timeout=20)
        finally:
            if reader.poll() is None:
                reader.kill()
    assert reader.returncode == 0, f"the reader died (exit {reader.returncode})"
    report = json.loads(out.splitlines()[-1])
    assert report["ranks"] == [] and report["counts"]["shm"] == 0, report
    assert report["counts"]["unreachable"] == 1, report


def _forged(slots, slot_bytes, size, seal=True):
    """A memfd dressed as a segment whose header says what the caller likes; returns (fd, its reference)."""
    fd = os.memfd_create("gossiprl-forged", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    token = os.urandom(16)
    os.pwrite(fd, MAGIC + token + struct.pack("<QQQ", slots, slot_bytes, os.getpid()), 0)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    ref = {"pid": os.getpid(), "fd": fd, "token": token.hex(), "slot": 0, "version": 2, "host": host_id()}
    return fd, ref


SPECS = [TensorSpec("x", "float32", (16,), 64, "float32")]
WHOLE = HEADER_BYTES + 3 * (64 + 64)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "slots,slot_bytes,size,seal,why",
    [
        (1 << 62, 64, WHOLE, True, "slots"),
        (3, 1 << 40, WHOLE, True, "slots of"),
        (3, 128, HEADER_BYTES + 3 * (64 + 128), True, "schema"),
        (3, 64, WHOLE + 4096, True, "bytes, not"),
        (3, 64, WHOLE, False, "not sealed"),
    ],
)
def test_a_forged_segment_header_is_refused_before_any_memory_is_touched(slots, slot_bytes, size, seal, why):
    """A2: a slot count of 2**62 made a reader allocate until MemoryError."""
    fd, ref = _forged(slots, slot_bytes, size, seal)
    reader = ShmReader()
    try:
        for latest in (True, False):
            with pytest.raises(OSError, match=why):
                reader.read(ref, SPECS, latest=latest)
        plane = AgentPlane("shm", "tcp://127.0.0.1:1", "async")
        msg = Message("DELIVER", {"messages": [{"rank": 1, "ref": ref, "specs": SPECS}]})
        assert plane.receive(msg) == {} and plane.counts["unreachable"] == 1
        plane.close()
    finally:
        reader.close()
        os.close(fd)


@pytest.mark.timeout(20)
def test_a_writer_that_rewrites_its_slot_after_the_check_cannot_poison_a_mix():
    """A3: letters were views into the writer's memory, so what mix checked was not what it mixed;
    NaN written between the two reached an honest agent, which then died refusing to publish it."""
    with Broker(RING2, data_plane="shm").start() as broker:
        clients = [GossipClient(broker.address, r, timeout=10, **FAST) for r in (0, 1)]
        try:
            x = np.full(1 << 12, 2.0, np.float32)
            letters = _both(clients, [{"x": np.ones(1 << 12, np.float32)}, {"x": x}])[1]
            segment = clients[0]._plane.segment
            np.frombuffer(segment.payload((segment.letters - 1) % 3), np.float32)[:] = np.nan  # version unchanged
            assert np.isfinite(letters[0]["x"]).all(), "the letter changed under its reader"
            mix({"x": x}, letters, clients[1].last_weights, 1)
            assert np.isfinite(x).all() and np.allclose(x, 1.5)
            _both(clients, [{"x": np.ones(1 << 12, np.float32)}, {"x": x}])  # the honest agent publishes on
        finally:
            for c in clients:
                c.close()


# ---------------------------------------------------------------- B. letters and the broker


@pytest.mark.timeout(20)
def test_a_huge_reference_is_refused_at_publish_and_the_readers_go_on():
    """B4: a registered peer's ref just under 1 MiB was copied into every reader's DELIVER, which then
    passed the 1 MiB header limit, and the WireError ended every reader's training."""
    spec = {"name": "x", "dtype": "float32", "shape": [4], "nbytes": 16}
    with Broker(topologies.make("full", 3), data_plane="shm").start() as broker:
        sock = dealer(broker)
        register(sock, rank=0)
        for ref in ({"slot": 0, "pad": "x" * (MIB - 4096)}, {f"k{i}": i for i in range(17)}, {"slot": [0]}):
            reply = ask(sock, [head("PUBLISH", seq=7, round=0, tensors=[spec], ref=ref)])
            assert_error(reply, "bad-message", seq=7, words=("'ref' must be a map of at most 16 fields",))
        assert broker.stats()["agents"][0]["publishes"] == 0
        clients = [GossipClient(broker.address, r, timeout=10, **FAST) for r in (1, 2)]
        try:
            assert ask(sock, [head("PUBLISH", seq=8, round=0, tensors=[spec], ref={"slot": 0})]).cmd == "ACK"
            got = _both(clients, [{"x": np.ones(4, np.float32)}] * 2)
            assert sorted(got[0]) == [2] and sorted(got[1]) == [1], "the honest agents stopped gossiping"
        finally:
            for c in clients:
                c.close()
            sock.close(linger=0)


def test_a_deliver_entry_with_a_bad_reference_drops_that_letter_alone():
    """B4: one bad entry made the whole DELIVER unreadable, and its reader's training ended."""
    spec = {"name": "x", "dtype": "float32", "shape": [4], "nbytes": 16}
    bad = {"rank": 1, "round": 0, "tensors": [spec], "ref": ["not", "a", "map"], "relayed": False}
    good = {"rank": 2, "round": 0, "tensors": [spec]}
    frames = wire.encode(wire.DELIVER, {"seq": 1, "round": 0, "messages": [bad, good], "weights": [[0, 1.0]]})
    msg = wire.decode([*frames, np.ones(4, np.float32).tobytes()])
    assert list(wire.deliveries(msg)) == [2]
    plane = AgentPlane("shm", "tcp://127.0.0.1:1", "sync")
    try:
        assert plane.receive(msg) == {} and plane.counts["refused"] == 1 and plane.unreachable == set()
    finally:
        plane.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("plane", ["broker", "shm"])
def test_an_honest_swarm_with_many_tensors_completes_its_exchanges(plane):
    """B4: 13 agents with many tensors never completed one exchange (a 1,272,514-byte DELIVER header
    against a 1 MiB limit); two in-peers whose schemas are 600 KB each show the same wall."""
    n, names = 3, [f"{k:04d}".ljust(wire.MAX_NAME_CHARS, "w") for k in range(2000)]
    with Broker(topologies.make("full", n), data_plane=plane).start() as broker:
        # FAST's 1 s liveness window is shorter than the broker's honest work here on a busy 2-core
        # host (decoding three 600 KB schemas): CI once saw it "silent for 1.01s" and the exchange
        # fail. What is tested is that the exchange completes, so the window fits that work.
        slow = {**FAST, "liveness": 50}
        clients = [GossipClient(broker.address, r, timeout=20, **slow) for r in range(n)]
        try:
            tensors = [{name: np.full(1, r, np.float32) for name in names} for r in range(n)]
            got = _both(clients, tensors)
            assert all(sorted(got[r]) == sorted(set(range(n)) - {r}) for r in range(n)), got.keys()
            assert float(got[0][2][names[-1]][0]) == 2.0
        finally:
            for c in clients:
                c.close()


@pytest.mark.timeout(20)
def test_a_reader_can_ask_the_relay_only_for_the_writers_it_reads():
    """B5: one COLLECT naming every rank as unreachable made every writer upload every letter."""
    with Broker(topologies.make("ring", 4), data_plane="shm").start() as broker:  # directed: i reads i - 1
        sock = dealer(broker)
        register(sock, rank=1)
        sock.send_multipart([head("COLLECT", seq=2, round=0, unreachable=[0, 2, 3])])
        clients = {r: GossipClient(broker.address, r, timeout=10, **FAST) for r in (0, 2, 3)}
        try:
            for c in clients.values():
                c.publish({"x": np.ones(4, np.float32)})
            relay = {r: c._plane.relay_to for r, c in clients.items()}
            assert relay == {0: [1], 2: [], 3: []}, relay
            events = broker.stats()["events"]
            assert events["data-plane-fallbacks"] == 1 and events["relay-requests-ignored"] == 2, events
        finally:
            for c in clients.values():
                c.close()
            sock.close(linger=0)


# ---------------------------------------------------------------- C. the direct plane


def _stranger(endpoint, **options):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in options.items():
        sock.setsockopt(getattr(zmq, option), value)
    sock.connect(endpoint)
    return sock


def _fetch(seq, **fields):
    return head("FETCH", seq=seq, slot=0, version=2, latest=True, **fields)


@pytest.mark.timeout(20)
def test_a_letter_server_answers_only_fetches_with_the_swarm_s_token():
    """C7/C9: anyone who could reach a letter server's port fetched the swarm's parameters."""
    with Broker(RING2, data_plane="direct").start() as broker:
        clients = [GossipClient(broker.address, r, timeout=10, **FAST) for r in (0, 1)]
        try:
            _both(clients, [{"x": np.full(8, 3.0, np.float32)}, {"x": np.zeros(8, np.float32)}])
            server, token = clients[0]._plane.server, clients[1]._plane.fetcher.token
            assert len(token) == 32 and server.tokens == (token,)
            sock = _stranger(server.endpoint)
            for seq, fields in enumerate(({}, {"token": "0" * 32}, {"token": 7})):
                sock.send(_fetch(seq, **fields))
            assert not sock.poll(500), "a fetch without the swarm's token was answered"
            assert server.refused == 3
            sock.send(_fetch(9, token=token))
            assert sock.poll(2000) and np.frombuffer(sock.recv_multipart()[1], np.float32)[0] == 3.0
            sock.close(linger=0)
            _both(clients, [{"x": np.ones(8, np.float32)}] * 2)
            assert clients[1].plane_counts["direct"] == 2, clients[1].plane_counts
        finally:
            for c in clients:
                c.close()


@pytest.mark.timeout(30)
def test_a_connection_that_asks_and_never_reads_gets_a_bounded_queue():
    """C7: 250 FETCHes on one connection that never read took a writer from 46 to 880 MiB."""
    with Broker(RING2, data_plane="direct").start() as broker:
        clients = [GossipClient(broker.address, r, timeout=10, **FAST) for r in (0, 1)]
        try:
            _both(clients, [{"x": np.ones(MIB // 4, np.float32)}] * 2)
            server = clients[0]._plane.server
            served = server.served
            sock = _stranger(server.endpoint, RCVHWM=1, RCVBUF=4096)
            for seq in range(200):
                sock.send(_fetch(seq, token=clients[1]._plane.fetcher.token))
            wait_for(lambda: server.served >= served + 200, 10, "the server did not answer every fetch", every=0.05)
            assert server.served == served + 200
            queued = 0
            while sock.poll(300):
                sock.recv_multipart()
                queued += 1
            assert queued <= 32, f"{queued} letters of 1 MiB were queued for one connection"
            sock.close(linger=0)
        finally:
            for c in clients:
                c.close()


def _fake_server(behaviour):
    """A 'letter server' that stalls (never answers), answers with a frame far beyond the schema,
    or closes its socket once a request came (its agent left with a reader's fetch pending)."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if sock.poll(50):
                identity, request = sock.recv_multipart()
                if behaviour == "oversize":
                    seq = msgpack.unpackb(request)["seq"]
                    sock.send_multipart([identity, head("LETTER", seq=seq, ok=True), b"\0" * (64 * MIB)])
                if behaviour == "leaves":
                    break
                if behaviour == "answers-for-the-next":  # a reply to the FETCH the reader sent another writer
                    seq = msgpack.unpackb(request)["seq"] + 1
                    forged = b"\7" * dataplane.layout(SPECS)[1]
                    sock.send_multipart([identity, head("LETTER", seq=seq, ok=True), forged])
        sock.close(linger=0)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return sock.getsockopt_string(zmq.LAST_ENDPOINT), stop, thread


@pytest.mark.timeout(30)
@pytest.mark.parametrize("behaviour,count", [("stalls", "slow"), ("oversize", "hung-up")])
def test_a_writer_whose_server_stalls_or_oversends_loses_its_edge_to_the_relay(behaviour, count):
    """C8: a server that stalled cost every reader ~10 s per round and never fell back to the relay;
    one that sent a 1 GiB frame had it accepted (reader RSS 1,066 MiB). The oversized frame drops
    the connection, so its reader knows at once that no letter is coming (``hung-up``)."""
    endpoint, stop, thread = _fake_server(behaviour)
    plane = AgentPlane("direct", "tcp://127.0.0.1:1", "sync", fetch_timeout=0.2)
    plane.fetcher.patience = 1.5
    ref = {"endpoint": endpoint, "slot": 0, "version": 2}
    try:
        for k in range(dataplane.SLOW_STRIKES):
            assert plane.unreachable == set(), f"fell back after {k} slow rounds"
            msg = Message("DELIVER", {"messages": [{"rank": 1, "ref": ref, "specs": SPECS}]})
            assert plane.receive(msg) == {}
        assert plane.counts[count] == dataplane.SLOW_STRIKES and plane.counts["direct"] == 0, plane.counts
        assert plane.unreachable == {1} and plane.collect_fields() == {"unreachable": [1]}
    finally:
        plane.close()
        stop.set()
        thread.join(5)


@pytest.mark.timeout(30)
def test_a_reader_whose_writer_leaves_with_its_fetch_pending_drops_that_letter_at_once():
    """A writer closes its letter server as soon as its last exchange returns; a slower reader whose
    FETCH was on its way waited ten liveness windows for an answer that could not come (the end of
    a bench run stalled 300 s). The connection dropping says so: the letter is dropped now, as a
    strike, and the edge is not relayed for it."""
    endpoint, stop, thread = _fake_server("leaves")
    plane = AgentPlane("direct", "tcp://127.0.0.1:1", "sync", fetch_timeout=2.0)
    ref = {"endpoint": endpoint, "slot": 0, "version": 2}
    try:
        start = time.monotonic()
        assert plane.receive(Message("DELIVER", {"messages": [{"rank": 1, "ref": ref, "specs": SPECS}]})) == {}
        waited = time.monotonic() - start
        assert waited < plane.fetch_timeout, f"waited {waited:.1f} s for a server that had closed"
        assert plane.counts["hung-up"] == 1 and plane.counts["slow"] == 0, plane.counts
        assert plane.unreachable == set() and plane.collect_fields() == {}
    finally:
        plane.close()
        stop.set()
        thread.join(5)


@pytest.mark.timeout(30)
def test_a_writer_cannot_answer_the_fetch_sent_to_another():
    """Replies were matched by their seq alone, which counts up across writers: a writer could
    answer the FETCH its reader had just sent another writer, and its bytes were mixed as that
    writer's letter. A reply now counts only from the connection its FETCH went to."""
    forger, stop_forger, forging = _fake_server("answers-for-the-next")
    staller, stop_staller, stalling = _fake_server("stalls")
    plane = AgentPlane("direct", "tcp://127.0.0.1:1", "sync", fetch_timeout=0.2)
    plane.fetcher.patience = 1.5
    entries = [
        {"rank": r, "ref": {"endpoint": e, "slot": 0, "version": 2}, "specs": SPECS}
        for r, e in ((1, forger), (2, staller))
    ]
    try:
        assert plane.receive(Message("DELIVER", {"messages": entries})) == {}
        assert plane.counts["slow"] == 2 and plane.counts["direct"] == 0, plane.counts
    finally:
        plane.close()
        for stop, thread in ((stop_forger, forging), (stop_staller, stalling)):
            stop.set()
            thread.join(5)


# ---------------------------------------------------------------- D. the metrics endpoint


@pytest.fixture
def stats_server(monkeypatch):
    monkeypatch.setattr(monitor, "CONNECTION_S", 1.0, raising=False)
    with Broker(RING2).start() as broker:
        server = monitor.StatsServer(broker.stats, 0)
        yield broker, server
        server.close()


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.timeout(30)
def test_slow_clients_cannot_hold_the_metrics_endpoint_or_the_broker_s_descriptors(stats_server):
    """D10: 248 slowloris connections held a thread and a descriptor each, for ever; /stats timed out
    and agents could not register."""
    broker, server = stats_server
    host, port = server.address.removeprefix("http://").rsplit(":", 1)
    before = _open_fds()
    slow = []
    for _ in range(248):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"GET /stats HTTP/1.1\r\nX-Slow: ")
        slow.append(s)
    evicted = len(slow) - monitor.MAX_CONNECTIONS  # each one accepted past the cap closes the oldest
    wait_for(lambda: server.refused >= evicted, 10, "the stats server did not take the connections", every=0.02)
    held = _open_fds() - before - len(slow)  # (give or take a descriptor the broker's threads open meanwhile)
    assert held <= monitor.MAX_CONNECTIONS + 4, f"the endpoint holds {held} connections"
    with urllib.request.urlopen(f"{server.address}/stats", timeout=5) as answer:
        assert json.loads(answer.read())["n"] == 2
    with GossipClient(broker.address, 0, timeout=5, **FAST) as client:
        assert client.ping() < 1.0
    deadline = time.monotonic() + monitor.CONNECTION_S + 2
    for s in slow[-monitor.MAX_CONNECTIONS :]:  # the ones still held: cut off once their time is up
        s.settimeout(max(0.01, deadline - time.monotonic()))
        assert s.recv(1) == b"", "a connection that never finished its request was kept"
    for s in slow:
        s.close()


@pytest.mark.timeout(30)
def test_a_scrape_flood_renders_each_answer_once_per_snapshot(stats_server, monkeypatch):
    """D10: every /metrics request rendered the Prometheus text again (the broker's PING median
    went from 0.63 to 15.9 ms under a flood)."""
    pytest.importorskip("prometheus_client", reason="the monitor extra (prometheus-client) is not installed")
    _, server = stats_server
    renders = []
    real = monitor.prometheus_text
    monkeypatch.setattr(monitor, "prometheus_text", lambda stats: renders.append(1) or real(stats))
    start = time.monotonic()
    for _ in range(100):
        with urllib.request.urlopen(f"{server.address}/metrics", timeout=5) as answer:
            assert answer.status == 200 and b"gossiprl_broker_uptime_seconds" in answer.read()
    snapshots = (time.monotonic() - start) / monitor.MIN_SNAPSHOT_S + 1
    assert len(renders) <= snapshots, f"{len(renders)} renders for 100 scrapes in {snapshots:.0f} snapshots"


@pytest.mark.timeout(20)
def test_an_answer_that_fails_costs_that_answer_only():
    """D10: the endpoint serves every connection from one thread, so one failed answer (a snapshot
    that raises) must not end that thread."""
    calls = []

    def stats():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the first snapshot fails")
        return {"n": 2}

    server = monitor.StatsServer(stats, 0)
    try:
        with pytest.raises(urllib.error.HTTPError, match="500"):
            urllib.request.urlopen(f"{server.address}/stats", timeout=5)
        with urllib.request.urlopen(f"{server.address}/stats", timeout=5) as answer:
            assert json.loads(answer.read()) == {"n": 2}
    finally:
        server.close()
