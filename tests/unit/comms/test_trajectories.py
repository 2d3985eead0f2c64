"""IMPALA's channel between a learner and its actor processes (gossiprl.comms.trajectories), with
actors played by this test: the schema, the credits, the order, bad messages, failed actors, and the hostile or
unlucky peer: joins past the bound, credits hoarded, a reconnection, a routing id stolen."""

import logging
import re
import socket
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from gossiprl.comms import keys
from gossiprl.comms import trajectories as tj
from gossiprl.comms.wire import WireError
from helpers import wait_for

T, N, OBS, ACTIONS, PARAMS = 3, 2, (4,), 2, 10
SPECS = tj.unroll_specs(T, N, OBS, "float32", ACTIONS)
WELCOME = {"params": PARAMS, "n_steps": T, "num_envs": N, "gamma": 0.99}


@pytest.fixture
def learner(tmp_path):
    ends = []

    def make(capacity=3, silence_s=tj.SILENCE_S, **options):
        end = tj.LearnerEnd(
            f"ipc://{tmp_path}/t{len(ends)}",
            "CartPole-v1",
            SPECS,
            WELCOME,
            capacity,
            lambda a: 100 + a,
            silence_s=silence_s,
            **options,
        )
        ends.append(end)
        return end

    yield make
    for end in ends:
        end.close()


def unroll(marker: float) -> dict:
    return {
        "obs": np.full((T + 1, N, *OBS), marker, np.float32),
        "actions": np.zeros((T, N), np.int64),
        "rewards": np.full((T, N), marker, np.float32),
        "dones": np.zeros((T, N), np.float32),
        "bootstrap": np.zeros((T, N), np.float32),
        "logits": np.zeros((T, N, ACTIONS), np.float32),
    }


@pytest.fixture
def actor_of():
    """An actor's end connected to a learner (and joined to it, unless told not to), closed after the test."""
    actors = []

    def make(end, join=True) -> tj.ActorEnd:
        actor = tj.ActorEnd(end.endpoint, silence_s=5)
        actors.append(actor)
        actor.expect_params(PARAMS)
        if join:
            actor.join("CartPole-v1")
        return actor

    yield make
    for actor in actors:
        actor.close()


def take_all(end, n, timeout=10):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        trajectory = end.take(0.05)
        if trajectory is not None:
            got.append(trajectory)
    return got


def frames_of(cmd, fields, arrays=None):
    return [bytes(memoryview(f)) for f in tj.encode(cmd, fields, arrays)]


def test_a_well_formed_unroll_decodes_to_views_of_its_frames():
    cmd, header, arrays = tj.decode(
        frames_of(tj.UNROLL, {"index": 0, "version": 2, "episodes": [[9.0, 9]]}, unroll(1.5)), {tj.UNROLL: SPECS}
    )
    assert (cmd, header["version"], header["episodes"]) == (tj.UNROLL, 2, [[9.0, 9]])
    assert arrays["obs"].shape == (T + 1, N, 4) and float(arrays["rewards"][0, 0]) == 1.5


@pytest.mark.parametrize(
    "frames, why",
    [
        ([b"\xc1"], "not a msgpack map"),
        ([msgpack.packb({"v": 2, "cmd": "FETCH", "have": 0})], "v = 1"),
        (frames_of("SHUTDOWN", {}), "unknown command"),
        (frames_of(tj.FETCH, {"have": 0, "extra": 1}), "unknown field"),
        (frames_of(tj.FETCH, {"have": True}), "'have': an int"),
        (frames_of(tj.FETCH, {"have": -2}), "'have': an int from -1"),
        (frames_of(tj.FETCH, {}), "'have'"),
        (frames_of(tj.LEAVE, {"reason": "bye"}), "unknown field"),
        (frames_of(tj.LEAVE, {}) + [b"1"], "carries 0 payload"),
        (frames_of(tj.FAILED, {"reason": "x" * 2000}), "at most 1000"),
        (frames_of(tj.FETCH, {"have": 0}) + [b"1"], "carries 0 payload"),
        (
            frames_of(
                tj.UNROLL,
                {"index": 0, "version": 0, "episodes": []},
                {**unroll(0), "obs": np.zeros((T, N, 4), np.float32)},
            ),
            "differ from the agreed",
        ),
        (
            frames_of(
                tj.UNROLL,
                {"index": 0, "version": 0, "episodes": []},
                {**unroll(0), "actions": np.zeros((T, N), np.int32)},
            ),
            "differ from the agreed",
        ),
        (
            frames_of(tj.UNROLL, {"index": 0, "version": 0, "episodes": [[1.0, 1]] * (T * N + 1)}, unroll(0)),
            "at most one per env step",
        ),
        (
            frames_of(tj.UNROLL, {"index": 0, "version": 0, "episodes": [[float("nan"), 1]]}, unroll(0)),
            "[return, length]",
        ),
        (frames_of(tj.PARAMS, {"version": 0}, {"params": np.zeros(PARAMS, np.float32)}), "not expected here"),
    ],
)
def test_a_message_off_its_schema_is_refused_with_the_reason(frames, why):
    with pytest.raises(WireError, match=re.escape(why)):
        tj.decode(frames, {tj.UNROLL: SPECS})


