"""IMPALA's channel between a learner and its actor processes (gossiprl.comms.trajectories), with
actors played by this test: the schema, the credits, the order, bad messages and failed actors."""

import re
import threading
import time

import msgpack
import numpy as np
import pytest

from gossiprl.comms import keys
from gossiprl.comms import trajectories as tj
from gossiprl.comms.wire import WireError

T, N, OBS, ACTIONS, PARAMS = 3, 2, (4,), 2, 10
SPECS = tj.unroll_specs(T, N, OBS, "float32", ACTIONS)
WELCOME = {"params": PARAMS, "n_steps": T, "num_envs": N, "gamma": 0.99}


@pytest.fixture
def learner(tmp_path):
    ends = []

    def make(capacity=3, silence_s=tj.SILENCE_S):
        end = tj.LearnerEnd(
            f"ipc://{tmp_path}/t{len(ends)}",
            "CartPole-v1",
            SPECS,
            WELCOME,
            capacity,
            lambda a: 100 + a,
            silence_s=silence_s,
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


def test_an_actor_that_fails_stops_the_learner_with_its_reason(learner, actor_of):
    end = learner()
    actor = actor_of(end)
    actor.fail("ValueError: env exploded\n  (traceback lines)")
    with pytest.raises(tj.ActorFailed, match=r"^actor-0 failed: ValueError: env exploded \(traceback lines\)$"):
        take_all(end, 1)


def test_a_reason_off_the_wire_is_made_one_line_by_its_receiver(learner, actor_of):
    """The sender's word that its reason is one line is not taken: a peer that sends newlines or a
    terminal escape would otherwise write lines of its own into the other end's error and log."""
    end = learner()
    actor = actor_of(end)
    actor._send(tj.FAILED, {"reason": "boom\nINFO forged line\x1b[2K\r\tend"})
    with pytest.raises(tj.ActorFailed) as failed:
        take_all(end, 1)
    assert str(failed.value) == "actor-0 failed: boom INFO forged line [2K end"
    stranger = actor_of(end, join=False)
    with pytest.raises(tj.LearnerGone) as refused:
        stranger.join("Pong\nERROR forged")
    assert str(refused.value).endswith("this learner trains on CartPole-v1, not Pong ERROR forged")


def test_an_actor_that_falls_silent_stops_the_learner(learner, actor_of):
    end = learner(silence_s=0.3)
    actor_of(end)  # joins, then says nothing
    with pytest.raises(tj.ActorFailed, match="actor-0 sent nothing for 0.3 s"):
        take_all(end, 1, timeout=5)


def test_a_stopped_learner_tells_its_actors(learner, actor_of):
    end = learner()
    actor = actor_of(end)
    for index in range(3):  # spend the credits it was granted: the next wait is for the learner
        assert actor.wait_for_credit()
        actor.send_unroll(index, 0, unroll(index), [])
    end.close()
    assert actor.wait_for_credit() is False and actor.stopped == "the learner is done"


def test_with_curve_keys_only_admitted_actors_join(tmp_path):
    keys.generate(tmp_path / "learner", "learner")
    keys.generate(tmp_path / "allowed", "actor")
    keys.generate(tmp_path / "other", "stranger")
    end = tj.LearnerEnd(
        "tcp://127.0.0.1:*",
        "CartPole-v1",
        SPECS,
        WELCOME,
        3,
        lambda a: a,
        curve=(tmp_path / "learner" / "learner.key_secret", tmp_path / "allowed"),
    )
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
