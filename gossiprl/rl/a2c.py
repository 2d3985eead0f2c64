"""Synchronous advantage actor-critic (A2C), the learner inside every PALA/GALA agent (``--algo a2c``).

Read top to bottom: n-step returns, the loss, one update; it acts in the loop with its own
network (``rollouts.LocalRollouts``). The hyperparameters,
A2CConfig, are declared in ``settings`` (torch-free, for the command line); their defaults are
GALA's ``arguments.py`` (which PALA keeps), so Atari runs are comparable with the papers' tables.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from gossiprl.rl.envs import is_atari, is_minatar
from gossiprl.rl.rollouts import LocalRollouts, Rollout
from gossiprl.rl.settings import ATARI_LR, MINATAR_LR, A2CConfig


def resolve_defaults(cfg: A2CConfig, env_id: str) -> A2CConfig:
    """Fill the settings whose default depends on the kind of env (None in A2CConfig): the
    learning rate is larger on MinAtar, whose small network and dense rewards take larger steps
    than Atari's; the entropy bonus is the papers' 0.01 on Atari and MinAtar games and 0 on
    control tasks; rewards are clipped on Atari only."""
    games = is_atari(env_id) or is_minatar(env_id)
    return replace(
        cfg,
        lr=(MINATAR_LR if is_minatar(env_id) else ATARI_LR) if cfg.lr is None else cfg.lr,
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
    is detached so the policy term does not train the critic.
    """
    advantages = (returns - values).detach()
    return actor_critic_loss(logits, values, actions, returns, advantages, value_coef, entropy_coef)


def actor_critic_loss(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    value_targets: torch.Tensor,
    advantages: torch.Tensor,
    value_coef: float,
    entropy_coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-A log pi(a|s) + value_coef (target - V)^2 - entropy_coef H(pi), each a mean over the batch.

    A2C's targets are its n-step returns and A = G - V; IMPALA's are V-trace's (``impala``).
    ``advantages`` must come detached. Metrics are returned as detached tensors, so the caller
    decides when to pay for a device sync.
    """
    log_probs = torch.log_softmax(logits, dim=-1)
    action_log_probs = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
    value_loss = (value_targets - values).pow(2).mean()
    policy_loss = -(advantages * action_log_probs).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    metrics = {
        "losses/value_loss": value_loss.detach(),
        "losses/policy_loss": policy_loss.detach(),
        "losses/entropy": entropy.detach(),
    }
    return loss, metrics


make_rollouts = LocalRollouts


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
