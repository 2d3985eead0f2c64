"""IMPALA's learner on fixed data, and the hand-off between its actors (threads or processes) and the learner."""

import copy
import math
import os
import signal
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from gossiprl.comms import keys, trajectories
from gossiprl.rl import a2c, actor_processes, impala
from gossiprl.rl.actors import ActorFailed, ActorPool, Batch
from gossiprl.rl.agent import load_checkpoint, train
from gossiprl.rl.models import MLPActorCritic, flatten_parameters
from gossiprl.rl.settings import A2CConfig, AgentConfig, ImpalaConfig
from helpers import free_port, in_thread, poll_until, wait_for

T, N, OBS, ACTIONS = 6, 5, 4, 3


def fixed_batch(seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    batch = Batch(T, N, (OBS,), torch.float32, torch.device("cpu"), ACTIONS)
    batch.obs.copy_(torch.randn(T + 1, N, OBS, generator=g))
    batch.actions.copy_(torch.randint(0, ACTIONS, (T, N), generator=g))
    batch.rewards.copy_(torch.randn(T, N, generator=g))
    batch.dones.copy_((torch.rand(T, N, generator=g) < 0.25).float())
    batch.bootstrap[2, 1] = 0.7  # a time-limit cut, as the actors record it
    batch.dones[2, 1] = 1.0
    return batch


def same_settings(**impala_changes):
    """A2C's and IMPALA's settings made equal. RMSProp's eps is 1e-3, not 1e-5: its first step moves
    a weight by about lr * g / eps where |g| << eps, so at 1e-5 float32 rounding in a gradient of
    ~1e-9 (two sums in another order) moved one weight by 1.2e-6 and the comparison measured the
    rounding; at 1e-3 the two updates agree to 8e-8, and the losses must still be equal."""
    a2c_cfg = A2CConfig(lr=1e-2, entropy_coef=0.01, clip_rewards=False, rmsprop_eps=1e-3)
    impala_cfg = ImpalaConfig(
        lr=1e-2,
        anneal_lr=False,
        rmsprop_alpha=a2c_cfg.rmsprop_alpha,
        rmsprop_eps=a2c_cfg.rmsprop_eps,
        entropy_coef=0.01,
        value_coef=a2c_cfg.value_coef,
        max_grad_norm=a2c_cfg.max_grad_norm,
        clip_rewards=False,
        **impala_changes,
    )
    return a2c_cfg, impala_cfg


def one_step_each(batch, a2c_cfg, impala_cfg, behaviour=None):
    """The parameters and metrics after one A2C and one IMPALA update from the same network."""
    torch.manual_seed(3)
    model = MLPActorCritic(OBS, ACTIONS)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        acting_logits, _ = model(batch.obs[:-1].flatten(0, 1))
    batch.behaviour_logits.copy_(acting_logits.view(T, N, ACTIONS) if behaviour is None else behaviour)
    a2c_metrics = a2c.update(model, a2c.make_optimizer(model, a2c_cfg), batch, a2c_cfg)
    impala_metrics = impala.update(twin, impala.make_optimizer(twin, impala_cfg), batch, impala_cfg)
    return flatten_parameters(model), flatten_parameters(twin), a2c_metrics, impala_metrics


def test_on_policy_with_no_truncation_an_impala_update_is_an_a2c_update():
    a2c_params, impala_params, a2c_metrics, impala_metrics = one_step_each(fixed_batch(), *same_settings())
    for name in ("losses/value_loss", "losses/policy_loss", "losses/entropy"):
        torch.testing.assert_close(impala_metrics[name], a2c_metrics[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(impala_params, a2c_params, rtol=1e-5, atol=1e-6)
    assert float(impala_metrics["impala/rho_clipped"]) == 0.0


def test_off_policy_or_with_truncation_biting_it_is_not():
    batch = fixed_batch()
    a2c_params, impala_params, _, _ = one_step_each(batch, *same_settings(rho_bar=0.5, c_bar=0.5))
    assert not torch.allclose(impala_params, a2c_params, rtol=1e-5, atol=1e-6)
    other = torch.randn(T, N, ACTIONS, generator=torch.Generator().manual_seed(9))
    a2c_params, impala_params, _, metrics = one_step_each(batch, *same_settings(), behaviour=other)
    assert not torch.allclose(impala_params, a2c_params, rtol=1e-5, atol=1e-6)
    assert 0.0 < float(metrics["impala/rho_clipped"]) < 1.0


def test_rho_clipped_is_the_share_of_ratios_over_rho_bar():
    batch = fixed_batch(1)
    torch.manual_seed(3)
    model = MLPActorCritic(OBS, ACTIONS)
    with torch.no_grad():
        logits, _ = model(batch.obs[:-1].flatten(0, 1))
    pi = torch.log_softmax(logits, -1).view(T, N, ACTIONS)
    batch.behaviour_logits.copy_(pi)
    # a tenth of the logit's odds for the action taken on the first 9 steps: pi/mu = 10 - 9 pi(a)
    # there, about 7 for this near-uniform policy; exactly 1 elsewhere
    taken = batch.actions.flatten()[:9]
    flat = batch.behaviour_logits.view(T * N, ACTIONS)
    flat[torch.arange(9), taken] += math.log(0.1)
    cfg = replace(same_settings()[1], rho_bar=1.5)
    metrics = impala.update(model, impala.make_optimizer(model, cfg), batch, cfg)
    assert float(metrics["impala/rho_clipped"]) == pytest.approx(9 / (T * N))


def pool(**changes) -> ActorPool:
    hp = ImpalaConfig(
        **{"actors_per_agent": 2, "num_envs": 2, "n_steps": 4, "batch_size": 3, "queue_size": 4, **changes}
    )
    return ActorPool(AgentConfig(env_id="CartPole-v1"), hp, seed=5, env_threads=1)


def start(source):
    model = MLPActorCritic(4, 2)
    flat = flatten_parameters(model)
    return model, flat, source.start(model, flat, torch.device("cpu"))


def tensor(array) -> torch.Tensor:
    """A trajectory's array as a tensor: a thread's are tensors already, a process's numpy off the wire."""
    return array if isinstance(array, torch.Tensor) else torch.from_numpy(np.array(array))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("placement", ["thread", "process"])
def test_every_unroll_reaches_the_learner_once_in_order_into_its_own_columns(placement):
    source = pool(actor_placement=placement)
    _, flat, batch = start(source)
    seen = {0: [], 1: []}
    try:
        for version in range(12):
            source.next(version)
            for j, trajectory in enumerate(source.taken):
                seen[trajectory.actor].append(trajectory.index)
                columns = slice(2 * j, 2 * j + 2)
                assert torch.equal(batch.obs[:, columns], tensor(trajectory.arrays["obs"]))
                assert torch.equal(batch.actions[:, columns], tensor(trajectory.arrays["actions"]))
                assert torch.equal(batch.behaviour_logits[:, columns], tensor(trajectory.arrays["logits"]))
            flat.add_(0.01)  # a learner's update: the actors must act with the new parameters
    finally:
        source.close()
    assert sum(len(indices) for indices in seen.values()) == 36
    for indices in seen.values():  # none lost, none twice: each actor's unrolls arrive as 0, 1, 2, ...
        assert indices == list(range(len(indices)))


def test_a_full_queue_blocks_the_actor_threads_and_one_actors_lag_stays_within_the_queue():
    source = pool(actors_per_agent=1, batch_size=2, queue_size=4, actor_placement="thread")
    _, _, _ = start(source)
    threads = source.actors
    try:
        poll_until(lambda: threads.depth() >= 4 and threads.actors[0].unrolls >= 4, 10, every=0.01)
        time.sleep(0.2)  # time to run past a queue that did not block it
        assert threads.depth() == 4 and threads.actors[0].unrolls == 4
        # the unrolls queued behind an older version: at most 1 + queue_size // batch_size updates late
        worst = max(source.next(version)["impala/policy_lag_max"] for version in range(10))
    finally:
        source.close()
    assert 1 <= worst <= 1 + 4 // 2


@pytest.mark.timeout(180)
def test_a_full_queue_holds_an_actor_process_back_and_its_lag_stays_within_the_queue():
    source = pool(actors_per_agent=1, batch_size=2, queue_size=4, actor_placement="process")
    start(source)
    try:
        poll_until(lambda: source.actors.depth() >= 4, 120, every=0.05)  # a spawned process imports torch first
        time.sleep(0.5)  # time to run past a queue that did not hold it back
        assert source.actors.depth() == 4 and source.actors.end.take(0) is not None
        assert source.actors.depth() == 3  # nothing past the credits came
        stranger = trajectories.ActorEnd(source.actors.end.endpoint, silence_s=5)
        stranger.expect_params(source.actors.end.welcome["params"])
        with pytest.raises(trajectories.LearnerGone, match="admits at most 0 actors beside its own 1"):
            stranger.join("CartPole-v1")  # the learner's own process is its one admitted actor
        stranger.close()
        stats = [source.next(version) for version in range(10)]
    finally:
        source.close()
    # the process waits for a credit before it fetches and acts, so it is never later than the threads
    assert 1 <= max(s["impala/policy_lag_max"] for s in stats) <= 1 + 4 // 2
    # what the channel turned away is a running count in each update's stats, so in metrics.csv
    assert [s["impala/refused_joins_total"] for s in stats] == [1.0] * 10
    assert stats[-1]["impala/reclaimed_total"] == stats[-1]["impala/bad_messages_total"] == 0.0
    assert stats[-1]["impala/left_total"] == 0.0  # the stranger was refused, never admitted: it did not leave


@pytest.mark.timeout(180)
def test_with_curve_keys_the_learners_own_actor_process_joins_and_trains(tmp_path, monkeypatch):
    """--actors-curve-secret with actor processes: the learner's own actors had no key, so its CURVE
    socket refused them and the learner waited START_S (600 s) for joins that could never come.
    They now get a key pair of the run's, admitted beside the allowed directory's."""
    monkeypatch.setattr(actor_processes, "START_S", 60.0)
    keys.generate(tmp_path / "learner", "learner")
    keys.generate(tmp_path / "allowed", "remote")
    source = pool(
        actors_per_agent=1,
        batch_size=2,
        actor_placement="process",
        actors_bind=f"tcp://127.0.0.1:{free_port()}",
        actors_curve_secret=tmp_path / "learner" / "learner.key_secret",
        actors_curve_allow=tmp_path / "allowed",
    )
    try:
        start(source)
        stats = source.next(0)
    finally:
        source.close()
    assert source.actors.end.joined == 1 and len(source.taken) == 2 and stats["impala/refused_joins_total"] == 0


@pytest.mark.timeout(120)
def test_a_learner_with_no_actors_of_its_own_trains_on_the_first_from_elsewhere():
    """--actors-per-agent 0 with --actors-bind: the field's minimum was 1, and the learner divided
    its env threads by its actor count. It now waits for an actor from elsewhere, and trains on it."""
    source = pool(actors_per_agent=0, actor_placement="process", actors_bind=f"tcp://127.0.0.1:{free_port()}")
    stop = threading.Event()
    remote = threading.Thread(
        target=actor_processes.run_actor, args=(source.actors.hp.actors_bind, "CartPole-v1"), kwargs={"stop": stop}
    )
    remote.start()  # first, as an actor on another host may be: it waits for the learner to bind
    try:
        start(source)
        stats = [source.next(version) for version in range(3)]
    finally:
        source.close()
        stop.set()
        remote.join(30)
    assert not remote.is_alive() and source.actors.processes == [] and source.actors.end.joined == 1
    assert all(trajectory.actor == 0 for trajectory in source.taken) and len(stats) == 3


@pytest.mark.timeout(120)
def test_an_actor_whose_learner_falls_silent_after_the_join_is_told_it_lost_it():
    """``gossiprl actor`` exits 3 (start it again) on LearnerLost, which only a CLI test with a stub
    raised. Here a real learner answers the JOIN and trains on the actor, then says nothing more,
    STOP included, as when its host goes away: the actor must end with LearnerLost, not as done.
    Its 3 s of silence allowed are some 15 times what its JOIN takes here, which it must get answered
    before the learner, started after it as on another host, has bound."""
    source = pool(actors_per_agent=0, actor_placement="process", actors_bind=f"tcp://127.0.0.1:{free_port()}")
    box = {}

    def act():
        try:
            box["result"] = actor_processes.run_actor(source.actors.hp.actors_bind, "CartPole-v1", silence_s=3.0)
        except Exception as err:
            box["error"] = err

    remote = threading.Thread(target=act)
    remote.start()
    try:
        start(source)
        source.next(0)
        source.actors.end._send = lambda *args, **kwargs: None  # from now on the learner sends nothing
    finally:
        source.close()
        remote.join(30)
    assert not remote.is_alive()
    assert isinstance(box.get("error"), trajectories.LearnerLost), box
    assert "has not answered for 3 s" in str(box["error"])


def only_remote_actors(**changes) -> AgentConfig:
    """An IMPALA agent fed only by actors from elsewhere, with a budget it never reaches: a test stops it."""
    impala_cfg = ImpalaConfig(
        actors_per_agent=0, actors_bind=f"tcp://127.0.0.1:{free_port()}", num_envs=2, n_steps=4, batch_size=1
    )
    return AgentConfig(algo="impala", total_frames=10**9, impala=impala_cfg, **changes)


@pytest.mark.timeout(60)
def test_a_stopped_learner_ends_its_wait_for_a_first_actor(tmp_path):
    """The wait for actors to join (START_S, 600 s) did not look at the agent's stop: on Ctrl-C or
    SIGTERM its launcher killed it instead. It now ends the wait, and training, at once; having
    learned nothing in this session it writes no checkpoint, as after any stop before its first update."""
    stop = threading.Event()
    stop.set()
    _, box = in_thread(lambda: train(only_remote_actors(), tmp_path, stop=stop))
    wait_for(lambda: "done_at" in box, 30, "the learner went on waiting for actors after its stop")
    assert "error" not in box, box
    assert box["result"]["updates"] == 0 and not (tmp_path / "agent-0" / "checkpoint.pt").exists()


@pytest.mark.timeout(120)
def test_a_stopped_learner_whose_actors_all_left_ends_training_with_a_final_checkpoint(tmp_path, monkeypatch):
    """With --actors-per-agent 0, a learner whose actors from elsewhere had all left waited for
    their next unroll for ever, whatever the agent was told, until its launcher killed it without
    a final checkpoint. A stop now ends that wait, and training as any stop does."""
    cfg = only_remote_actors(log_every=1, checkpoint_every=10**6)  # the one checkpoint is the final one
    leave, stop, waiting = threading.Event(), threading.Event(), threading.Event()
    remote = threading.Thread(
        target=actor_processes.run_actor, args=(cfg.impala.actors_bind, "CartPole-v1"), kwargs={"stop": leave}
    )
    take = actor_processes.ActorProcesses.take

    def watched(self, timeout):  # the learner found no unroll once its only actor had gone
        trajectory = take(self, timeout)
        if trajectory is None and leave.is_set() and not remote.is_alive():
            waiting.set()
        return trajectory

    monkeypatch.setattr(actor_processes.ActorProcesses, "take", watched)
    remote.start()
    _, box = in_thread(lambda: train(cfg, tmp_path, stop=stop))
    metrics = tmp_path / "agent-0" / "metrics.csv"
    try:
        wait_for(
            lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, 60, lambda: f"no update: {box}"
        )
    finally:
        leave.set()
        remote.join(30)
    wait_for(waiting.is_set, 30, lambda: f"the learner did not wait for unrolls: {box}")
    stop.set()
    wait_for(lambda: "done_at" in box, 30, "the learner went on waiting for its actors after its stop")
    assert "error" not in box, box
    updates = box["result"]["updates"]
    assert load_checkpoint(tmp_path / "agent-0" / "checkpoint.pt")["counters"]["updates"] == updates >= 2
    logged = [row.split(",")[2] for row in metrics.read_text().splitlines()[1:]]
    # the pass that found the stop wrote the last update's row again: two rows at one step
    assert logged == [str(u) for u in range(1, updates + 1)], logged


def test_a_learner_with_no_actors_of_its_own_says_so_when_none_joins(monkeypatch):
    monkeypatch.setattr(actor_processes, "START_S", 0.3)
    source = pool(actors_per_agent=0, actor_placement="process", actors_bind=f"tcp://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(
            ActorFailed, match=r"^no actor joined tcp://127\.0\.0\.1:\d+ within 0\.3 s: .* --env CartPole-v1\)$"
        ):
            start(source)
    finally:
        source.close()


@pytest.mark.parametrize(
    "bind,rank,bound",
    [
        ("tcp://127.0.0.1:5600", 0, "tcp://127.0.0.1:5600"),
        ("tcp://127.0.0.1:5600", 3, "tcp://127.0.0.1:5603"),
        ("tcp://[::1]:5600", 2, "tcp://[::1]:5602"),
        ("tcp://127.0.0.1:*", 3, "tcp://127.0.0.1:*"),
        ("ipc:///run/gossiprl/actors", 0, "ipc:///run/gossiprl/actors"),
        ("ipc:///run/gossiprl/actors", 2, "ipc:///run/gossiprl/actors-2"),
        ("ipc://*", 2, "ipc://*"),
        (None, 3, None),
    ],
)
def test_agent_r_binds_port_plus_r_or_path_r_for_its_actors(monkeypatch, bind, rank, bound):
    """`gossiprl run --agents 4 --actors-bind tcp://127.0.0.1:5600` made every learner bind 5600,
    and all but the first failed: agent r now binds 5600 + r, on `gossiprl agent` as on `run`.
    On one ipc:// path each learner took the socket file over from the one before without an
    error, so every actor joined the last: agent r now binds PATH-r."""
    from gossiprl import agent_process
    from gossiprl.rl import agent

    handed = []
    monkeypatch.setattr(agent, "train", lambda cfg, run_dir, **_: handed.append(cfg.impala.actors_bind))
    cfg = AgentConfig(algo="impala", impala=ImpalaConfig(actors_bind=bind))
    agent_process.run_agent(None, rank, cfg, "unused", progress_every=0)
    assert handed == [bound]


@pytest.mark.parametrize("bind", ["tcp://127.0.0.1:65535", "not-an-endpoint"])
@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_another_learner_ignores_a_stray_actors_bind(monkeypatch, algo, bind):
    """run_agent worked out agent r's --actors-bind for every --algo, so a stray one (a port that
    rank 3 would push past 65535, a malformed endpoint) failed each A2C or PPO agent, though
    AgentConfig.check_actors leaves IMPALA's section alone for the other learners."""
    from gossiprl import agent_process
    from gossiprl.rl import agent

    handed = []
    monkeypatch.setattr(agent, "train", lambda cfg, run_dir, **_: handed.append(cfg.impala.actors_bind))
    cfg = AgentConfig(algo=algo, impala=ImpalaConfig(actors_bind=bind))
    cfg.check_actors(last_rank=3)
    agent_process.run_agent(None, 3, cfg, "unused", progress_every=0)
    assert handed == [bind]


@pytest.mark.timeout(120)
def test_a_learner_whose_start_fails_leaves_no_actor_and_frees_its_endpoint(tmp_path, monkeypatch):
    """An error in train (here the start's wait for actors) left the actor processes, the channel's
    serving thread and its bound endpoint behind: a library caller (experiments/, a test) that
    tried again in the same process could not bind. The rollout source is now closed on every way out."""
    import zmq

    cfg = AgentConfig(
        algo="impala",
        total_frames=10**9,
        impala=ImpalaConfig(actors_per_agent=1, actors_bind=f"tcp://127.0.0.1:{free_port()}", num_envs=2, n_steps=4),
    )
    spawned = []

    def fails(self, stop=None):
        spawned.extend(self.processes)
        raise ActorFailed("injected: no actor joined")

    monkeypatch.setattr(actor_processes.ActorProcesses, "wait_for_joins", fails)
    with pytest.raises(ActorFailed, match="injected"):
        train(cfg, tmp_path)
    assert spawned and not any(process.is_alive() for process in spawned)
    assert not [thread.name for thread in threading.enumerate() if thread.name.startswith("trajectories-")]
    again = zmq.Context.instance().socket(zmq.PULL)
    try:
        again.bind(cfg.impala.actors_bind)  # EADDRINUSE while the failed learner's channel was still bound
    finally:
        again.close(linger=0)


def test_an_actor_thread_that_fails_ends_the_learner_with_its_error(monkeypatch):
    source = pool(actor_placement="thread")

    def broken(actions):
        raise ValueError("env exploded")

    monkeypatch.setattr(source.actors.envs[1], "step", broken)
    start(source)
    try:
        with pytest.raises(ActorFailed, match="actor-1 failed: ValueError: env exploded"):
            for version in range(5):
                source.next(version)
    finally:
        source.close()


@pytest.mark.timeout(180)
def test_an_actor_process_that_dies_ends_the_learner_with_one_line():
    source = pool(actor_placement="process")
    start(source)
    try:
        source.next(0)  # both started (or one did the work); now one is killed outright
        victim = source.actors.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(ActorFailed, match=rf"^actor-process-1 \(pid {victim.pid}\) exited with code -9$"):
            for version in range(1, 200):
                source.next(version)
    finally:
        source.close()


def test_closing_gives_all_actor_processes_one_deadline_to_leave(monkeypatch):
    """close waited JOIN_S for each actor process in turn: 8 still starting (deaf to STOP) took 40 s,
    past the launcher's LAUNCHER_JOIN_S (30 s), which then killed the agent unsaved."""
    import multiprocessing as mp

    monkeypatch.setattr(actor_processes, "JOIN_S", 1.0)
    actors = object.__new__(actor_processes.ActorProcesses)  # no channel, no env: only the processes
    actors.end, actors.private_dir = None, None
    actors.processes = [mp.get_context("fork").Process(target=time.sleep, args=(60,)) for _ in range(8)]
    for process in actors.processes:
        process.start()
    began = time.monotonic()
    actors.close()
    took = time.monotonic() - began
    assert not any(process.is_alive() for process in actors.processes)
    # in turn that is 8 s; one deadline is 1 s and the terminations, with room for a loaded host
    assert took < 4.0, f"close took {took:.1f} s for 8 deaf processes: JOIN_S each, not once"


def test_defaults_are_the_papers_on_games_and_smaller_batches_on_control_tasks():
    games = impala.resolve_defaults(ImpalaConfig(), "MinAtar/Breakout-v1")
    control = impala.resolve_defaults(ImpalaConfig(), "CartPole-v1")
    assert (games.batch_size, games.queue_size, games.entropy_coef, games.n_steps) == (8, 16, 0.01, 20)
    assert (control.batch_size, control.queue_size, control.entropy_coef, control.n_steps) == (4, 8, 0.0, 5)
    given = impala.resolve_defaults(
        ImpalaConfig(batch_size=3, queue_size=1, entropy_coef=0.1, n_steps=20), "CartPole-v1"
    )
    assert (given.batch_size, given.queue_size, given.entropy_coef, given.n_steps) == (3, 1, 0.1, 20)


def test_a_checkpoint_that_spelt_out_todays_default_resumes_where_the_default_resolves_to_it():
    """IMPALA's unroll length was 20 everywhere before control tasks got 5: a MinAtar run that recorded
    20 resumes under today's None (20 there); a CartPole one is refused, naming what would change."""
    from dataclasses import asdict

    from gossiprl.rl import agent
    from gossiprl.rl.settings import AgentConfig

    for env_id, changed in (
        ("MinAtar/Breakout-v1", []),
        ("CartPole-v1", ["impala.n_steps=20 (now None, which is 5 here)"]),
    ):
        saved = asdict(AgentConfig(env_id=env_id, algo="impala"))
        saved["impala"]["n_steps"] = 20
        assert agent.changed_on_resume(saved, AgentConfig(env_id=env_id, algo="impala")) == changed
