"""Data planes (PROTOCOL.md section 10): the broker passes references, the bytes go agent to agent.

Every plane must give the swarm exactly what the relay gives it, never hand a reader a letter
that was being overwritten, fall back to the relay for an edge it cannot serve, and leave no
shared memory behind whatever gets killed.
"""

import csv
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import topologies
from gossiprl import Broker, GossipClient, mix
from gossiprl.comms import keys, wire
from gossiprl.comms.dataplane import Segment, ShmReader
from gossiprl.comms.wire import TensorSpec
from helpers import invoke, poll_until, start_endless_swarm, wait_until_training

PLANES = ["broker", "shm", "direct", "auto"]
FAST = {"heartbeat": 0.1, "liveness": 10}


def _swarm(plane, mode="sync", n=3, rounds=8, tamper=None, numel=1000, options=None):
    """n threads gossiping on a ring through real sockets; returns each rank's parameters and plane counts
    (a rank whose rounds raised is missing). ``options``: GossipClient's, over a 20 s timeout and FAST."""
    out = {}
    options = {"timeout": 20, **FAST, **(options or {})}
    with Broker(topologies.make("ring", n), data_plane=plane, mode=mode).start() as broker:
        clients = {r: GossipClient(broker.address, r, **options) for r in range(n)}
        if tamper:
            tamper(clients)

        def agent(r):
            x = np.arange(numel, dtype=np.float32) * (r + 1)
            peers = set()
            for _ in range(rounds):
                letters = clients[r].exchange({"x": x})
                peers |= set(letters)
                mix({"x": x}, letters, clients[r].last_weights, r)
            out[r] = (x, clients[r].plane_counts, peers)

        threads = [threading.Thread(target=agent, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for c in clients.values():
            c.close()
        return out, broker.stats()


def _curve_ring(tmp_path, agent_names):
    """A CURVE broker over direct, and each rank's client with the key pair named for it."""
    keys.generate(tmp_path / "broker", "broker")
    for name in set(agent_names):
        keys.generate(tmp_path / "agents", name)
    broker = Broker(
        topologies.make("ring", 2),
        data_plane="direct",
        curve=(tmp_path / "broker" / "broker.key_secret", tmp_path / "agents"),
    ).start()
    clients = [
        GossipClient(
            broker.address,
            r,
            timeout=20,
            **FAST,
            curve=(tmp_path / "agents" / f"{name}.key_secret", tmp_path / "broker" / "broker.key"),
        )
        for r, name in enumerate(agent_names)
    ]
    return broker, clients


def _session_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[3])  # after the command's name: state ppid pgrp sid
    except (OSError, IndexError, ValueError):
        return None


def _segments_left(*sessions: int) -> list[str]:
    """Every gossiprl segment still alive in this test's session (or `sessions`): held open or mapped.

    Only the processes of this session are looked at, so a swarm that a program started in another
    session runs beside the suite (a study started with setsid or from another terminal) is not taken
    for one of ours; one started from the suite's own shell still is. Named files in /dev/shm are looked
    for machine-wide: gossiprl never names one, so any is a leak.
    """
    ours = {os.getsid(0), *sessions}
    left = (
        [f"/dev/shm/{name}" for name in os.listdir("/dev/shm") if "gossiprl" in name]
        if os.path.isdir("/dev/shm")
        else []
    )

    def readlink(path):
        try:
            return os.readlink(path)
        except OSError:  # closed, or its process ended, while we looked
            return ""

    for pid in filter(str.isdigit, os.listdir("/proc")):
        if _session_of(pid) not in ours:
            continue
        try:
            fds = [readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            with open(f"/proc/{pid}/maps") as maps:
                mapped = [line.split(None, 5)[-1].strip() for line in maps if "memfd:gossiprl-" in line]
        except OSError:
            continue
        left += [f"pid {pid}: {name}" for name in fds + mapped if "memfd:gossiprl-" in name]
    return left


@pytest.mark.parametrize("plane", PLANES[1:])
def test_sync_consensus_is_bit_identical_to_the_relay(plane):
    relayed, _ = _swarm("broker")
    got, stats = _swarm(plane)
    for r in relayed:
        assert np.array_equal(relayed[r][0], got[r][0]), f"rank {r} mixed differently over {plane}"
        counts = got[r][1]
        path = "direct" if plane == "direct" else "shm"
        assert counts[path] == 8 and counts["relay"] == 0 and counts["torn"] == 0, counts
    assert all(a["bytes_out"] == 0 for a in stats["agents"].values()), "the broker relayed bytes anyway"


@pytest.mark.parametrize("plane", PLANES[1:])
def test_async_letters_are_whole_and_the_swarm_agrees(plane):
    got, _ = _swarm(plane, mode="async", rounds=30)
    for x, counts, peers in got.values():
        assert np.isfinite(x).all() and counts["torn"] == 0
        assert peers, "no letter ever arrived"
    spread = max(float(np.abs(got[r][0] - got[0][0]).max()) for r in got)
    assert spread < 0.05 * 999 * 3, "the agents did not move towards each other"


def _writer(conn, stop):
    """Rewrite one segment as fast as possible; letter k is k everywhere, so a torn read shows."""
    seg, x = Segment(), np.zeros(1 << 20, np.float32)
    k = 0
    while not stop.is_set():
        x.fill(k)
        _, ref = seg.write({"x": x}, k)
        if conn.poll(0):
            conn.recv()
            conn.send(ref)
        k += 1
    seg.close()


def test_async_copy_never_returns_a_torn_letter():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    stop = ctx.Event()
    proc = ctx.Process(target=_writer, args=(child, stop))
    proc.start()
    reader, whole, stale, newer = ShmReader(), 0, 0, 0
    spec = [TensorSpec("x", "float32", (1 << 20,), 4 << 20, "float32")]
    try:
        parent.send(None)
        parent.recv()  # the writer is up: a spawned process may take seconds to start on a busy machine
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (whole < 20 or newer < 5):
            parent.send(None)
            ref = parent.recv()
            time.sleep(0.001 * (whole % 3))  # sometimes late: the writer has moved on
            letter = reader.read(ref, spec, latest=True)
            if letter is None:
                stale += 1
            else:
                x = letter["x"]
                assert x[0] == x[-1] == x.min() == x.max(), "a torn letter was handed out"
                assert x[0] >= (ref["version"] - 2) // 2, "an older letter than the one referenced"
                newer += x[0] > (ref["version"] - 2) // 2
                whole += 1
    finally:
        stop.set()
        proc.join(10)
        reader.close()
    assert whole >= 20 and newer >= 1 and stale <= whole, (whole, newer, stale)


def test_stale_reference_reads_as_none():
    seg, reader = Segment(), ShmReader()
    x = np.ones(10, np.float32)
    specs, first = seg.write({"x": x}, 0)
    for r in range(1, 4):  # three more letters: the first one's slot is taken again
        seg.write({"x": x * r}, r)
    assert reader.read(first, specs, latest=False) is None
    specs, last = seg.write({"x": x * 7}, 4)
    assert reader.read(last, specs, latest=False)["x"][0] == 7.0
    reader.close()
    seg.close()


WRITER = """
import sys, time, numpy as np
from gossiprl import GossipClient
c = GossipClient(sys.argv[1], 0, heartbeat=0.1, liveness=10)
x = np.full(1 << 18, 3.0, np.float32)
c.publish({"x": x})
print("published", flush=True)
time.sleep(600)  # alive, its letter published, until the test kills it
"""


@pytest.mark.timeout(60)
def test_writer_killed_mid_read_leaves_a_readable_letter_and_no_segment(tmp_path):
    assert _segments_left() == []
    with Broker(topologies.make("ring", 2), data_plane="shm").start() as broker:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, broker.address], stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout.readline().strip() == "published"
            with GossipClient(broker.address, 1, timeout=10, **FAST) as reader:
                letters = reader.collect()  # copied out of the writer's segment
                writer.send_signal(signal.SIGKILL)
                writer.wait(10)
                assert not os.path.exists(f"/proc/{writer.pid}")
                assert float(letters[0]["x"].sum()) == 3.0 * (1 << 18), "the letter died with the writer"
                broker.declare_gone(0)
                reader.publish({"x": np.zeros(1 << 18, np.float32)})
                assert reader.collect() == {}, "a gone writer's letter was delivered twice"
        finally:
            if writer.poll() is None:
                writer.kill()
    assert _segments_left() == [], "a segment outlived its writer and its reader"


def _bogus_endpoint(rank):
    def tamper(clients):
        clients[rank]._plane.server.endpoint = "tcp://127.0.0.1:1"  # nothing listens there

    return tamper


def _elsewhere(rank):
    def tamper(clients):
        clients[rank]._plane.host = "another-host"  # this reader cannot map anyone's memory

    return tamper


@pytest.mark.parametrize("plane,tamper", [("direct", _bogus_endpoint(0)), ("shm", _elsewhere(1))])
def test_unreachable_writer_falls_back_to_the_relay_for_that_edge(plane, tamper):
    got, stats = _swarm(plane, n=2, rounds=8, tamper=tamper)
    assert stats["events"].get("data-plane-fallbacks") == 1
    counts = got[1][1]
    assert counts["unreachable"] >= 1 and counts["relay"] >= 5, counts
    assert got[1][2] == {0}, "rank 1 never got rank 0's letters"
    assert got[0][1]["relay"] == 0, "the other edge should have stayed off the relay"
    assert stats["agents"][1]["bytes_out"] > 0 and stats["agents"][0]["bytes_out"] == 0
    assert np.allclose(got[0][0], got[1][0], rtol=0.2), "the two agents did not mix"


def _held_on_entering(clients):
    """Rank 1 cannot map rank 0's memory, and is held just after it wrote the session's id into its
    control segment until rank 0 has either posted to it or left: the moment a loaded host once gave
    rank 0 by chance (issue 18). Its doorbell is rung first, so rank 0 looks at once."""
    _elsewhere(1)(clients)
    mine, writer = clients[1]._plane.control, clients[0]._plane.control
    enter = mine.enter

    def held(session, *args, **kwargs):
        enter(session, *args, **kwargs)
        mine.ring()
        poll_until(lambda: writer.session() == session and (writer.sent(1) or writer.left()), 5, every=0.001)

    mine.enter = held


@pytest.mark.timeout(30)
def test_a_reader_that_cannot_map_its_writer_is_never_posted_a_letter_in_a_session():
    """A reader that cannot map one of its in-peers leaves the session it enters; had its writer seen
    it in the session in between, it would post it a letter it never reads, wait for ever to drain
    it, while the reader waited on the broker for that same letter. Short timeouts: a deadlock is a
    GossipTimeout within seconds; a heartbeat longer than the rounds, so the writer hears nothing
    from the broker (which ended the session on the relay request) before it decides."""
    options = {"timeout": 3, "heartbeat": 1.0, "liveness": 3}
    got, stats = _swarm("shm", n=2, rounds=6, tamper=_held_on_entering, options=options)
    assert set(got) == {0, 1}, "an agent timed out: the session's turns deadlocked"
    assert got[0][1]["session"] == got[1][1]["session"] == 0, "a letter was posted on an edge its reader cannot map"
    assert stats["events"].get("data-plane-fallbacks") == 1 and got[1][1]["relay"] >= 3, (stats, got[1][1])


@pytest.mark.timeout(30)
def test_a_writer_whose_reader_never_joins_the_session_goes_the_brokers_way():
    """A rank can miss a grant (the session ended before its next reply carried it): it never joins,
    and publishes through the broker, which ends the session. Its writer, told so by the broker's
    PONG, leaves and must stop waiting for that reader to join."""
    x = np.ones(64, np.float32)
    with Broker(topologies.make("ring", 2), data_plane="shm").start() as broker:
        clients = [GossipClient(broker.address, r, timeout=3, **FAST) for r in (0, 1)]
        clients[1]._note_grant = lambda reply: None
        try:
            _rounds(clients, 5, x)
            assert clients[0].round == clients[1].round == 5, "an agent timed out waiting on the other"
            assert clients[0]._turns is not None, "rank 0 never entered the session"
            assert broker.stats()["events"]["sessions-ended"] >= 1 and clients[0].plane_counts["session"] == 0
        finally:
            for c in clients:
                c.close()


def _rounds(clients, k, x):
    """k exchange rounds of every client at once (a sync ring needs them all publishing)."""

    def agent(c):
        for _ in range(k):
            c.exchange({"x": x})

    threads = [threading.Thread(target=agent, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a round hung"


def test_a_broker_restart_keeps_the_references_and_relearns_the_relayed_edges(tmp_path):
    """The segments are the agents', so their references outlive the broker; the new broker does not
    know which edges were relayed, so the reader that cannot map its writer must say so again."""
    x = np.ones(64, np.float32)
    # ipc, not tcp: between close and restart another socket on the host may take a freed tcp port
    broker = Broker(topologies.make("ring", 2), bind=f"ipc://{tmp_path}/broker", data_plane="shm").start()
    clients = [GossipClient(broker.address, r, timeout=20, **FAST) for r in (0, 1)]
    try:
        _elsewhere(1)(clients)
        plane0 = clients[0]._plane
        _rounds(clients, 4, x)
        assert broker.stats()["events"].get("data-plane-fallbacks") == 1
        before = [c.plane_counts for c in clients]
        broker.close()
        broker = Broker(topologies.make("ring", 2), bind=broker.address, data_plane="shm").start()
        _rounds(clients, 8, x)
        after = [c.plane_counts for c in clients]
        assert clients[0]._plane is plane0, "the restart replaced a plane whose references were still good"
        assert after[0]["shm"] - before[0]["shm"] >= 7, (before, after)
        assert broker.stats()["events"].get("data-plane-fallbacks") == 1, "the relayed edge was not reported again"
        assert after[1]["relay"] - before[1]["relay"] >= 5, (before, after)
        assert broker.stats()["agents"][0]["bytes_out"] == 0 < broker.stats()["agents"][1]["bytes_out"]
    finally:
        for c in clients:
            c.close()
        broker.close()


def test_a_session_takes_the_turns_in_shared_memory_and_ends_when_an_agent_leaves():
    """Once the swarm is whole the broker grants a session and the rounds stop reaching it; an agent
    that leaves ends it, and the survivors finish their rounds through the broker, rewired, with no
    wait on the agent that left and every round's letter from their new in-peer."""
    x = np.ones(64, np.float32)
    with Broker(topologies.make("ring", 3), data_plane="shm").start() as broker:
        clients = [GossipClient(broker.address, r, timeout=20, **FAST) for r in range(3)]
        try:
            _rounds(clients, 8, x)
            assert all(c.plane_counts["session"] >= 5 for c in clients), [c.plane_counts for c in clients]
            publishes = [a["publishes"] for a in broker.stats()["agents"].values()]
            clients[2].close()
            before = [c.plane_counts["shm"] for c in clients[:2]]
            _rounds(clients[:2], 5, x)
            events = broker.stats()["events"]
            assert events["sessions"] == 1 and events["sessions-ended"] == 1, events
            assert [c.plane_counts["shm"] - b for c, b in zip(clients, before)] == [5, 5]
            assert clients[0].last_weights == {0: 0.5, 1: 0.5}, "rank 0 was not rewired to read rank 1"
            assert publishes[0] < 8, "the session's rounds went through the broker"
        finally:
            for c in clients:
                c.close()


@pytest.mark.parametrize(
    "fields,frames,why",
    [
        (
            {"round": 0, "tensors": [{"name": "x", "dtype": "float32", "shape": [2], "nbytes": 8}], "ref": [1]},
            [],
            "'ref' must be a map",
        ),
        ({"round": 0, "unreachable": [-1]}, None, "'unreachable' must be a list of ranks"),
        ({"round": 0, "unreachable": [True]}, None, "'unreachable' must be a list of ranks"),
    ],
)
def test_malformed_data_plane_fields_are_refused_with_the_rule(fields, frames, why):
    cmd = wire.PUBLISH if frames is not None else wire.COLLECT
    with pytest.raises(wire.WireError, match=why) as err:
        wire.decode(wire.encode(cmd, {"seq": 3, **fields}, frames or ()))
    assert err.value.code == "bad-message" and err.value.seq == 3


def test_a_reference_only_letter_moves_no_bytes_through_the_broker():
    tensors = [{"name": "x", "dtype": "float32", "shape": [2], "nbytes": 8}]
    msg = wire.decode(wire.encode(wire.PUBLISH, {"seq": 1, "round": 0, "tensors": tensors, "ref": {"slot": 0}}))
    assert msg.frames == [] and [s.nbytes for s in msg.specs] == [8]
    with pytest.raises(wire.WireError, match="payload frames"):  # without a ref the frames must be there
        wire.decode(wire.encode(wire.PUBLISH, {"seq": 1, "round": 0, "tensors": tensors}))


def _ring_of_2(run_dir, plane, frames, *options) -> None:
    """``gossiprl run``: a sync CartPole ring of 2 over ``plane`` for ``frames`` in all."""
    result = invoke(
        "run",
        *("--agents", 2, "--topology", "ring", "--data-plane", plane, "--total-frames", frames),
        *options,
        *("--run-dir", run_dir, "--no-progress", "--stop-at-return", "none"),
    )
    assert result.exit_code == 0, result.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plane", ["shm", "direct"])
def test_cartpole_run_over_a_data_plane(tmp_path, plane):
    assert _segments_left() == []
    run_dir = tmp_path / "run"
    _ring_of_2(run_dir, plane, 8000, "--log-every", 20)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 8000 and not summary["failed"]
    rows = list(csv.DictReader((run_dir / "agent-0" / "metrics.csv").open()))
    assert any(float(row["gossip/peers"]) == 1.0 for row in rows), "no letter was ever mixed"
    assert _segments_left() == []


@pytest.mark.timeout(120)
def test_a_sync_run_learns_bitwise_the_same_parameters_over_the_broker_and_shared_memory(tmp_path):
    """Where a letter's bytes travel must not change what a sync swarm learns: the turn locks fix
    every round's letters whatever the plane. experiments/ runs its cells over shared memory and
    reuses cells run through the broker on the strength of this."""
    import torch

    params = {}
    for plane in ("broker", "shm"):
        run_dir = tmp_path / plane
        _ring_of_2(run_dir, plane, 4000, "--seed", 7, "--log-every", 5)
        rows = list(csv.DictReader((run_dir / "agent-0" / "metrics.csv").open()))
        assert any(float(row["gossip/peers"]) == 1.0 for row in rows), f"over {plane}: no letter was ever mixed"
        params[plane] = [torch.load(run_dir / f"agent-{r}" / "checkpoint.pt")["model"] for r in range(2)]
    for rank, (over_broker, over_shm) in enumerate(zip(params["broker"], params["shm"])):
        assert over_broker.keys() == over_shm.keys()
        assert all(torch.equal(over_broker[k], over_shm[k]) for k in over_broker), f"agent-{rank} learned otherwise"


@pytest.mark.timeout(120)
def test_bench_rows_measure_every_path():
    from gossiprl.bench import planes as bench_planes

    table = bench_planes.run(
        agents=(2,),
        numel=10_000,
        rounds=3,
        warmup=1,
        rows=("gala_shm", "gloo_ring", "gloo_allreduce", "shm", "direct"),
        echo=lambda _: None,
    )
    assert all(table[0][row] > 0 for row in ("gala_shm", "gloo_ring", "gloo_allreduce", "shm", "direct"))
    assert table[0]["shm_over_gala"] > 0
    # every row counts the CPU its rounds took (process_time of each agent, and the parent's broker)
    assert all(table[0][f"{row}_cpu"] > 0 for row in ("gala_shm", "gloo_ring", "gloo_allreduce", "shm", "direct"))


@pytest.mark.timeout(30)
def test_bench_scale_names_a_crashed_agent_at_once_instead_of_waiting_on_its_neighbours():
    from gossiprl.bench.scale import _wait_for_agents

    def python(code):
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    broker = python("import time; time.sleep(60)")  # stand-ins that never finish on their own, as below
    parked = python("import time; time.sleep(60)")  # waits on its crashed neighbour's letter
    crashed = python("import sys; sys.exit('boom: no route to the broker')")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)failed.*agent-1 \(exit 1\).*boom: no route"):
        _wait_for_agents(broker, [parked, crashed], timeout=20)
    assert time.monotonic() - started < 10
    assert broker.poll() is not None and parked.poll() is not None  # killed, not left running

    stuck = python("import time; time.sleep(60)")
    with pytest.raises(RuntimeError, match=r"(?s)gave no result within 0.5s.*agent-0"):
        _wait_for_agents(python("import time; time.sleep(60)"), [stuck], timeout=0.5)


@pytest.mark.timeout(200)
def test_bench_scale_quick(tmp_path):
    from gossiprl.bench import scale as bench_scale

    if bench_scale.unavailable():
        pytest.skip(bench_scale.unavailable())
    plot = tmp_path / "scale.png"
    result = invoke("bench", "scale", "--quick", "--plot", plot, "--json", tmp_path / "scale.json")
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "scale.json").read_text())["table"]
    assert [row["hosts"] for row in table] == [2, 4]
    assert all(row["broker"] > 0 and row["direct"] > 0 for row in table)
    assert all(row["direct_counts"]["direct"] > 0 and row["direct_counts"]["unreachable"] == 0 for row in table)
    assert plot.stat().st_size > 0
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"gscale-{os.getpid()}-" not in leftovers, "the bench left namespaces behind"


