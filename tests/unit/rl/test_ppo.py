"""The PPO learner checked against numbers worked out by hand (GAE, the clipped surrogate, the
clipped value loss), and a short run of it through the shared agent loop."""

import csv
import math

import pytest
import torch

from gossiprl.rl.a2c import nstep_returns
from gossiprl.rl.ppo import gae, ppo_loss, resolve_defaults
from gossiprl.rl.settings import AgentConfig, PPOConfig

# ------------------------------------------------------------------ GAE

REWARDS = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
DONES = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])  # env 0's episode ends at step 1
VALUES = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [10.0, 20.0]])  # the last row: V(s_3)


def test_gae_matches_hand_computation():
    # gamma .5, lambda .5 (gamma lambda = .25)
    # env 0: d2 = 5 + .5*10 - 5 = 5,  A2 = 5
    #        d1 = 3 - 3 = 0 (done: no V(s2), no A2),  A1 = 0
    #        d0 = 1 + .5*3 - 1 = 1.5, A0 = 1.5 + .25*0 = 1.5
    # env 1: d2 = 6 + .5*20 - 6 = 10, A2 = 10
    #        d1 = 4 + .5*6 - 4 = 3,   A1 = 3 + .25*10 = 5.5
    #        d0 = 2 + .5*4 - 2 = 2,   A0 = 2 + .25*5.5 = 3.375
    advantages = gae(REWARDS, DONES, VALUES, gamma=0.5, lam=0.5)
    assert advantages.tolist() == [[1.5, 3.375], [0.0, 5.5], [5.0, 10.0]]


def test_gae_spans_the_n_step_return_and_the_td_error():
    torch.manual_seed(0)
    rewards, values = torch.randn(6, 3), torch.randn(7, 3)
    dones = (torch.rand(6, 3) < 0.3).float()
    full = gae(rewards, dones, values, gamma=0.9, lam=1.0)
    assert torch.allclose(full, nstep_returns(rewards, dones, values[-1], 0.9) - values[:-1], atol=1e-6)
    td = gae(rewards, dones, values, gamma=0.9, lam=0.0)
    assert torch.allclose(td, rewards + 0.9 * (1 - dones) * values[1:] - values[:-1], atol=1e-6)


# ------------------------------------------------------------------ the clipped losses

# sample 0: new probs (1/4, 3/4), took action 1 (new p .75, old p .5: ratio 1.5), A = +2
# sample 1: new probs (1/2, 1/2), took action 0 (new p .5, old p .25: ratio 2), A = -1
LOGITS = [[0.0, math.log(3.0)], [0.0, 0.0]]
ACTIONS = torch.tensor([1, 0])
OLD_LOG_PROBS = torch.tensor([math.log(0.5), math.log(0.25)])
ADVANTAGES = torch.tensor([2.0, -1.0])
# sample 0: V 1 from 0.5, G 3: unclipped (1-3)^2 = 4, clipped V .5+.2 = .7: 2.3^2 = 5.29 -> 5.29
# sample 1: V 2 from 1.0, G 0: unclipped 4, clipped V 1.2: 1.44 -> 4
VALUES_NOW = [1.0, 2.0]
OLD_VALUES = torch.tensor([0.5, 1.0])
RETURNS = torch.tensor([3.0, 0.0])


def loss_of(cfg):
    logits = torch.tensor(LOGITS, requires_grad=True)
    values = torch.tensor(VALUES_NOW, requires_grad=True)
    loss, metrics = ppo_loss(logits, values, ACTIONS, OLD_LOG_PROBS, OLD_VALUES, ADVANTAGES, RETURNS, cfg)
    return loss, metrics, logits, values