def test_a_frame_shorter_than_its_schema_says_is_refused():
    frames = frames_of(tj.UNROLL, {"index": 0, "version": 0, "episodes": []}, unroll(0))
    frames[2] = frames[2][:-4]
    with pytest.raises(WireError, match="its frame has"):
        tj.decode(frames, {tj.UNROLL: SPECS})


def test_joining_gives_each_actor_its_number_seed_and_the_unrolls_shape(learner, actor_of):
    end = learner()
    first, second, wrong = actor_of(end, join=False), actor_of(end, join=False), actor_of(end, join=False)
    assert first.join("CartPole-v1") == {"v": 1, "cmd": tj.WELCOME, "actor": 0, "seed": 100, **WELCOME}
    assert second.join("CartPole-v1")["actor"] == 1 and end.joined == 2
    with pytest.raises(tj.LearnerGone, match="refused this actor: this learner trains on CartPole-v1, not Acrobot-v1"):
        wrong.join("Acrobot-v1")


def test_parameters_are_fetched_only_when_newer(learner, actor_of):
    end = learner()
    actor = actor_of(end)
    into = np.zeros(PARAMS, np.float32)
    assert actor.fetch(into, -1) == -1 and not into.any()  # nothing posted yet
    end.publish(np.arange(PARAMS, dtype=np.float32), 0)
    assert actor.fetch(into, -1) == 0 and into[3] == 3
    into[:] = -1
    assert actor.fetch(into, 0) == 0 and into[3] == -1  # CURRENT: the copy it holds is left alone
    end.publish(np.full(PARAMS, 7, np.float32), 4)
    assert actor.fetch(into, 0) == 4 and (into == 7).all()


def test_credits_bound_the_queue_and_a_full_queue_blocks_the_actor(learner, actor_of):
    end = learner(capacity=3)
    actor = actor_of(end)
    sent = 0
    while sent < 3:
        assert actor.wait_for_credit()
        actor.send_unroll(sent, 0, unroll(sent), [])
        sent += 1
    deadline = time.monotonic() + 5
    while end.depth() < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    blocked = threading.Thread(target=actor.wait_for_credit, daemon=True)
    blocked.start()
    blocked.join(1.5)
    assert blocked.is_alive() and actor.credits == 0 and end.depth() == 3  # full: no credit, nothing dropped
    assert end.take(1).index == 0
    blocked.join(5)
    assert not blocked.is_alive() and actor.credits == 1  # a taken unroll frees one credit