@pytest.mark.parametrize("names,path", [(("agent", "agent"), "direct"), (("agent-0", "agent-1"), "relay")])
def test_direct_fetches_are_curve_authenticated(tmp_path, names, path):
    """Agents sharing a key pair fetch from each other over CURVE; agents with their own keys cannot
    (a writer admits only its own public key) and fall back to the relay, never to plaintext."""
    broker, clients = _curve_ring(tmp_path, names)
    try:
        for value in range(6):
            clients[0].publish({"x": np.full(3, float(value), np.float32)})
            clients[1].publish({"x": np.full(3, -1.0, np.float32)})
            got = clients[1].collect()
            clients[0].collect()
        assert clients[1].plane_counts[path] >= 3, clients[1].plane_counts
        assert got[0]["x"][0] == 5.0
        assert clients[0]._plane.server.public_key is not None
    finally:
        for c in clients:
            c.close()
        broker.close()


@pytest.mark.parametrize("plane", ["shm", "direct"])
def test_async_reader_that_fell_behind_gets_the_newest_whole_letter(plane):
    """Its mailbox still names the first letter (async skips full slots), long overwritten in the
    writer's three slots: it must get the writer's newest letter, not nothing and not a torn one."""
    with Broker(topologies.make("ring", 2), mode="async", data_plane=plane).start() as broker:
        with GossipClient(broker.address, 0, **FAST) as writer, GossipClient(broker.address, 1, **FAST) as reader:
            for k in range(10):
                writer.publish({"x": np.full(1000, float(k), np.float32)})
            letters = reader.collect()
            assert letters[0]["x"].min() == letters[0]["x"].max() == 9.0
            assert reader.plane_counts["overwritten"] == 0


