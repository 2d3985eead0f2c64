"""Brokers, raw protocol sockets and gossiping clients, shared by the integration tests.

Importable as ``from brokers import ...`` (tox.ini's [pytest] puts tests/ on sys.path); the
``ring2`` fixture built on new_broker() is in tests/integration/conftest.py.
"""

import threading

import msgpack
import numpy as np
import zmq

from gossiprl import Broker, GossipClient, mix
from gossiprl.comms import wire

MIB = 1 << 20


def dealer(broker, **options):
    """A raw DEALER socket to `broker`, for saying what no GossipClient would; options are zmq names."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in options.items():
        sock.setsockopt(getattr(zmq, option), value)
    sock.connect(broker.address)
    return sock


def head(cmd, **fields):
    return msgpack.packb({"v": 1, "cmd": cmd, **fields}, use_bin_type=True)


def ask(sock, frames, timeout=3.0):
    """Send one message, return the decoded reply."""
    sock.send_multipart(frames)
    assert sock.poll(int(timeout * 1000)), f"no reply to {frames[0][:80]!r}"
    return wire.decode(sock.recv_multipart())


def assert_error(reply, code, seq=None, words=()):
    assert reply.cmd == wire.ERROR, reply.header
    assert reply["code"] == code, reply.header
    reason = reply["reason"]
    assert isinstance(reason, str) and reason.strip(), reply.header
    assert "\n" not in reason and "\r" not in reason, f"reason is not one line: {reason!r}"
    assert reply.get("seq") == seq, reply.header
    for w in words:
        assert w in reason, reason


def register(sock, rank=0):
    """Bind a raw socket to a rank: the broker reads a PUBLISH's tensor schema only from a registered sender."""
    assert ask(sock, [head("HELLO", seq=0, rank=rank)]).cmd == wire.WELCOME


def leave(sock):
    """BYE, then a PING answered not-registered: the rank is free again once that reply is back."""
    sock.send_multipart([head("BYE", seq=0)])
    assert_error(ask(sock, [head("PING", seq=0)]), "not-registered", seq=0)


def letter(rank, rnd, x):
    """What agents publish: a tag naming sender and round, and the parameters being mixed."""
    return {"tag": np.array([rank, rnd], np.float32), "x": x}


def publish_frames(tensors, seq, rnd):
    schema, buffers = wire.pack_tensors(tensors)
    return [head("PUBLISH", seq=seq, round=rnd, tensors=schema), *[bytes(memoryview(b)) for b in buffers]]


def new_broker(topology, **kwargs):
    """A started Broker on tcp://127.0.0.1:0."""
    return Broker(topology, **kwargs).start()


def close_broker(broker, timeout=5.0):
    """Broker.close() joins the serving thread; never let a stuck broker hang the test run."""
    t = threading.Thread(target=broker.close, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


def gossip_rounds(clients, rounds, x_len=4):
    """Each client exchanges `rounds` times in its own thread; returns the problems seen.

    Every round each client must receive exactly its in-peers' letters of that same round
    (the tag says who sent it and for which round), then mixes them in."""
    problems = []

    def run(c):
        x = np.full(x_len, float(c.rank), np.float32)
        try:
            for _ in range(rounds):
                r = c.round
                got = c.exchange(letter(c.rank, r, x))
                if set(got) != set(c.in_peers) or c.last_rounds != {p: r for p in c.in_peers}:
                    problems.append(f"rank {c.rank} round {r}: got {c.last_rounds}, in-peers {c.in_peers}")
                for p, m in got.items():
                    if m["tag"].tolist() != [p, r]:
                        problems.append(f"rank {c.rank} round {r}: letter from {p} tagged {m['tag'].tolist()}")
                mix({"x": x}, {p: {"x": m["x"]} for p, m in got.items()}, c.last_weights, c.rank)
        except Exception as exc:  # handed to the test thread
            problems.append(f"rank {c.rank}: {exc!r}")

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    problems += [f"rank {c.rank} still running" for c, t in zip(clients, threads) if t.is_alive()]
    return problems


def assert_pair_gossips(broker, rounds=3):
    """A real GossipClient pair (ranks 0 and 1) still registers and completes exchanges."""
    clients = [GossipClient(broker.address, r, timeout=10) for r in (0, 1)]
    try:
        assert gossip_rounds(clients, rounds) == []
    finally:
        for c in clients:
            c.close()
    assert broker._thread.is_alive()


def gossip_rows(broker, x0, rounds):
    """Rank r mixes row r of x0 with what `broker` delivers, `rounds` times, one thread per rank;
    returns the rows after. With turn locks that is exactly the product of the round matrices.

    Agents leave together, after a barrier: one that closes early is bypassed by the broker's
    rewiring, which changes the graph the others still mix with in their last round."""
    x = x0.copy()
    errors = []
    done = threading.Barrier(len(x0), timeout=60)

    def agent(rank):
        try:
            with GossipClient(broker.address, rank) as client:
                for _ in range(rounds):
                    letters = client.exchange({"x": x[rank]})
                    mix({"x": x[rank]}, letters, client.last_weights, rank)
                done.wait()
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)
            done.abort()

    threads = [threading.Thread(target=agent, args=(r,)) for r in range(len(x0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return x
