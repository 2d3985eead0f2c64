"""A session's turn locks in shared memory (gossiprl.comms.shmlocks), without sockets.

The agents of these tests are state machines in one process, each with its own control segment
and its neighbours' mapped read-only, exactly as across processes. Agents that leave the session
take their turns from the real TurnLocks, as the broker would give them: the model checks that,
whatever the interleaving and whoever leaves when, every reader mixes in round r its in-peers'
letters of round r, each once, with a weight for each, and nobody waits for ever.
"""

import os
import random
import threading
import time

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import topologies
from gossiprl.comms import shmlocks
from gossiprl.comms.turnlocks import TurnLocks

SESSION = 7


def _peer(ctl: shmlocks.Control, n: int) -> shmlocks.PeerControl:
    return shmlocks.PeerControl(os.getpid(), ctl.fd, ctl.token.hex(), n)


class Agent:
    """One agent's rounds: publish then collect, by the session's turns or, once it left, the broker's."""

    def __init__(self, rank, topology, controls, locks, log, dispatch):
        n = topology.n
        self.rank, self.locks, self.log, self.dispatch = rank, locks, log, dispatch
        self.row, self.weights = topology.weights(rank, 0), {}
        """The session's static row, as GossipClient keeps it; the row each round was mixed by."""
        ins = {w: _peer(controls[w], n) for w in topology.in_peers(rank, 0)}
        outs = {p: _peer(controls[p], n) for p in topology.out_peers(rank, 0)}
        self.turns = shmlocks.Turns(controls[rank], rank, SESSION, ins, outs)
        self.round, self.phase = 0, "publish"
        self.taken, self.asked, self.ack, self.deliver = set(), False, False, None

    def _turn(self, decision):
        state, peer = decision
        if state == shmlocks.LEAVE:
            self.turns.leave()
        return peer if state == shmlocks.WAIT else None

    def step(self) -> bool:
        """One move if the turns allow it; False when blocked."""
        t = self.turns
        if self.phase == "publish":
            if not t.left:
                if self._turn(t.may_post()) is not None:
                    return False
                if not t.left:
                    t.post(2 * self.round + 2)
                    self.phase = "collect"
                    return True
            if t.undrained() is not None:
                return False
            if not self.asked:
                self.asked, self.ack = True, False
                self.dispatch(self.locks.publish(self.rank, 1, self.round, {"k": self.round}, [], 0, now=0.0))
                return True
            if not self.ack:
                return False
            self.phase, self.asked = "collect", False
            return True
        for w in t.ins:
            if w in self.taken or w in self.log.get((self.rank, self.round), {}):
                continue
            if self._turn(t.may_read(w)) is not None:
                return False
            version = t.pending(w)
            if version is not None:
                self.log.setdefault((self.rank, self.round), {})[w] = version // 2 - 1
                t.mark_read(w)
                self.taken.add(w)
        t.ring(shmlocks.FOR_READ)
        if t.left:
            if not self.asked:
                self.asked, self.deliver = True, None
                self.dispatch(self.locks.collect(self.rank, 2, self.round, now=0.0, skip=self.taken))
                return True
            if self.deliver is None:
                return False
            for entry in self.deliver["messages"]:
                got = self.log.setdefault((self.rank, self.round), {})
                assert entry["rank"] not in got, "a letter came twice in one round"
                got[entry["rank"]] = entry["k"]
            self.weights[self.round] = {int(j): w for j, w in self.deliver["weights"]}
        else:
            self.weights[self.round] = dict(self.row)
        self.round, self.phase, self.taken, self.asked = self.round + 1, "publish", set(), False
        return True


def _run(topology, rounds, leave_at, seed):
    """Every agent's letters, by (reader, round), and the rows they were mixed by. An agent that has
    done its rounds leaves the session and then the swarm, as a finished agent does (BYE)."""
    n = topology.n
    controls = [shmlocks.Control(n) for _ in range(n)]
    locks = TurnLocks(topology)
    log = {}

    def dispatch(replies):
        for reply in replies:
            if reply.cmd == "ACK":
                agents[reply.rank].ack = True
            else:
                agents[reply.rank].deliver = reply.fields

    agents = [Agent(r, topology, controls, locks, log, dispatch) for r in range(n)]
    for a in agents:
        a.turns.enter()
    rng, steps = random.Random(seed), 0
    try:
        while any(a.round < rounds for a in agents):
            moved = False
            for a in rng.sample(agents, n):
                if a.round >= rounds:
                    continue
                if leave_at.get(a.rank) == steps:
                    a.turns.leave()
                moved |= a.step()
                if a.round == rounds:
                    a.turns.leave()
                    dispatch(locks.gone(a.rank, now=0.0))
                steps += 1
                _one_letter_per_edge(topology, controls, locks)
            assert moved or any(leave_at.get(a.rank, -1) > steps for a in agents), f"deadlock at {steps} steps"
    finally:
        for a in agents:
            a.turns.close()
        for c in controls:
            c.close()
    return log, {a.rank: a.weights for a in agents}


