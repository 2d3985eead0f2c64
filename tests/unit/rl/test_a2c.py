"""The A2C learner's parts checked against numbers worked out by hand: returns, loss, time limits,
the vector env's truncation report, the flat parameter buffer, and the Nature CNN's size."""

import math
import threading
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from ale_py.vector_env import AtariVectorEnv
from gymnasium.vector import AutoresetMode
from torch import nn

from gossiprl.rl.a2c import A2CConfig, Rollout, a2c_loss, make_optimizer, nstep_returns, update
from gossiprl.rl.envs import VecEnv, atari_game, is_atari, make_env
from gossiprl.rl.models import AtariActorCritic, MLPActorCritic, flatten_parameters, make_model

# ------------------------------------------------------------------ n-step returns


def test_nstep_returns_bootstrap_and_stop_at_a_done():
    # gamma 0.5, 3 steps x 2 envs; env 0's episode ends at step 1, env 1 runs through.
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    dones = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    last_value = torch.tensor([10.0, 20.0])
    returns = nstep_returns(rewards, dones, last_value, 0.5)
    # env 0: G2 = 5 + .5*10 = 10; G1 = 3 (done: no bootstrap); G0 = 1 + .5*3 = 2.5
    # env 1: G2 = 6 + .5*20 = 16; G1 = 4 + .5*16 = 12;           G0 = 2 + .5*12 = 8
    assert returns.tolist() == [[2.5, 8.0], [3.0, 12.0], [10.0, 16.0]]


def test_nothing_after_a_done_leaks_into_earlier_returns():
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    dones = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    base = nstep_returns(rewards, dones, torch.tensor([10.0, 20.0]), 0.5)
    # the next episode of env 0 (step 2 and V(s_3)) changes wildly; its first episode must not notice
    rewards2 = rewards.clone()
    rewards2[2, 0] = -1000.0
    changed = nstep_returns(rewards2, dones, torch.tensor([1e6, 20.0]), 0.5)
    assert changed[:2, 0].tolist() == base[:2, 0].tolist() == [2.5, 3.0]
    assert changed[2, 0].item() == -1000.0 + 0.5 * 1e6
    assert changed[:, 1].tolist() == base[:, 1].tolist()  # env 1 is untouched


def test_done_on_the_last_step_drops_the_bootstrap_value():
    rewards = torch.tensor([[1.0], [1.0]])
    dones = torch.tensor([[0.0], [1.0]])
    returns = nstep_returns(rewards, dones, torch.tensor([100.0]), 0.9)
    assert returns[:, 0].tolist() == pytest.approx([1.0 + 0.9 * 1.0, 1.0])


# ------------------------------------------------------------------ the loss


def test_a2c_loss_matches_hand_computation():
    # sample 0: probs (1/4, 3/4), took action 1, V=1, G=3 -> A=2
    # sample 1: probs (1/2, 1/2), took action 0, V=2, G=1 -> A=-1
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]], requires_grad=True)
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    actions = torch.tensor([1, 0])
    returns = torch.tensor([3.0, 1.0])
    value_coef, entropy_coef = 0.5, 0.01
    loss, metrics = a2c_loss(logits, values, actions, returns, value_coef, entropy_coef)

    policy_loss = -(2.0 * math.log(0.75) + (-1.0) * math.log(0.5)) / 2
    value_loss = (2.0**2 + 1.0**2) / 2
    entropy = (-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) + math.log(2.0)) / 2
    assert metrics["losses/policy_loss"].item() == pytest.approx(policy_loss, rel=1e-6)
    assert metrics["losses/value_loss"].item() == pytest.approx(value_loss, rel=1e-6)
    assert metrics["losses/entropy"].item() == pytest.approx(entropy, rel=1e-6)
    assert loss.item() == pytest.approx(policy_loss + value_coef * value_loss - entropy_coef * entropy, rel=1e-6)
    assert all(not m.requires_grad for m in metrics.values())

    loss.backward()
    # The advantage is detached, so V gets gradient only from value_coef * mean((G - V)^2):
    # d/dV_i = value_coef * -2 (G_i - V_i) / 2 = -value_coef * A_i. (Were it not detached, the
    # policy term would add log pi(a_i)/2 to each, e.g. log(.75)/2 = -0.14 for sample 0.)
    assert values.grad.tolist() == pytest.approx([-value_coef * 2.0, -value_coef * -1.0], abs=1e-6)


