"""The broker and client over real sockets on loopback: turn locks, consensus, refusals, garbage."""

import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

import topologies
from brokers import gossip_rows
from gossiprl import Broker, GossipClient, GossipError, GossipTimeout, mix
from gossiprl.comms import wire
from helpers import in_thread, wait_for


def test_writer_waits_until_reader_consumed_previous_letter(ring2):
    a, b = GossipClient(ring2.address, 0), GossipClient(ring2.address, 1)
    a.publish({"x": np.zeros(3)})
    a.round += 1  # a moves on without collecting; b has not read a's round-0 letter yet
    t, box = in_thread(a.publish, {"x": np.ones(3)})
    wait_for(
        lambda: ring2.stats()["agents"][0]["parked"] == ["publish"],
        5,
        "the second publish never reached the broker",
        every=0.01,
    )
    parked_at = time.monotonic()
    assert "done_at" not in box, "the second publish must wait for the reader"
    read_at = time.monotonic()
    b.publish({"x": np.zeros(3)})
    published_at = time.monotonic()  # a's publish is released by b's collect, which comes after this
    got = b.collect()
    t.join(5)
    assert box["done_at"] >= read_at and "error" not in box
    np.testing.assert_array_equal(got[0]["x"], np.zeros(3))  # b read round 0, not round 1
    np.testing.assert_array_equal(b.collect()[0]["x"], np.ones(3))
    # the broker counts the wait: at least from when the test saw the publish parked to b's collect
    assert ring2.stats()["agents"][0]["publish_wait_s"] >= published_at - parked_at - 1e-6
    a.close(), b.close()


def test_reader_waits_until_every_in_peer_wrote():
    with Broker(topologies.make("full", 3)).start() as broker:
        c = [GossipClient(broker.address, r) for r in range(3)]
        c[0].publish({"x": np.zeros(2)})
        t, box = in_thread(c[0].collect)
        wait_for(
            lambda: broker.stats()["agents"][0]["parked"] == ["collect"],
            5,
            "the collect never reached the broker",
            every=0.01,
        )
        parked_at = time.monotonic()
        c[1].publish({"x": np.full(2, 1.0)})  # the broker has taken this letter in when the call returns
        assert broker.stats()["agents"][0]["parked"] == ["collect"], "collect must wait for rank 2 as well"
        assert "done_at" not in box, "collect must wait for rank 2 as well"
        wrote_at = time.monotonic()
        c[2].publish({"x": np.full(2, 2.0)})
        t.join(5)
        assert box["done_at"] >= wrote_at
        assert sorted(box["result"]) == [1, 2]
        assert box["result"][2]["x"][0] == 2.0
        # the wait is counted against each in-peer read: at least from the park the test saw to rank 2's letter
        assert broker.stats()["agents"][0]["waited_on"][2] >= wrote_at - parked_at - 1e-6
        for x in c:
            x.close()


def test_collect_times_out_while_broker_is_alive(ring2):
    a = GossipClient(ring2.address, 0, heartbeat=0.05)
    t0 = time.monotonic()
    with pytest.raises(GossipTimeout, match="alive"):
        a.collect(timeout=0.4)  # nobody publishes; pings keep proving the broker alive
    assert 0.35 < time.monotonic() - t0 < 2
    a.close()


@pytest.mark.parametrize(
    "name,n,options", [("ring", 6, {}), ("sparse", 8, {}), ("full", 4, {}), ("sparse", 8, {"time_varying": True})]
)
def test_sync_gossip_is_exactly_the_matrix_iteration_and_reaches_consensus(name, n, options):
    """With turn locks every round mixes exactly the round's letters, so x(t+1) = P(t) x(t) to the bit
    pattern of float64 arithmetic, and the disagreement shrinks at the rate the spectral gap says."""
    topo = topologies.make(name, n, **options)
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((n, 64))
    rounds = 30
    with Broker(topo).start() as broker:
        x = gossip_rows(broker, x0, rounds)
    expected = x0.copy()
    for t in range(rounds):
        expected = topo.at(t).matrix @ expected
    np.testing.assert_allclose(x, expected, rtol=1e-10, atol=1e-12)
    pi = np.ones(n) / n
    if not topo.doubly_stochastic:  # converges to the stationary-distribution-weighted mean
        p = topo.matrix
        for t in range(1, topo.period):
            p = topo.at(t).matrix @ p
        vals, vecs = np.linalg.eig(p.T)
        pi = np.real(vecs[:, np.argmin(abs(vals - 1))])
        pi /= pi.sum()
    consensus = pi @ x0
    err0 = np.linalg.norm(x0 - consensus)
    err = np.linalg.norm(x - consensus)
    assert err < err0 * max(topo.slem, 1e-12) ** rounds * n * 10 + 1e-9


def test_async_publish_skips_full_slots_and_collect_does_not_wait():
    with Broker(topologies.make("ring", 2), mode="async").start() as broker:
        a, b = GossipClient(broker.address, 0), GossipClient(broker.address, 1)
        assert b.collect() == {}  # nothing there: async returns at once
        assert a.publish({"x": np.zeros(1)}).written == [1]
        a.round += 1
        res = a.publish({"x": np.ones(1)})
        assert res.written == [] and res.skipped == [1]
        assert b.collect()[0]["x"][0] == 0.0
        a.close(), b.close()