def _one_letter_per_edge(topology, controls, locks):
    """PALA's turn lock: an edge never holds two unread letters, counting both its paths."""
    for i in range(topology.n):
        for j in topology.in_peers(i, 0):
            unread = controls[j].sent(i) - controls[i].read(j) + ((j, i) in locks.mailbox)
            assert unread <= 1, f"edge {j} -> {i} holds {unread} unread letters"


def _check(topology, rounds, run):
    """Each round's letters are the in-peers' of that round, and each is mixed with the weight the
    matrix gives it: a row that lacked one would drop its letter (gossip.mix)."""
    log, weights = run
    for i in range(topology.n):
        ins = set(topology.in_peers(i, 0))
        for r in range(rounds):
            assert log.get((i, r), {}) == dict.fromkeys(ins, r), f"rank {i} round {r}: {log.get((i, r))}"
            assert weights[i][r] == topology.weights(i, r), f"rank {i} round {r} mixed by {weights[i][r]}"


@pytest.mark.parametrize("name,n", [("ring", 2), ("ring", 4), ("full", 3), ("sparse", 5)])
def test_every_reader_gets_each_round_letter_once_in_shared_memory(name, n):
    topology = topologies.make(name, n)
    _check(topology, 6, _run(topology, 6, {}, seed=1))