def test_every_unroll_arrives_once_in_its_actors_order(learner, actor_of):
    end = learner(capacity=4)
    actors = [actor_of(end) for _ in range(2)]

    def send(actor, number):
        for index in range(25):
            actor.wait_for_credit()
            actor.send_unroll(index, index // 5, unroll(number * 100 + index), [(1.0, 2)])

    threads = [threading.Thread(target=send, args=(a, n)) for n, a in enumerate(actors)]
    for thread in threads:
        thread.start()
    got = take_all(end, 50)
    for thread in threads:
        thread.join(10)
    assert len(got) == 50 and end.take(0.2) is None
    for number in (0, 1):
        mine = [t for t in got if t.actor == number]
        assert [t.index for t in mine] == list(range(25))
        assert [float(t.arrays["rewards"][0, 0]) for t in mine] == [number * 100 + i for i in range(25)]
        assert all(t.episodes == [(1.0, 2)] and t.version == t.index // 5 for t in mine)


def test_a_bad_message_is_dropped_and_counted_and_the_channel_goes_on(learner, actor_of):
    end = learner()
    rogue = actor_of(end, join=False)
    rogue._sock.send(b"garbage")
    rogue._send(tj.UNROLL, {"index": 0, "version": 0, "episodes": []}, unroll(0))  # never joined
    actor = actor_of(end)
    actor.wait_for_credit()
    actor._send(tj.UNROLL, {"index": 0, "version": 0, "episodes": []}, {**unroll(0), "obs": np.zeros(3, np.float32)})
    deadline = time.monotonic() + 5
    while end.bad_messages < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert end.bad_messages == 3 and end.depth() == 0
    actor.send_unroll(0, 0, unroll(5), [])
    assert float(take_all(end, 1)[0].arrays["obs"][0, 0, 0]) == 5


def test_one_of_the_learners_own_actors_that_fails_stops_the_learner_with_its_reason(learner):
    end = learner(reserved=[b"own-actor-0"])
    actor = own_actor(end)
    actor.fail("ValueError: env exploded\n  (traceback lines)")
    try:
        with pytest.raises(tj.ActorFailed, match=r"^actor-0 failed: ValueError: env exploded \(traceback lines\)$"):
            take_all(end, 1)
    finally:
        actor.close()


def test_an_actor_from_elsewhere_that_fails_is_dropped_and_the_learner_goes_on(learner, actor_of, caplog):
    """Any actor's FAILED stopped the learner, so any holder of an admitted key could end the run at
    will. One from elsewhere is now dropped as if it had left: its reason logged in one line and
    counted in ``failed``, its seat and credits freed for the others."""
    end = learner(capacity=2)
    failing, staying = actor_of(end), actor_of(end)
    with caplog.at_level(logging.WARNING, logger=tj.log.name):
        failing.fail("ValueError: env exploded\n  (traceback lines)")
        wait_for(lambda: end.failed == 1, 5, "the learner did not drop the actor that failed")
    assert end.failures == [] and end.left == 0 and end.bad_messages == 0
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].startswith("actor-0 failed: ValueError: env exploded (traceback lines): ")
    assert staying.wait_for_credit()
    staying.send_unroll(0, 0, unroll(1), [])
    assert [(t.actor, t.index) for t in take_all(end, 1)] == [(1, 0)]


def test_a_reason_off_the_wire_is_made_one_line_by_its_receiver(learner, actor_of):
    """The sender's word that its reason is one line is not taken: a peer that sends newlines or a
    terminal escape would otherwise write lines of its own into the other end's error and log."""
    end = learner(reserved=[b"own-actor-0"])
    actor = own_actor(end)
    actor._send(tj.FAILED, {"reason": "boom\nINFO forged line\x1b[2K\r\tend"})
    with pytest.raises(tj.ActorFailed) as failed:
        take_all(end, 1)
    actor.close()
    assert str(failed.value) == "actor-0 failed: boom INFO forged line [2K end"
    stranger = actor_of(end, join=False)
    with pytest.raises(tj.LearnerGone) as refused:
        stranger.join("Pong\nERROR forged")
    assert str(refused.value).endswith("this learner trains on CartPole-v1, not Pong ERROR forged")


def own_actor(end, routing_id=b"own-actor-0") -> tj.ActorEnd:
    """One of the learner's own actors: joined under a routing id the learner reserved."""
    actor = tj.ActorEnd(end.endpoint, silence_s=5, routing_id=routing_id)
    actor.expect_params(PARAMS)
    actor.join("CartPole-v1")
    return actor


def test_one_of_the_learners_own_actors_that_falls_silent_stops_the_learner(learner):
    end = learner(silence_s=0.3, reserved=[b"own-actor-0"])
    actor = own_actor(end)  # joins, then says nothing
    try:
        with pytest.raises(tj.ActorFailed, match="actor-0 sent nothing for 0.3 s"):
            take_all(end, 1, timeout=5)
    finally:
        actor.close()


def test_one_of_the_learners_own_actors_that_leaves_unasked_stops_the_learner(learner):
    """The learner's own actors leave only when it tells them to: one that goes on its own failed."""
    end = learner(reserved=[b"own-actor-0"])
    own_actor(end).close()
    with pytest.raises(tj.ActorFailed, match="^actor-0 left before its learner told it to stop$"):
        take_all(end, 1, timeout=5)


def test_an_actor_from_elsewhere_that_leaves_is_dropped_at_once_and_the_learner_goes_on(learner, actor_of):
    """An actor said nothing when it closed and the learner never forgot one: a remote actor's
    Ctrl-C stopped its learner SILENCE_S later with ActorFailed. It now says LEAVE, and the learner
    drops it and trains on with the others."""
    end = learner(capacity=2)
    leaving, staying = actor_of(end), actor_of(end)
    leaving.close()
    wait_for(lambda: end.left == 1, 5, "the learner did not drop the actor that left")
    assert staying.wait_for_credit()
    staying.send_unroll(0, 0, unroll(1), [])
    assert [(t.actor, t.index) for t in take_all(end, 1)] == [(1, 0)]
    assert end.failures == [] and end.bad_messages == 0


def test_a_silent_actor_from_elsewhere_is_dropped_rather_than_failing_the_learner(learner, actor_of, caplog):
    """A remote actor whose host or network went away can say nothing: its silence drops it, as a
    LEAVE would, and the learner takes the next actor that joins. With no actor left the learner
    says it waits (it trained on in silence)."""
    end = learner(silence_s=1)
    actor_of(end)  # joins, then says nothing
    with caplog.at_level(logging.WARNING, logger=tj.log.name):
        wait_for(lambda: end.left == 1, 10, "the learner did not drop the silent actor", every=0.05)
        wait_for(lambda: any("no actor left" in r.getMessage() for r in caplog.records), 5, "no word", every=0.05)
    assert f"waiting for the next to join {end.endpoint}" in caplog.text
    assert end.take(0.1) is None and end.failures == []
    newcomer = actor_of(end)
    assert newcomer.wait_for_credit()
    newcomer.send_unroll(0, 0, unroll(2), [])
    assert [(t.actor, t.index) for t in take_all(end, 1)] == [(1, 0)]


def test_a_dropped_actor_that_speaks_again_is_told_to_stop_with_the_reason(learner, actor_of):
    """An actor dropped for its silence (a network outage) that came back got no answer: its
    messages were counted as bad, and it ended only after its own silence_s, not knowing why. It
    is now answered STOP with the reason, and its messages are not counted as bad."""
    end = learner(silence_s=0.3)
    actor = actor_of(end)  # joins, then says nothing
    wait_for(lambda: end.left == 1, 10, "the learner did not drop the silent actor", every=0.05)
    into = np.zeros(PARAMS, np.float32)
    began = time.monotonic()
    actor.fetch(into, -1)
    assert time.monotonic() - began < 2  # not its own silence_s (5 s here)
    assert actor.stopped == (
        "this learner dropped actor-0, which sent nothing for 0.3 s: it hung, or its process, host or "
        "network went away; start the actor again to join anew"
    )
    assert end.bad_messages == 0 and end.failures == []


def test_actors_that_left_free_their_seats(learner, actor_of):
    """Every identity that ever joined kept its seat: after max_actors remote actors had come and
    gone, every later JOIN was refused for good."""
    end = learner(capacity=2)  # two seats for actors from elsewhere
    for number in range(5):
        actor = actor_of(end, join=False)
        assert actor.join("CartPole-v1")["actor"] == number  # numbers are never given again
        actor.close()
        wait_for(lambda n=number: end.left == n + 1, 5, f"actor-{number} was not dropped")
    assert end.joined == 5 and end.refused_joins == 0


def credits_of(actor: tj.ActorEnd, wait_s=0.05) -> int:
    """The credits ``actor`` holds once it has read what came within ``wait_s``."""
    actor._receive(None, wait_s)
    return actor.credits


def test_the_credits_of_an_actor_that_left_return_to_the_pool(learner, actor_of):
    """A leaving actor's credits go to the others at once, and the queue's bound holds: the unrolls
    queued plus the credits granted never exceed its capacity."""
    end = learner(capacity=3)
    hoarder = actor_of(end)
    wait_for(lambda: credits_of(hoarder) == 3, 5, "no credits granted", every=0)
    hoarder.send_unroll(0, 0, unroll(0), [])  # one unroll queued, two credits held
    other = actor_of(end)
    wait_for(lambda: end.depth() == 1, 5, "the unroll did not arrive")
    hoarder.close()
    wait_for(lambda: credits_of(other) == 2, 5, "the credits did not return", every=0)
    assert end.depth() + other.credits == 3 and end.reclaimed == 0
    assert credits_of(other, 0.3) == 2  # nothing past the bound came after


def test_a_stopped_learner_tells_its_actors(learner, actor_of):
    end = learner()
    actor = actor_of(end)
    for index in range(3):  # spend the credits it was granted: the next wait is for the learner
        assert actor.wait_for_credit()
        actor.send_unroll(index, 0, unroll(index), [])
    end.close()
    assert actor.wait_for_credit() is False and actor.stopped == "the learner is done"


def curve_learner(tmp_path) -> tj.LearnerEnd:
    """A learner on tcp with CURVE keys, admitting the actors whose keys are in tmp_path/allowed."""
    keys.generate(tmp_path / "learner", "learner")
    return tj.LearnerEnd(
        "tcp://127.0.0.1:*",
        "CartPole-v1",
        SPECS,
        WELCOME,
        3,
        lambda a: a,
        curve=(tmp_path / "learner" / "learner.key_secret", tmp_path / "allowed"),
    )


def test_with_curve_keys_only_admitted_actors_join(tmp_path):
    keys.generate(tmp_path / "allowed", "actor")
    keys.generate(tmp_path / "other", "stranger")
    end = curve_learner(tmp_path)
    admitted = tj.ActorEnd(
        end.endpoint, curve=(tmp_path / "allowed" / "actor.key_secret", tmp_path / "learner" / "learner.key")
    )
    stranger = tj.ActorEnd(
        end.endpoint,
        curve=(tmp_path / "other" / "stranger.key_secret", tmp_path / "learner" / "learner.key"),
        silence_s=1,
    )
    try:
        assert admitted.join("CartPole-v1")["actor"] == 0
        with pytest.raises(tj.LearnerGone, match="has not answered for 1 s"):
            stranger.join("CartPole-v1")
        assert end.joined == 1
    finally:
        admitted.close(), stranger.close(), end.close()


def test_joins_past_the_learners_bound_are_refused_and_counted(learner, actor_of):
    """Every routing identity that joins is kept and may take credits: without a bound, anyone
    who can reach the socket could join as many as it likes."""
    end = learner(capacity=2)  # by default, a learner admits as many actors as its queue holds unrolls
    actor_of(end), actor_of(end)
    with pytest.raises(tj.LearnerGone, match="refused this actor: this learner admits at most 2 actors"):
        actor_of(end)
    assert end.joined == 2 and end.refused_joins == 1


def test_the_learners_own_actors_keep_their_seats_when_others_joined_first(learner):
    """A learner's own actors and actors from elsewhere were counted against one bound: strangers
    that joined first filled it, and the learner stopped with its own actor's refusal."""
    end = learner(capacity=2, max_actors=1, reserved=[b"own-actor-0"])
    actors = [tj.ActorEnd(end.endpoint, silence_s=5, routing_id=rid) for rid in (None, None, b"own-actor-0")]
    try:
        for actor in actors:
            actor.expect_params(PARAMS)
        assert actors[0].join("CartPole-v1")["actor"] == 0  # the one seat for others
        with pytest.raises(tj.LearnerGone, match="admits at most 1 actors beside its own 1"):
            actors[1].join("CartPole-v1")
        assert end.reserved_missing() == 1  # a stranger's join is not its own actor's: the learner waits on
        assert actors[2].join("CartPole-v1")["actor"] == 1  # its own, after the strangers
        assert end.joined == 2 and end.refused_joins == 1 and end.reserved_missing() == 0
    finally:
        for actor in actors:
            actor.close()


@pytest.mark.parametrize("capacity, max_actors", [(3, None), (2, 3)])
def test_actors_that_hoard_credits_lose_them_and_cannot_starve_the_queue(learner, actor_of, capacity, max_actors):
    """Two joined peers that heartbeat (FETCH) but never send an unroll take every credit the
    queue has; an honest actor that joins after them still gets credits and delivers. With as many
    hoarders as credits, it is served first once they lose theirs, not after them again."""
    end = learner(capacity=capacity, silence_s=1.5, **({} if max_actors is None else {"max_actors": max_actors}))
    hoarders, done = [actor_of(end), actor_of(end)], threading.Event()

    def heartbeat(hoarder):
        into = np.zeros(PARAMS, np.float32)
        while not done.is_set():
            hoarder.fetch(into, -1)
            time.sleep(0.2)

    threads = [threading.Thread(target=heartbeat, args=(h,), daemon=True) for h in hoarders]
    for thread in threads:
        thread.start()
    honest, stop = actor_of(end), threading.Event()
    timer = threading.Timer(8, stop.set)
    timer.start()
    try:
        assert honest.wait_for_credit(stop), "the hoarders kept every credit"
        honest.send_unroll(0, 0, unroll(4), [])
        got = take_all(end, 1)
        assert [(t.actor, t.index) for t in got] == [(2, 0)]
        # every credit the hoarders took came back (more may have by now: benched hoarders get the
        # room the honest actor leaves, and lose it again 1.5 s later on a slow host)
        assert end.reclaimed >= capacity and end.failures == []
    finally:
        timer.cancel(), done.set()
        for thread in threads:
            thread.join(5)


class Relay:
    """A TCP relay in front of a learner whose actors' side can be cut, as a dropped network path
    is: the learner's side of a cut connection stays open, so its ROUTER has not noticed yet."""

    def __init__(self, endpoint: str):
        self.target = int(endpoint.rsplit(":", 1)[1])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.actor_sides, self.learner_sides = [], []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            self.learner_sides.append(far)
            self.actor_sides.append(near)
            for source, sink in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source, sink):
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass

    def cut(self):
        for near in self.actor_sides:
            near.shutdown(socket.SHUT_RDWR)
            near.close()

    def close(self):
        self.listener.close()
        for conn in self.actor_sides + self.learner_sides:
            conn.close()