def test_policy_gradient_on_the_logits():
    # entropy off: d(policy_loss)/d logits_i = -(A_i / B) (onehot(a_i) - pi_i)
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]], requires_grad=True)
    values = torch.tensor([1.0, 2.0])
    loss, _ = a2c_loss(logits, values, torch.tensor([1, 0]), torch.tensor([3.0, 1.0]), 0.5, 0.0)
    loss.backward()
    # sample 0: -(2/2) ((0, 1) - (.25, .75)) = (.25, -.25); sample 1: (1/2) ((1, 0) - (.5, .5)) = (.25, -.25)
    assert logits.grad.tolist() == [pytest.approx([0.25, -0.25], abs=1e-6)] * 2


# ------------------------------------------------------------------ time limits in the rollout


class ObsValue(nn.Module):
    """V(s) = w * s[0] with w = 1 at first, uniform logits over two actions: values known by hand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.logit_bias = nn.Parameter(torch.zeros(2))

    def forward(self, obs):
        return self.logit_bias.expand(obs.shape[0], 2), obs[:, 0] * self.w


def filled_rollout():
    """2 steps x 2 envs. Env 0's episode is cut by a time limit at step 0 in a state worth 8;
    the obs after it is the next episode's first. Env 1 runs through."""
    rollout = Rollout(2, 2, (1,), torch.float32, torch.device("cpu"))
    rollout.obs[:, :, 0] = torch.tensor([[1.0, 2.0], [3.0, 4.0], [6.0, 7.0]])
    rollout.rewards[:] = torch.tensor([[5.0, -3.0], [2.0, 0.0]])
    rollout.dones[:] = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    rollout.actions[:] = torch.tensor([[0, 1], [1, 0]])
    return rollout


@pytest.mark.parametrize(
    "clip_rewards,expected_value_loss",
    [
        # sign-clipped rewards (1, -1 / 1, 0) plus the unclipped bonus .5 * 8 = 4 at step 0, env 0:
        #   env 0: G1 = 1 + .5*6 = 4, G0 = 1 + 4 = 5 (done: no G1)   -> A = 5-1, 4-3 = 4, 1
        #   env 1: G1 = 0 + .5*7 = 3.5, G0 = -1 + .5*3.5 = .75        -> A = .75-2, 3.5-4 = -1.25, -.5
        (True, (4.0**2 + 1.0**2 + 1.25**2 + 0.5**2) / 4),
        # raw rewards: env 0: G1 = 2 + 3 = 5, G0 = 5 + 4 = 9 -> A = 8, 2;
        #              env 1: G1 = 3.5, G0 = -3 + 1.75 -> A = -3.25, -.5
        (False, (8.0**2 + 2.0**2 + 3.25**2 + 0.5**2) / 4),
    ],
)
def test_time_limit_bootstraps_from_the_final_obs_unclipped(clip_rewards, expected_value_loss):
    cfg = A2CConfig(num_envs=2, n_steps=2, gamma=0.5, clip_rewards=clip_rewards, entropy_coef=0.01, lr=7e-4)
    model = ObsValue()
    rollout = filled_rollout()
    final_obs = torch.tensor([[8.0]])
    with torch.no_grad():
        _, final_values = model(final_obs)
    rollout.truncation_bonus(0, torch.tensor([0]), final_values, cfg)
    assert rollout.bootstrap.tolist() == [[4.0, 0.0], [0.0, 0.0]]

    before = [p.detach().clone() for p in model.parameters()]
    metrics = update(model, make_optimizer(model, cfg), rollout, cfg)
    assert metrics["losses/value_loss"].item() == pytest.approx(expected_value_loss)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters())), "update must step"

    rollout.next_rollout()
    assert rollout.bootstrap.abs().sum().item() == 0.0
    assert rollout.obs[0, :, 0].tolist() == [6.0, 7.0]


def test_without_the_bonus_a_cut_step_is_a_plain_terminal():
    cfg = A2CConfig(num_envs=2, n_steps=2, gamma=0.5, clip_rewards=True, entropy_coef=0.01, lr=7e-4)
    metrics = update(ObsValue(), make_optimizer(ObsValue(), cfg), filled_rollout(), cfg)
    # G0 of env 0 = 1 (clipped 5, nothing after the done) -> A = 0 in place of 4
    assert metrics["losses/value_loss"].item() == pytest.approx((0.0 + 1.0 + 1.25**2 + 0.5**2) / 4)