def test_writer_that_connects_but_does_not_answer_is_slow_not_unreachable():
    """A starved writer process must not push its edge onto the relay for good: it lost a round."""
    with Broker(topologies.make("ring", 2), data_plane="direct").start() as broker:
        clients = [GossipClient(broker.address, r, timeout=20, **FAST) for r in range(2)]
        try:
            clients[0]._plane.server._answer = lambda identity, req: None  # takes requests, never replies
            clients[1]._plane.fetcher.patience = 2.0
            for _ in range(2):
                clients[0].publish({"x": np.zeros(3, np.float32)})
                clients[1].publish({"x": np.ones(3, np.float32)})
                assert clients[1].collect() == {}
                clients[0].collect()
            assert clients[1].plane_counts["slow"] == 2 and clients[1].plane_counts["unreachable"] == 0
            assert "data-plane-fallbacks" not in broker.stats()["events"]
        finally:
            for c in clients:
                c.close()


def test_reader_of_a_writer_that_closed_its_server_does_not_wait_for_it():
    """The end of a run: a writer's last exchange returned and it closed its letter server before a
    slower reader fetched its last letter, over a connection that was up the round before. The
    reader must give that letter up at once (its reconnections fail), not wait ten liveness windows."""
    with Broker(topologies.make("ring", 2), data_plane="direct").start() as broker:
        clients = [GossipClient(broker.address, r, timeout=20, **FAST) for r in range(2)]
        try:
            clients[1]._plane.fetch_timeout = 2.0
            clients[1]._plane.fetcher.patience = 10.0
            for value in (1.0, 2.0):
                clients[0].publish({"x": np.full(3, value, np.float32)})
                clients[1].publish({"x": np.zeros(3, np.float32)})
                if value == 1.0:
                    assert clients[1].collect()[0]["x"][0] == 1.0
                    clients[0].collect()
            clients[0]._plane.server.close()
            start = time.monotonic()
            assert clients[1].collect() == {}
            waited = time.monotonic() - start
            assert waited < clients[1]._plane.fetch_timeout, f"waited {waited:.1f} s for a closed server"
            assert clients[1].plane_counts["hung-up"] == 1 and clients[1].plane_counts["slow"] == 0
        finally:
            clients[0]._plane.server = None
            for c in clients:
                c.close()


