"""Synchronous advantage actor-critic (A2C), the learner inside every PALA/GALA agent (``--algo a2c``).

Read top to bottom: n-step returns, the loss, rollout storage, one update. The hyperparameters,
A2CConfig, are declared in ``settings`` (torch-free, for the command line); their defaults are
GALA's ``arguments.py`` (which PALA keeps), so Atari runs are comparable with the papers' tables.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from gossiprl.rl.envs import is_atari, is_minatar
from gossiprl.rl.settings import A2CConfig


def resolve_defaults(cfg: A2CConfig, env_id: str) -> A2CConfig:
    """Fill the settings whose default depends on the kind of env (None in A2CConfig): the
    entropy bonus is the papers' 0.01 on Atari and MinAtar games and 0 on control tasks, rewards
    are clipped on Atari only."""
    games = is_atari(env_id) or is_minatar(env_id)
    return replace(
        cfg,
        clip_rewards=is_atari(env_id) if cfg.clip_rewards is None else cfg.clip_rewards,
        entropy_coef=(0.01 if games else 0.0) if cfg.entropy_coef is None else cfg.entropy_coef,
    )


def nstep_returns(rewards: torch.Tensor, dones: torch.Tensor, last_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_k gamma^k r_{t+k} + gamma^(N-t) V(s_N), cut at episode ends.

    rewards, dones: (n_steps, num_envs); dones[t] is true when the step taken at t ended
    the episode, so nothing after it (neither later rewards nor V(s_N)) leaks into G_t.
    last_value: (num_envs,), V of the observation after the last step.
    """
    returns = torch.empty_like(rewards)
    running = last_value
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        returns[t] = running
    return returns


def a2c_loss(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    returns: torch.Tensor,
    value_coef: float,
    entropy_coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy gradient with advantage A = G - V, squared value error, minus an entropy bonus.

    Inputs are flat over (step, env): logits (B, A), values/actions/returns (B,). The advantage
    is detached so the policy term does not train the critic. Metrics are returned as
    detached tensors, so the caller decides when to pay for a device sync.
    """
    log_probs = torch.log_softmax(logits, dim=-1)
    action_log_probs = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
    advantages = returns - values
    value_loss = advantages.pow(2).mean()
    policy_loss = -(advantages.detach() * action_log_probs).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    metrics = {
        "losses/value_loss": value_loss.detach(),
        "losses/policy_loss": policy_loss.detach(),
        "losses/entropy": entropy.detach(),
    }
    return loss, metrics


class Rollout:
    """Preallocated (n_steps, num_envs) storage for one update; ``obs`` has one more row.

    ``obs[n_steps]`` is the state the returns bootstrap from, and becomes ``obs[0]`` of the
    next rollout, so the learner evaluates all n_steps + 1 rows in a single forward pass.
    """

    def __init__(
        self, n_steps: int, num_envs: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, device: torch.device
    ):
        self.obs = torch.zeros((n_steps + 1, num_envs, *obs_shape), dtype=obs_dtype, device=device)
        self.actions = torch.zeros((n_steps, num_envs), dtype=torch.long, device=device)
        self.rewards = torch.zeros((n_steps, num_envs), dtype=torch.float32, device=device)
        self.dones = torch.zeros((n_steps, num_envs), dtype=torch.float32, device=device)
        self.bootstrap = torch.zeros((n_steps, num_envs), dtype=torch.float32, device=device)
        """gamma * V(final obs) for steps where a time limit cut the episode, else 0."""

    def truncation_bonus(self, step: int, envs: torch.Tensor, final_values: torch.Tensor, cfg: A2CConfig) -> None:
        """Envs cut by a time limit at ``step`` get gamma * V(final obs) added to that step's return.

        The step stays done, so nothing of the next episode leaks in, but the return goes
        on as if the episode had. Kept apart from the rewards so reward clipping leaves it alone.
        """
        self.bootstrap[step, envs] = cfg.gamma * final_values.float()

    def next_rollout(self) -> None:
        self.obs[0].copy_(self.obs[-1])
        self.bootstrap.zero_()


def make_optimizer(model: nn.Module, cfg: A2CConfig) -> torch.optim.Optimizer:
    return torch.optim.RMSprop(model.parameters(), lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.rmsprop_eps)


def update(
    model: nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout, cfg: A2CConfig, progress: float = 0.0
) -> dict[str, torch.Tensor]:
    """One A2C step on a full rollout: evaluate, n-step returns, loss, clipped RMSProp step.
    ``progress`` (the budget spent) goes unused: the papers' A2C keeps its learning rate."""
    n_steps, num_envs = rollout.rewards.shape
    logits, values = model(rollout.obs.flatten(0, 1))
    values = values.view(n_steps + 1, num_envs)
    rewards = (rollout.rewards.sign() if cfg.clip_rewards else rollout.rewards) + rollout.bootstrap
    returns = nstep_returns(rewards, rollout.dones, values[-1].detach(), cfg.gamma)
    loss, metrics = a2c_loss(
        logits[: n_steps * num_envs],
        values[:-1].flatten(),
        rollout.actions.flatten(),
        returns.flatten(),
        cfg.value_coef,
        cfg.entropy_coef,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return metrics