# ------------------------------------------------------------------ the vector env's time-limit report

COUNTER = "gossiprl-test/Counter-v0"


class Counter(gym.Env):
    """obs = (steps taken, 1); reward 1 a step; action 1 ends the episode (terminated).
    Registered with a 3-step time limit, so a third step without action 1 is truncated."""

    observation_space = gym.spaces.Box(0.0, 100.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, 1.0], np.float32), 1.0, bool(action == 1), False, {}


if COUNTER not in gym.registry:
    gym.register(COUNTER, entry_point=Counter, max_episode_steps=3)


def test_vecenv_reports_time_limit_cuts_with_their_final_obs():
    envs = make_env(COUNTER, 3, seed=0)
    try:
        obs = envs.reset()
        assert obs[:, 0].tolist() == [0, 0, 0]

        # env 1 terminates at its first step: done, but no time limit
        obs, reward, done, (cut, final_obs) = envs.step(np.array([0, 1, 0]))
        assert done.tolist() == [False, True, False]
        assert cut.tolist() == [] and final_obs.shape == (0, 2)
        assert obs[:, 0].tolist() == [1, 0, 1]  # same-step autoreset: env 1 already shows its new episode

        obs, reward, done, (cut, final_obs) = envs.step(np.array([0, 0, 0]))
        assert not done.any() and cut.tolist() == []

        # step 3: env 0 hits the time limit; env 2 terminates on that very step (terminated wins)
        obs, reward, done, (cut, final_obs) = envs.step(np.array([0, 0, 1]))
        assert done.tolist() == [True, False, True]
        assert cut.tolist() == [0]
        assert final_obs.shape == (1, 2)
        assert final_obs[0].tolist() == [3.0, 1.0]  # the state it was cut in, not the reset obs
        assert obs[0].tolist() == [0.0, 1.0] and obs[2].tolist() == [0.0, 1.0]
        assert reward.tolist() == [1.0, 1.0, 1.0]
        assert sorted(envs.pop_episodes()) == [(1.0, 1), (3.0, 3), (3.0, 3)]
        assert envs.pop_episodes() == []
    finally:
        envs.close()


def test_vecenv_reports_ale_time_limit_cuts_with_their_final_frames():
    """ALE's native vector env (the Atari backend) cuts at max_num_frames_per_episode: 40 frames
    here, i.e. 10 agent steps, instead of the 108,000 a real run meets after hours."""
    env = AtariVectorEnv(
        "breakout",
        2,
        autoreset_mode=AutoresetMode.SAME_STEP,
        img_height=84,
        img_width=84,
        grayscale=True,
        stack_num=4,
        frameskip=4,
        maxpool=True,
        noop_max=0,
        episodic_life=False,
        reward_clipping=False,
        max_num_frames_per_episode=40,
    )
    envs = VecEnv(env, 4, seed=0)
    try:
        first = envs.reset()
        for _ in range(9):  # FIRE launches the ball, so the screen moves away from the reset frame
            obs, reward, done, (cut, final_obs) = envs.step(np.ones(2, dtype=np.int64))
            assert not done.any() and len(cut) == 0
        obs, reward, done, (cut, final_obs) = envs.step(np.ones(2, dtype=np.int64))
        assert done.tolist() == [True, True] and cut.tolist() == [0, 1]
        assert final_obs.shape == (2, 4, 84, 84) and final_obs.dtype == np.uint8
        assert np.array_equal(obs, first)  # what the learner sees next is the new episode's start...
        assert not np.array_equal(final_obs, obs)  # ...and what it bootstraps from is the cut state
        assert envs.pop_episodes() == [(0.0, 10), (0.0, 10)]
    finally:
        envs.close()


def test_cartpole_vecenv_autoresets_on_the_same_step():
    envs = make_env("CartPole-v1", 2, seed=3)
    try:
        obs = envs.reset()
        assert obs.shape == (2, 4) and envs.frames_per_step == 1
        lengths = []
        for _ in range(200):  # always push right: the pole falls within a few dozen steps
            obs, reward, done, (cut, _) = envs.step(np.ones(2, dtype=np.int64))
            assert len(cut) == 0  # falling over is a real terminal, never a time limit
            if done.any():
                # the obs returned with done is already a fresh episode's: near zero
                assert np.abs(obs[done]).max() <= 0.05
            lengths += [n for _, n in envs.pop_episodes()]
        assert lengths and all(5 <= n < 60 for n in lengths)
    finally:
        envs.close()