def test_writer_without_an_ack_sends_its_next_letter_through_the_broker():
    """Without the ACK of its last letter a writer cannot know a slot is free (a reader may hold
    the last two in place): the next letter goes the broker's way, bytes and all."""
    from gossiprl import GossipTimeout

    with Broker(topologies.make("ring", 2), data_plane="shm").start() as broker:
        with GossipClient(broker.address, 0, **FAST) as writer, GossipClient(broker.address, 1, **FAST) as reader:
            writer.publish({"x": np.full(8, 0.0, np.float32)})
            for value in (1.0, 2.0):  # the reader never reads: no ACK
                with pytest.raises(GossipTimeout):
                    writer.publish({"x": np.full(8, value, np.float32)}, timeout=0.3)
            assert writer._plane.segment.letters == 2 and writer.plane_counts["sent-inline"] == 1
            assert reader.collect()[0]["x"][0] == 0.0 and reader.plane_counts["shm"] == 1
            assert reader.collect()[0]["x"][0] == 2.0 and reader.plane_counts["relay"] == 1


@pytest.mark.timeout(120)
def test_kill_9_of_the_launcher_and_its_agents_leaves_no_segment(tmp_path):
    run_dir = tmp_path / "run"
    launcher = start_endless_swarm(
        run_dir,
        "--data-plane",
        "shm",
        "--log-every",
        "5",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # Killed all at once, no process is left to remove the launcher's private dir: keep it in here.
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        wait_until_training(run_dir, launcher, 90, "the swarm never started")
        assert _segments_left(launcher.pid), "the swarm runs without any segment: this test would prove nothing"
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
    poll_until(lambda: not _segments_left(launcher.pid), 10)  # the agents die a moment after the launcher
    assert _segments_left(launcher.pid) == []


def test_unknown_data_plane_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="broker, shm, direct, auto"):
        Broker(topologies.make("ring", 2), data_plane="rdma")
    result = invoke("broker", "--agents", 2, "--data-plane", "rdma")
    assert result.exit_code == 2 and "'broker', 'shm', 'direct', 'auto'" in result.output