def test_ppo_loss_matches_hand_computation():
    cfg = PPOConfig(clip_coef=0.2, norm_adv=False, entropy_coef=0.01, value_coef=0.5)
    loss, metrics, _, _ = loss_of(cfg)
    # policy: sample 0 max(-2*1.5, -2*1.2) = -2.4 (clipped); sample 1 max(1*2, 1*1.2) = 2 -> mean -0.2
    assert metrics["losses/policy_loss"].item() == pytest.approx(-0.2)
    assert metrics["losses/value_loss"].item() == pytest.approx(0.5 * (5.29 + 4.0) / 2)
    entropy = (-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) + math.log(2.0)) / 2
    assert metrics["losses/entropy"].item() == pytest.approx(entropy)
    assert loss.item() == pytest.approx(-0.2 + 0.5 * 0.5 * 9.29 / 2 - 0.01 * entropy)
    assert metrics["losses/clipfrac"].item() == 1.0  # both ratios are outside [0.8, 1.2]
    kl = ((1.5 - 1) - math.log(1.5) + (2 - 1) - math.log(2.0)) / 2
    assert metrics["losses/approx_kl"].item() == pytest.approx(kl)


def test_without_clipping_the_surrogate_and_value_loss_are_plain():
    cfg = PPOConfig(clip_coef=10.0, clip_vloss=False, norm_adv=False, entropy_coef=0.0, value_coef=0.5)
    _, metrics, _, _ = loss_of(cfg)
    assert metrics["losses/policy_loss"].item() == pytest.approx((-2 * 1.5 + 1 * 2) / 2)
    assert metrics["losses/value_loss"].item() == pytest.approx(0.5 * (4.0 + 4.0) / 2)


def test_a_clipped_sample_gives_no_gradient():
    """Sample 0's ratio is past 1 + eps in the direction its advantage favours, and its clipped
    value is the larger error: neither may pull on the network. Sample 1 still does."""
    cfg = PPOConfig(clip_coef=0.2, norm_adv=False, entropy_coef=0.0, value_coef=0.5)
    loss, _, logits, values = loss_of(cfg)
    loss.backward()
    assert logits.grad[0].abs().sum().item() == 0.0 and logits.grad[1].abs().sum().item() > 0
    # d/dV1 of 0.5 * 0.5 * mean(.., (V1 - 0)^2) = 0.5 * 0.5 * 2 * 2 / 2 = 0.5
    assert values.grad.tolist() == pytest.approx([0.0, 0.5])


def test_advantages_are_normalised_per_minibatch():
    cfg = PPOConfig(clip_coef=0.2, norm_adv=True, entropy_coef=0.0)
    _, metrics, _, _ = loss_of(cfg)
    a = 1.5 / math.sqrt(2 * 1.5**2)  # (2, -1) -> mean .5, unbiased std 2.1213 -> (+a, -a)
    assert metrics["losses/policy_loss"].item() == pytest.approx((-a * 1.2 + a * 2) / 2, rel=1e-5)


def test_env_dependent_defaults_are_cleanrls():
    control, minatar, atari = (
        resolve_defaults(PPOConfig(), e) for e in ("CartPole-v1", "MinAtar/Breakout-v1", "ALE/Pong-v5")
    )
    assert (control.num_envs, control.clip_coef, control.clip_rewards) == (4, 0.2, False)
    assert (minatar.num_envs, minatar.clip_coef, minatar.clip_rewards) == (8, 0.1, False)
    assert (atari.num_envs, atari.clip_coef, atari.clip_rewards) == (8, 0.1, True)
    given = resolve_defaults(PPOConfig(num_envs=2, clip_coef=0.3), "ALE/Pong-v5")
    assert (given.num_envs, given.clip_coef) == (2, 0.3)
    with pytest.raises(ValueError, match="num_minibatches 9 is more than the rollout's 8 samples"):
        resolve_defaults(PPOConfig(num_envs=2, n_steps=4, num_minibatches=9), "CartPole-v1")


# ------------------------------------------------------------------ through the agent loop


def tiny_ppo(**kw) -> AgentConfig:
    return AgentConfig(
        algo="ppo", total_frames=256, torch_threads=1, log_every=1, ppo=PPOConfig(num_envs=2, n_steps=32), **kw
    )