# ------------------------------------------------------------------ the flat parameter buffer


def test_flatten_parameters_makes_every_parameter_a_view_of_one_tensor():
    torch.manual_seed(0)
    model = MLPActorCritic(4, 2)
    x = torch.randn(5, 4)
    with torch.no_grad():
        before = model(x)
    params = list(model.parameters())
    flat = flatten_parameters(model)
    assert (
        flat.numel()
        == sum(p.numel() for p in params)
        == 4 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2 + 4 * 64 + 64 + 64 * 64 + 64 + 64 + 1
    )
    with torch.no_grad():
        after = model(x)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])  # same values, new home
    for p in model.parameters():
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()

    # writing the flat tensor (what gossip's mix does) is what the model computes with
    with torch.no_grad():
        flat.zero_()
        logits, value = model(x)
    assert torch.equal(logits, torch.zeros(5, 2)) and torch.equal(value, torch.zeros(5))

    # and an optimizer step on the module lands in the flat tensor
    flat.normal_(generator=torch.Generator().manual_seed(1))
    snapshot = flat.clone()
    optimizer = make_optimizer(model, A2CConfig(lr=7e-4))
    logits, value = model(x)
    (logits.pow(2).sum() + value.pow(2).sum()).backward()
    optimizer.step()
    assert not torch.equal(flat, snapshot)
    assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))


def test_flatten_parameters_refuses_mixed_dtypes():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="dtype"):
        flatten_parameters(model)


# ------------------------------------------------------------------ the networks


def test_nature_cnn_has_the_papers_parameter_count():
    obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    model = make_model(obs_space, gym.spaces.Discrete(6))
    assert isinstance(model, AtariActorCritic)
    assert sum(p.numel() for p in model.parameters()) == 1_687_719
    logits, values = model(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))
    assert logits.shape == (2, 6) and values.shape == (2,)


def test_atari_ids_name_the_same_game():
    assert atari_game("ALE/Pong-v5") == atari_game("PongNoFrameskip-v4") == "pong"
    assert atari_game("ALE/MsPacman-v5") == "ms_pacman"
    assert is_atari("PongNoFrameskip-v4") and not is_atari("CartPole-v1")


def test_atari_env_gives_the_nature_cnn_its_uint8_frame_stacks():
    envs = make_env("ALE/Pong-v5", 2, seed=0)
    try:
        assert envs.frames_per_step == 4
        assert envs.observation_space.shape == (4, 84, 84) and envs.observation_space.dtype == np.uint8
        assert envs.action_space == gym.spaces.Discrete(6)
        model = make_model(envs.observation_space, envs.action_space)
        assert sum(p.numel() for p in model.parameters()) == 1_687_719
        obs = envs.reset()
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        obs, reward, done, (cut, final_obs) = envs.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 4, 84, 84) and reward.shape == (2,) and len(cut) == 0
    finally:
        envs.close()


def test_vector_obs_get_the_mlp_and_continuous_actions_are_refused():
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    assert isinstance(make_model(box, gym.spaces.Discrete(2)), MLPActorCritic)
    with pytest.raises(ValueError, match="Discrete"):
        make_model(box, gym.spaces.Box(-1.0, 1.0, (1,), np.float32))


def test_env_dependent_defaults_follow_the_papers_on_games_only():
    from gossiprl.rl.a2c import resolve_defaults

    atari = resolve_defaults(A2CConfig(), "ALE/Pong-v5")
    minatar = resolve_defaults(A2CConfig(), "MinAtar/Breakout-v1")
    other = resolve_defaults(A2CConfig(), "CartPole-v1")
    assert (atari.entropy_coef, atari.clip_rewards) == (0.01, True)
    assert (minatar.entropy_coef, minatar.clip_rewards) == (0.01, False)
    assert (other.entropy_coef, other.clip_rewards) == (0.0, False)
    given = resolve_defaults(A2CConfig(entropy_coef=0.05, clip_rewards=False), "ALE/Pong-v5")
    assert (given.entropy_coef, given.clip_rewards) == (0.05, False)


# ------------------------------------------------------------------ checkpoints