def test_a_new_schema_makes_a_new_segment_that_readers_tell_apart():
    seg, reader = Segment(), ShmReader()
    specs, ref = seg.write({"x": np.ones(4, np.float32)}, 0)
    assert reader.read(ref, specs, latest=False)["x"].sum() == 4.0
    specs, ref2 = seg.write({"x": np.full(1000, 2.0, np.float32)}, 1)
    assert ref2["token"] != ref["token"]
    assert reader.read(ref2, specs, latest=False)["x"].sum() == 2000.0
    reader.close()
    seg.close()


@pytest.mark.timeout(20)
def test_a_reference_to_a_pipe_or_garbage_is_refused_not_followed():
    """References come from other agents: one naming a pipe must neither hang nor crash a reader."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    try:
        plane_ref = {"pid": os.getpid(), "fd": read_end, "token": "00" * 16, "slot": 0, "version": 2, "host": "here"}
        specs = [TensorSpec("x", "float32", (4,), 16, "float32")]
        with pytest.raises(OSError):
            ShmReader().read(plane_ref, specs, latest=False)
        from gossiprl.comms.dataplane import AgentPlane
        from gossiprl.comms.wire import Message

        plane = AgentPlane("shm", "tcp://127.0.0.1:1", "sync")
        plane.host = "here"
        for ref in (plane_ref, {**plane_ref, "pid": "self"}, {**plane_ref, "fd": None}):
            msg = Message("DELIVER", {"messages": [{"rank": 1, "ref": ref, "specs": specs}]})
            assert plane.receive(msg) == {}
        assert plane.unreachable == {1}
        plane.close()
    finally:
        os.close(read_end)