@settings(max_examples=40, deadline=None)
@example(n=2, full=False, leaves={0: 17}, seed=0)  # the finished writer's letter kept its weight
@example(n=3, full=False, leaves={0: 23}, seed=2)  # and no bypass letter was waited for in its place
@given(
    n=st.integers(2, 5),
    full=st.booleans(),
    leaves=st.dictionaries(st.integers(0, 4), st.integers(0, 60), max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_leaving_the_session_at_any_moment_keeps_every_edge_in_order(n, full, leaves, seed):
    """Whoever leaves whenever, the turns that follow go through the broker's locks with nothing lost,
    doubled or shifted by a round: a writer drains its edges first, a reader skips what it took. And
    the agents that finish first (gone to the broker) keep their weight in their readers' last round."""
    topology = topologies.make("full" if full else "ring", n)
    leave_at = {r: s for r, s in leaves.items() if r < n}
    _check(topology, 5, _run(topology, 5, leave_at, seed))


@pytest.fixture
def segments():
    """make(n, k): k control segments for n agents, closed after the test whatever it asserted."""
    made = []

    def make(n, k):
        made.extend(shmlocks.Control(n) for _ in range(k))
        return made[-k:]

    yield make
    for c in made:
        c.close()


def test_a_writer_waits_for_its_reader_before_posting_again(segments):
    n = 2
    a, b = segments(n, 2)
    writer = shmlocks.Turns(a, 0, SESSION, {1: _peer(b, n)}, {1: _peer(b, n)})
    reader = shmlocks.Turns(b, 1, SESSION, {0: _peer(a, n)}, {0: _peer(a, n)})
    assert writer.may_post()[0] == shmlocks.WAIT, "the reader has not joined the session yet"
    writer.enter()
    reader.enter()
    assert writer.may_post() == (shmlocks.POST, None)
    writer.post(2)
    assert writer.may_post()[0] == shmlocks.WAIT, "one unread letter per edge"
    assert reader.pending(0) == 2
    reader.mark_read(0)
    assert reader.pending(0) is None and writer.may_post() == (shmlocks.POST, None)
    reader.leave()
    assert writer.may_post() == (shmlocks.LEAVE, None), "a writer never posts to a reader that left"
    writer.close()
    reader.close()


def test_an_agent_that_cannot_map_a_neighbour_is_never_seen_in_the_session(segments):
    """Its writer looks at the reader's segment at the worst moment, right after the reader wrote
    the session's id: it must find it already left, or it posts a letter nobody will read (issue 18)."""
    n = 2
    a, b = segments(n, 2)
    writer = shmlocks.Turns(a, 0, SESSION, {1: _peer(b, n)}, {1: _peer(b, n)})
    reader = shmlocks.Turns(b, 1, SESSION, {0: None}, {0: _peer(a, n)})
    writer.enter()
    seen, enter = [], b.enter

    def watched(*args, **kwargs):
        enter(*args, **kwargs)
        seen.append(writer.may_post())

    b.enter = watched
    reader.enter()
    assert reader.left and seen == [(shmlocks.LEAVE, None)], "the writer saw the reader in the session"
    assert writer.may_post() == (shmlocks.LEAVE, None)
    writer.close()
    reader.close()


def test_a_writer_that_left_waits_for_no_reader_to_join(segments):
    """A reader that never heard of the session never joins: once the broker told the writer the
    session ended, the writer goes the broker's way instead of waiting for it."""
    n = 2
    a, b = segments(n, 2)
    writer = shmlocks.Turns(a, 0, SESSION, {}, {1: _peer(b, n)})
    writer.enter()
    assert writer.may_post() == (shmlocks.WAIT, writer.outs[1])
    writer.leave()
    assert writer.may_post() == (shmlocks.LEAVE, None) and writer.undrained() is None
    writer.close()


def test_a_wait_ends_when_the_awaited_peer_rings_and_at_its_deadline(segments):
    n = 2
    (own,) = segments(n, 1)
    peer = _peer(own, n)
    flag = threading.Event()

    def blocked():
        return None if flag.is_set() else peer

    def change():
        time.sleep(0.05)  # the change comes while the test sleeps in the futex, the wait being tested
        flag.set()  # the change first, then the doorbell, as every agent does
        own.ring()

    assert shmlocks.wait_for(blocked, deadline=time.monotonic() + 0.05) is False
    t0 = time.monotonic()
    threading.Thread(target=change).start()
    assert shmlocks.wait_for(blocked, deadline=t0 + 5.0) is True
    assert time.monotonic() - t0 < 0.5, "the futex slept through the doorbell"
    peer.close()


def test_a_control_segment_that_is_not_one_is_refused(segments):
    n = 3
    (own,) = segments(n, 1)
    with pytest.raises(shmlocks.ControlRefused, match=f"not {shmlocks.size_for(2)} for 2"):
        shmlocks.PeerControl(os.getpid(), own.fd, own.token.hex(), 2)
    with pytest.raises(shmlocks.ControlRefused, match="not that agent's"):
        shmlocks.PeerControl(os.getpid(), own.fd, "00" * 16, n)
    fd = os.memfd_create("plain")
    os.ftruncate(fd, shmlocks.size_for(n))
    try:
        with pytest.raises(shmlocks.ControlRefused, match="not sealed"):
            shmlocks.PeerControl(os.getpid(), fd, own.token.hex(), n)
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        with pytest.raises(shmlocks.ControlRefused, match="does not name"):
            shmlocks.PeerControl(os.getpid(), r, own.token.hex(), n)
    finally:
        os.close(r)
        os.close(w)


def test_forged_counters_stall_or_skip_only_the_forgers_edges(segments):
    """A reader that claims to have read what it never read lets its writer post on, to it alone;
    a writer that claims letters it never posted hands its reader a version, which the reader's
    copy-then-check (dataplane.ShmReader) refuses unless the slot holds it."""
    n = 3
    ctl = segments(n, n)
    writer = shmlocks.Turns(ctl[0], 0, SESSION, {}, {1: _peer(ctl[1], n), 2: _peer(ctl[2], n)})
    for c in ctl:
        c.enter(SESSION)
    writer.post(2)
    ctl[1].edges[0, 2] = 10**6  # rank 1 forges: "read a million"
    assert writer.may_post() == (shmlocks.WAIT, writer.outs[2]), "rank 2 is still waited on"
    reader = shmlocks.Turns(ctl[2], 2, SESSION, {0: _peer(ctl[0], n)}, {})
    ctl[0].edges[2, 0] = np.int64(2**62)  # rank 0 forges its count on the edge to 2
    assert reader.pending(0) == 2, "the forged count only says a letter is there; its version is the posted one"
    writer.close()
    reader.close()