def _checkpoint_state(**counters):
    from dataclasses import asdict

    from gossiprl.rl.agent import AgentConfig

    model = MLPActorCritic(4, 2)
    optimizer = make_optimizer(model, A2CConfig(lr=7e-4))
    model(torch.ones(3, 4))[1].sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "counters": {"updates": 3, "frames": 240, "episodes": 2, "wall_s": 1.5, **counters},
        "recent_returns": [10.0, 12.0],
        "config": asdict(AgentConfig()),
    }


def test_corrupt_checkpoints_are_refused_with_the_file_named(tmp_path):
    from gossiprl.rl.agent import CheckpointError, checkpoint_digest, load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    state = _checkpoint_state()
    assert save_checkpoint(path, state)
    good = path.read_bytes()
    assert checkpoint_digest(load_checkpoint(path)) == checkpoint_digest(state)
    bad = tmp_path / "bad.pt"
    for damage in (good[: len(good) // 2], b"", np.random.default_rng(0).bytes(len(good))):
        bad.write_bytes(damage)
        with pytest.raises(CheckpointError, match=rf"{bad}: not a readable checkpoint.*delete it"):
            load_checkpoint(bad)
    # No single-byte flip may load with changed values: it is refused, or loads exactly what was saved.
    refused = 0
    for offset in np.linspace(0, len(good) - 1, 60).astype(int):
        flipped = bytearray(good)
        flipped[offset] ^= 0x5A
        bad.write_bytes(bytes(flipped))
        try:
            loaded = load_checkpoint(bad)
        except CheckpointError as err:
            assert str(bad) in str(err) and "\n" not in str(err)
            refused += 1
        else:
            assert checkpoint_digest(loaded) == checkpoint_digest(state), offset
    assert refused >= 30


@pytest.mark.parametrize(
    "change,words",
    [
        ("nan", "NaN or infinity"),
        ("updates", "counter 'updates' is -1"),
        ("wall_s", "counter 'wall_s'"),
    ],
)
def test_checkpoints_with_impossible_values_are_refused(tmp_path, change, words):
    from gossiprl.rl.agent import CheckpointError, load_checkpoint, save_checkpoint

    state = _checkpoint_state(
        **({"updates": -1} if change == "updates" else {"wall_s": float("nan")} if change == "wall_s" else {})
    )
    if change == "nan":
        next(iter(state["model"].values())).view(-1)[0] = float("nan")
    save_checkpoint(tmp_path / "c.pt", state)
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint(tmp_path / "c.pt")


@pytest.mark.parametrize("where", ["torch.save", "os.fsync", "os.replace"])
def test_a_failed_checkpoint_write_keeps_the_old_one_and_leaves_no_temp_file(tmp_path, monkeypatch, where):
    import errno

    from gossiprl.rl import agent
    from gossiprl.rl.agent import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    assert save_checkpoint(path, _checkpoint_state())
    before = path.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    module, name = where.split(".")
    monkeypatch.setattr(getattr(agent, module), name, full)
    assert save_checkpoint(path, _checkpoint_state(updates=99)) is False
    monkeypatch.undo()
    assert path.read_bytes() == before and not (tmp_path / "checkpoint.pt.tmp").exists()
    assert load_checkpoint(path)["counters"]["updates"] == 3


def test_training_goes_on_when_the_run_dir_cannot_be_written(tmp_path, monkeypatch):
    import errno

    from gossiprl.rl import agent

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(agent.torch, "save", read_only)
    cfg = agent.AgentConfig(
        total_frames=400, checkpoint_every=2, log_every=2, torch_threads=1, a2c=A2CConfig(num_envs=4)
    )
    summary = agent.train(cfg, tmp_path, rank=0)
    assert summary["frames"] >= 400
    assert not list((tmp_path / "agent-0").glob("checkpoint.pt*"))


class StopAtCall:
    """An Event whose is_set() turns true at its n-th call: a stop that lands at an exact moment."""

    def __init__(self, n):
        self.calls, self.n = 0, n

    def is_set(self):
        self.calls += 1
        return self.calls >= self.n


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_stop_at_any_moment_ends_with_a_final_checkpoint(tmp_path, n):
    """The loop once checked the stop twice per update: set between the two checks, it ended the
    loop without the final checkpoint (a launcher's stop after its swarm solved CartPole)."""
    from gossiprl.rl import agent

    cfg = agent.AgentConfig(total_frames=10_000, torch_threads=1, a2c=A2CConfig(num_envs=4))
    summary = agent.train(cfg, tmp_path, rank=0, stop=StopAtCall(n))
    saved = agent.load_checkpoint(tmp_path / "agent-0" / "checkpoint.pt")
    assert 1 <= summary["updates"] < 10 and saved["counters"]["updates"] == summary["updates"]


def test_resuming_with_another_env_is_refused_naming_both(tmp_path):
    from gossiprl.rl import agent

    cfg = agent.AgentConfig(total_frames=80, torch_threads=1, a2c=A2CConfig(num_envs=4))
    agent.train(cfg, tmp_path, rank=0)
    other = agent.AgentConfig(env_id="Acrobot-v1", total_frames=160, torch_threads=1, a2c=A2CConfig(num_envs=4))
    with pytest.raises(agent.CheckpointError, match="trained on CartPole-v1, this run asks for Acrobot-v1"):
        agent.train(other, tmp_path, rank=0, resume=True)


@pytest.mark.parametrize("env", ["MinAtar/Breakout-v1", "CartPole-v1"])
def test_a_checkpoint_records_what_it_learns_with_and_an_older_unset_one_resumes(tmp_path, env):
    """A checkpoint records its learner's resolved settings, so a later move of the env's defaults
    leaves a resumed run be. One written before, its env-dependent settings unset (None), learned at
    the env's defaults then: today's, but for MinAtar's rate, 1.4e-3 then. An agent resumed with those
    settings left to the env goes on with the checkpoint's (a lone `gossiprl agent --resume` has no
    config.json to say them); one given another rate is refused, naming the rate."""
    import json
    from dataclasses import asdict

    from gossiprl.rl import agent
    from gossiprl.rl.a2c import resolve_defaults
    from gossiprl.rl.settings import PREVIOUS_MINATAR_LR

    cfg = agent.AgentConfig(env_id=env, total_frames=40, torch_threads=1, a2c=A2CConfig(num_envs=4))
    agent.train(cfg, tmp_path, rank=0)
    path = tmp_path / "agent-0" / "checkpoint.pt"
    state = agent.load_checkpoint(path)
    today = asdict(resolve_defaults(cfg.a2c, env))
    recorded = tmp_path / "agent-0" / "config.json"
    assert state["config"]["a2c"] == today == json.loads(recorded.read_text())["a2c"]
    state["config"]["a2c"].update(lr=None, entropy_coef=None, clip_rewards=None)  # as checkpoints were written
    agent.save_checkpoint(path, {k: v for k, v in state.items() if k != "sha256"})
    then = PREVIOUS_MINATAR_LR if env.startswith("MinAtar/") else today["lr"]
    if env.startswith("MinAtar/"):
        only_the_rate = f"with a2c.lr={then!r} \\(now {today['lr']!r}\\): "
        with pytest.raises(agent.CheckpointError, match=only_the_rate):
            agent.train(replace(cfg, a2c=A2CConfig(num_envs=4, lr=today["lr"])), tmp_path, rank=0, resume=True)
    assert agent.train(replace(cfg, total_frames=80), tmp_path, rank=0, resume=True)["updates"] == 4
    resumed_with = {**today, "lr": then}
    assert json.loads(recorded.read_text())["a2c"] == agent.load_checkpoint(path)["config"]["a2c"] == resumed_with


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_asking_for_cuda_without_a_gpu_says_so():
    from gossiprl.rl.agent import pick_device

    with pytest.raises(RuntimeError, match="no CUDA GPU is visible"):
        pick_device("cuda", rank=3)


class StillHook:
    """A gossip hook with no neighbours: mixes nothing, and says its own weight in the matrix."""

    self_weight = 0.25

    def exchange(self, flat_params):
        return {}

    def adopt(self, flat_params):
        return 0


class FlushHook(StillHook):
    """A hook with a round in flight at the end (Gossip with overlap=True): flushing it moves the parameters."""

    def flush(self, flat_params):
        flat_params.add_(1.0)
        return {"gossip/round": 3.0}


@pytest.mark.parametrize("hook,saved", [(None, [1, 2, 3]), (FlushHook(), [1, 2, 3, 3])], ids=["alone", "in-flight"])
def test_a_stop_while_the_source_waits_logs_and_saves_the_last_update_once(tmp_path, monkeypatch, hook, saved):
    """A source that gives up its wait on a stop returns None (IMPALA's learner, waiting for its
    actors): the loop then wrote the last update's row and checkpoint again whenever the pass
    before had written them (always with --log-every 1): two metrics.csv rows, two TensorBoard
    points at one step. Only letters flushed in at the end, which move the parameters, make a
    second checkpoint at that count (it replaces the first)."""
    from gossiprl.rl import agent, rollouts

    stop, fill = threading.Event(), rollouts.LocalRollouts.next

    def waits_after_three(self, version):
        if version < 3:
            return fill(self, version)
        stop.set()
        return None

    saves = []
    monkeypatch.setattr(rollouts.LocalRollouts, "next", waits_after_three)
    monkeypatch.setattr(agent, "save_checkpoint", lambda path, state: saves.append(state["counters"]["updates"]))
    cfg = agent.AgentConfig(
        total_frames=10_000, log_every=1, checkpoint_every=1, torch_threads=1, a2c=A2CConfig(num_envs=4)
    )
    assert agent.train(cfg, tmp_path, rank=0, gossip=hook, stop=stop)["updates"] == 3
    rows = (tmp_path / "agent-0" / "metrics.csv").read_text().splitlines()[1:]
    assert [row.split(",")[2] for row in rows] == ["1", "2", "3"] and saves == saved


@pytest.mark.parametrize(
    "overlap,scale,factor",
    [(True, True, 1.75), (True, False, 1.0), (False, True, 1.0)],
    ids=["rule", "off", "blocking"],
)
def test_overlapped_gossip_scales_the_learning_rate_by_two_minus_the_self_weight(tmp_path, overlap, scale, factor):
    """An overlapped round moves the swarm's mean by u / (2 - p_ii) (docs/algorithm.md): the step
    is scaled back up by 2 - p_ii, and only there."""
    from gossiprl.rl import agent

    cfg = agent.AgentConfig(
        total_frames=80,
        torch_threads=1,
        gossip_overlap=overlap,
        overlap_lr_scale=scale,
        a2c=A2CConfig(num_envs=4, lr=1e-3),
    )
    agent.train(cfg, tmp_path, rank=0, gossip=StillHook())
    saved = agent.load_checkpoint(tmp_path / "agent-0" / "checkpoint.pt")
    assert saved["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-3 * factor)


def test_a_run_resumed_after_a_kill_logs_each_frame_once(tmp_path):
    """A killed session (OOM, a machine's session end) logs rows past its last checkpoint; the resumed
    one goes on from the checkpoint and logs those frames again. metrics.csv kept both, so a study's
    curve went back in frames where a run was resumed. Now the resume drops the killed session's
    rows past the checkpoint, and a row the kill cut short."""
    from gossiprl.rl import agent

    cfg = agent.AgentConfig(total_frames=4 * 20, log_every=1, checkpoint_every=1, torch_threads=1)
    cfg = replace(cfg, a2c=A2CConfig(num_envs=4))  # 20 frames an update: 4 updates, a checkpoint at each
    agent.train(cfg, tmp_path, rank=0)
    metrics = tmp_path / "agent-0" / "metrics.csv"
    header, *rows = metrics.read_text().splitlines()
    past = [row.replace("80,", f"{frames},", 1) for frames in (100, 120) for row in rows[-1:]]
    metrics.write_text("\n".join([header, *rows, *past, "140,0.1"]) + "\n")  # what a killed session left

    agent.train(replace(cfg, total_frames=6 * 20), tmp_path, rank=0, resume=True)

    frames = [int(row.split(",")[0]) for row in metrics.read_text().splitlines()[1:]]
    assert frames == [20, 40, 60, 80, 100, 120]


@pytest.mark.parametrize(
    "left, kept",
    [
        ("frames,wall_s\n20,0.1\n40,0.2\n4", ["frames,wall_s", "20,0.1", "40,0.2"]),  # killed mid-row: "4" of 40 ...
        ("frames,wall_s\n20,0.1\n6", ["frames,wall_s", "20,0.1"]),  # ... or "6" of 60, both within the checkpoint
        ("wall_s\n0.1\n", None),  # not a header of ours: the run writes the file afresh
        ("", None),
    ],
)
def test_a_resume_keeps_only_whole_rows_within_the_checkpoint(tmp_path, left, kept):
    from gossiprl.rl import agent

    metrics = tmp_path / "metrics.csv"
    metrics.write_text(left)
    assert agent._keep_rows_through(metrics, 40) == (None if kept is None else kept[0].split(","))
    if kept is not None:
        assert metrics.read_text().splitlines() == kept