def test_an_actor_that_reconnects_keeps_its_identity_and_credits():
    end = tj.LearnerEnd("tcp://127.0.0.1:*", "CartPole-v1", SPECS, WELCOME, 2, lambda a: a)
    relay = Relay(end.endpoint)
    actor = tj.ActorEnd(relay.endpoint, silence_s=5)
    actor.expect_params(PARAMS)
    try:
        assert actor.join("CartPole-v1")["actor"] == 0
        assert actor.wait_for_credit()
        actor.send_unroll(0, 0, unroll(0), [])
        assert [t.index for t in take_all(end, 1)] == [0]
        deadline = time.monotonic() + 5
        while actor.credits < 2 and time.monotonic() < deadline:  # the credit the take freed
            actor._receive(None, 0.1)
        relay.cut()
        while len(relay.actor_sides) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(relay.actor_sides) == 2, "the actor did not reconnect"
        actor.send_unroll(1, 0, unroll(1), [])
        actor.send_unroll(2, 0, unroll(2), [])
        got = take_all(end, 2, timeout=5)
        assert [(t.actor, t.index) for t in got] == [(0, 1), (0, 2)] and end.bad_messages == 0
        end.publish(np.full(PARAMS, 3, np.float32), 1)  # the learner's answers reach the new connection
        into = np.zeros(PARAMS, np.float32)
        assert actor.fetch(into, -1) == 1 and (into == 3).all()
    finally:
        actor.close(), end.close(), relay.close()