def test_a_short_ppo_run_steps_the_network_and_logs_its_metrics(tmp_path):
    from gossiprl.rl import agent

    summary = agent.train(tiny_ppo(), tmp_path, rank=0)
    assert summary["updates"] == 4 and summary["frames"] == 256
    saved = agent.load_checkpoint(tmp_path / "agent-0" / "checkpoint.pt")
    assert saved["config"]["algo"] == "ppo"
    assert [g["lr"] for g in saved["optimizer"]["param_groups"]] == pytest.approx([2.5e-4 * (1 - 192 / 256)])
    assert len(saved["optimizer"]["state"]) > 0 and "exp_avg" in saved["optimizer"]["state"][0]  # Adam's
    with open(tmp_path / "agent-0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(float(r["losses/approx_kl"]) >= 0 for r in rows)


def test_resuming_with_another_algo_is_refused_and_an_old_checkpoint_is_a2cs(tmp_path):
    from dataclasses import asdict, replace

    from gossiprl.rl import agent

    agent.train(tiny_ppo(), tmp_path, rank=0)
    with pytest.raises(agent.CheckpointError, match="was trained by ppo, this run asks for a2c"):
        agent.train(AgentConfig(total_frames=512, torch_threads=1), tmp_path, rank=0, resume=True)
    # a checkpoint from before --algo existed has no algo in its config: A2C wrote it
    path = tmp_path / "agent-0" / "checkpoint.pt"
    state = agent.load_checkpoint(path)
    state["config"] = {k: v for k, v in asdict(tiny_ppo()).items() if k != "algo"}
    agent.save_checkpoint(path, {k: v for k, v in state.items() if k != "sha256"})
    with pytest.raises(agent.CheckpointError, match="was trained by a2c, this run asks for ppo"):
        agent.train(replace(tiny_ppo(), total_frames=512), tmp_path, rank=0, resume=True)


def test_a_ppo_checkpoint_with_its_env_dependent_settings_unset_resumes(tmp_path):
    """Checkpoints recorded None for the settings the env decides until they recorded what the agent
    learned with; such a checkpoint resumes with the settings it meant, and not with others."""
    from dataclasses import asdict, replace

    from gossiprl.rl import agent

    cfg = replace(tiny_ppo(), ppo=PPOConfig())  # every env-dependent setting left to the env
    agent.train(replace(cfg, total_frames=2048), tmp_path, rank=0)
    path = tmp_path / "agent-0" / "checkpoint.pt"
    state = agent.load_checkpoint(path)
    unset = [k for k, v in asdict(PPOConfig()).items() if v is None]
    assert unset and all(state["config"]["ppo"][k] is not None for k in unset)
    state["config"]["ppo"].update(dict.fromkeys(unset))
    agent.save_checkpoint(path, {k: v for k, v in state.items() if k != "sha256"})
    with pytest.raises(agent.CheckpointError, match="ppo.lr="):
        agent.train(replace(cfg, total_frames=4096, ppo=PPOConfig(lr=1e-3)), tmp_path, rank=0, resume=True)
    assert agent.train(replace(cfg, total_frames=4096), tmp_path, rank=0, resume=True)["frames"] == 4096


def test_a_ppo_checkpoint_from_before_minatars_a2c_rate_resumes():
    """Its unused A2C section recorded 7e-4, the default then, which is None now: not a setting the
    run learned with, so no reason to refuse the resume. The PPO section still is."""
    from dataclasses import asdict, replace

    from gossiprl.rl import agent

    cfg = tiny_ppo()
    saved = asdict(cfg)
    saved["a2c"]["lr"] = 7e-4
    assert agent.changed_on_resume(saved, cfg) == []
    assert agent.changed_on_resume(saved, replace(cfg, ppo=replace(cfg.ppo, lr=1e-3))) == [
        f"ppo.lr={cfg.ppo.lr!r} (now 0.001)"
    ]