def test_async_max_staleness_forces_a_wait():
    with Broker(topologies.make("ring", 2), mode="async", max_staleness=2).start() as broker:
        a, b = GossipClient(broker.address, 0), GossipClient(broker.address, 1)
        assert b.collect() == {}  # first empty collect: staleness 1
        t, box = in_thread(b.collect)  # a second empty one would reach 2: must wait
        wait_for(
            lambda: broker.stats()["agents"][1]["parked"] == ["collect"],
            5,
            "the collect never reached the broker",
            every=0.01,
        )
        assert "done_at" not in box
        a.publish({"x": np.ones(1)})
        t.join(5)
        assert box["result"][0]["x"][0] == 1.0
        a.close(), b.close()


def test_registration_refusals(ring2):
    a = GossipClient(ring2.address, 0)
    with pytest.raises(GossipError, match="already registered") as err:
        GossipClient(ring2.address, 0)
    assert err.value.code == "rank-taken"
    with pytest.raises(GossipError, match=r"ranks 0\.\.1"):
        GossipClient(ring2.address, 2)
    with pytest.raises(GossipError, match="3 agents"):
        GossipClient(ring2.address, 1, n=3)
    with pytest.raises(GossipError, match="digest"):
        GossipClient(ring2.address, 1, topology=topologies.from_matrix([[0.3, 0.7], [0.5, 0.5]]))
    a.close()
    # BYE has no reply and travels on another connection than b's HELLO
    wait_for(lambda: not ring2.stats()["agents"][0]["registered"], 5, "BYE did not free the rank", every=0.01)
    b = GossipClient(ring2.address, 0)  # BYE freed the rank at once
    b.close()
    assert ring2.stats()["errors"]["rank-taken"] == 1


def test_schema_change_is_refused_and_swarm_keeps_going(ring2):
    a, b = GossipClient(ring2.address, 0), GossipClient(ring2.address, 1)
    a.publish({"x": np.zeros(4, np.float32)})
    with pytest.raises(GossipError, match="schema") as err:
        b.publish({"x": np.zeros(5, np.float32)})
    assert err.value.code == "schema-mismatch"
    b.publish({"x": np.ones(4, np.float32)})
    assert a.collect()[1]["x"][0] == 1.0
    a.close(), b.close()


def test_broker_survives_garbage_while_agents_gossip():
    topo = topologies.make("ring", 3)
    ctx = zmq.Context.instance()
    rng = np.random.default_rng(7)
    with Broker(topo).start() as broker:
        stop = threading.Event()
        sent = [0]

        def vandal():
            socks = [ctx.socket(zmq.DEALER) for _ in range(4)]
            for s in socks:
                s.setsockopt(zmq.LINGER, 0)
                s.connect(broker.address)
            bad = [
                [b""],
                [b"\x00\x01"],
                [msgpack.packb({"v": 1, "cmd": "PUBLISH", "seq": 1, "round": 0})],
                [msgpack.packb({"v": 9, "cmd": "HELLO", "rank": 0})],
                [msgpack.packb({"v": 1, "cmd": "HELLO", "rank": 99})],
                [msgpack.packb({"v": 1, "cmd": "DELIVER", "seq": 1, "messages": []})],
            ]
            while not stop.is_set():
                s = socks[sent[0] % len(socks)]
                frames = (
                    bad[sent[0] % len(bad)]
                    if sent[0] % 2
                    else [rng.bytes(int(rng.integers(0, 40))) for _ in range(int(rng.integers(1, 4)))]
                )
                s.send_multipart(frames)
                sent[0] += 1
                while s.poll(0):
                    s.recv_multipart()
                time.sleep(0.0005)  # a vandal at a steady pace beside the agents, not a flood that starves them
            for s in socks:
                s.close()

        t = threading.Thread(target=vandal)
        t.start()
        x0 = rng.standard_normal((3, 16))
        try:
            x = gossip_rows(broker, x0, 40)
        finally:
            stop.set()
            t.join()
        stats = broker.stats()
    expected = np.linalg.matrix_power(topo.matrix, 40) @ x0
    np.testing.assert_allclose(x, expected, rtol=1e-10)
    assert sent[0] > 20
    assert sum(stats["errors"].values()) >= sent[0] // 2
    assert "internal" not in stats["errors"]


def test_wrong_version_gets_an_error_reply(ring2):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.connect(ring2.address)
    s.send(msgpack.packb({"v": 2, "cmd": "HELLO", "rank": 0, "seq": 5}))
    assert s.poll(2000)
    reply = wire.decode(s.recv_multipart())
    assert reply.cmd == wire.ERROR and reply["code"] == "version" and "speaks 1" in reply["reason"]
    s.close(linger=0)


def test_torch_module_mixing_through_the_broker():
    torch = pytest.importorskip("torch")
    with Broker(topologies.make("ring", 2)).start() as broker:
        nets = [torch.nn.Linear(3, 2) for _ in range(2)]
        before = [torch.cat([p.detach().flatten() for p in n.parameters()]).clone() for n in nets]
        errors = []

        def agent(r):
            try:
                with GossipClient(broker.address, r) as c:
                    w = c.weights
                    msgs = c.exchange({k: v for k, v in nets[r].state_dict().items()})
                    with torch.no_grad():
                        mix(nets[r], msgs, w, r)
            except Exception as exc:
                errors.append(exc)

        ts = [threading.Thread(target=agent, args=(r,)) for r in range(2)]
        [t.start() for t in ts]
        [t.join(10) for t in ts]
        assert not errors
        after = [torch.cat([p.detach().flatten() for p in n.parameters()]) for n in nets]
        torch.testing.assert_close(after[0], (before[0] + before[1]) / 2)
        torch.testing.assert_close(after[1], after[0])