def test_with_curve_keys_a_routing_id_is_bound_to_the_key_that_joined_with_it(tmp_path):
    """An admitted peer that learned another actor's routing id can take over its route (the ROUTER
    hands routes over), but not spend its credits: what it sends as that actor is dropped."""
    for name in ("actor", "thief"):
        keys.generate(tmp_path / "allowed", name)
    end = curve_learner(tmp_path)
    learner_key = tmp_path / "learner" / "learner.key"
    victim = tj.ActorEnd(end.endpoint, curve=(tmp_path / "allowed" / "actor.key_secret", learner_key))
    thief = zmq.Context.instance().socket(zmq.DEALER)
    try:
        assert victim.join("CartPole-v1")["actor"] == 0 and victim.wait_for_credit()
        for option, value in keys.client_options(tmp_path / "allowed" / "thief.key_secret", learner_key).items():
            thief.setsockopt(option, value)
        thief.setsockopt(zmq.ROUTING_ID, victim.routing_id)
        thief.setsockopt(zmq.LINGER, 0)
        thief.connect(end.endpoint)
        thief.send_multipart(tj.encode(tj.UNROLL, {"index": 0, "version": 0, "episodes": []}, unroll(9)))
        deadline = time.monotonic() + 5
        while end.bad_messages < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert end.bad_messages == 1 and end.depth() == 0 and end.failures == []
    finally:
        thief.close(), victim.close(), end.close()
