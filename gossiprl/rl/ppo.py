"""Proximal policy optimisation (PPO) with a clipped surrogate, the learner of ``--algo ppo``.

Read top to bottom: the env-dependent defaults, GAE, the loss, one update. It follows CleanRL's
ppo.py / ppo_atari.py (Huang et al., "The 37 implementation details of PPO"): advantages by GAE,
update_epochs passes over the rollout in num_minibatches shuffled minibatches, advantages
normalised per minibatch, the value loss clipped around the rollout's values, Adam with eps 1e-5
and the learning rate annealed to 0. The hyperparameters, PPOConfig, are declared in
``settings``. Two things differ from CleanRL, both from the shared agent loop: an episode cut by a
time limit bootstraps from V(final state) (``Rollout.bootstrap``), and the rollout's log-probs and
values are evaluated here, in one batched pass before the first epoch, rather than stored step by
step. They are the same numbers: gossip changes the parameters only after an update, so the
network that acted is the network that starts the update.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from gossiprl.rl.envs import is_atari, is_minatar
from gossiprl.rl.rollouts import LocalRollouts, Rollout
from gossiprl.rl.settings import PPOConfig


def resolve_defaults(cfg: PPOConfig, env_id: str) -> PPOConfig:
    """Fill the settings whose default depends on the kind of env (None in PPOConfig): CleanRL's
    ppo_atari.py values (8 envs, clip 0.1) on Atari and MinAtar games, its ppo.py values (4 envs,
    clip 0.2) on control tasks; rewards are clipped on Atari only."""
    games = is_atari(env_id) or is_minatar(env_id)
    cfg = replace(
        cfg,
        num_envs=(8 if games else 4) if cfg.num_envs is None else cfg.num_envs,
        clip_coef=(0.1 if games else 0.2) if cfg.clip_coef is None else cfg.clip_coef,
        clip_rewards=is_atari(env_id) if cfg.clip_rewards is None else cfg.clip_rewards,
    )
    if cfg.num_minibatches > cfg.num_envs * cfg.n_steps:
        raise ValueError(
            f"num_minibatches {cfg.num_minibatches} is more than the rollout's {cfg.num_envs * cfg.n_steps} "
            "samples (num_envs x n_steps): lower --num-minibatches or raise --n-steps / --num-envs"
        )
    return cfg


def gae(rewards: torch.Tensor, dones: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates: A_t = delta_t + gamma lam (1 - d_t) A_{t+1}, with the TD
    error delta_t = r_t + gamma (1 - d_t) V(s_{t+1}) - V(s_t).

    rewards, dones: (n_steps, num_envs); dones[t] is true when the step taken at t ended the
    episode, so neither V(s_{t+1}) nor a later advantage leaks across it. values: (n_steps + 1,
    num_envs), V of every observation of the rollout and of the one after its last step.
    lam = 1 gives G_t - V(s_t) with the n-step return G_t; lam = 0 the one-step TD error.
    """
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(values[-1])
    for t in reversed(range(rewards.shape[0])):
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * values[t + 1] * alive - values[t]
        running = delta + gamma * lam * alive * running
        advantages[t] = running
    return advantages


def ppo_loss(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    old_log_probs: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    cfg: PPOConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate, the (clipped) value loss and the entropy bonus on one minibatch.

    Inputs are flat (B, A) logits and (B,) the rest; ``old_*`` are the rollout's. The policy term
    is max(-A r, -A clip(r, 1 - eps, 1 + eps)) with r = pi(a|s) / pi_old(a|s): a step that would
    move r past the clip range in the direction A favours earns nothing more. The value term is
    0.5 max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2) with clip_vloss. Metrics are
    detached tensors, as in ``a2c.a2c_loss``.
    """
    log_probs = torch.log_softmax(logits, dim=-1)
    new_log_probs = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    if cfg.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    if cfg.clip_vloss:
        clipped = old_values + (values - old_values).clamp(-cfg.clip_coef, cfg.clip_coef)
        value_loss = 0.5 * torch.max((values - returns).pow(2), (clipped - returns).pow(2)).mean()
    else:
        value_loss = 0.5 * (values - returns).pow(2).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    loss = policy_loss - cfg.entropy_coef * entropy + cfg.value_coef * value_loss
    with torch.no_grad():
        metrics = {
            "losses/value_loss": value_loss.detach(),
            "losses/policy_loss": policy_loss.detach(),
            "losses/entropy": entropy.detach(),
            "losses/approx_kl": ((ratio - 1) - log_ratio).mean(),  # http://joschu.net/blog/kl-approx.html
            "losses/clipfrac": ((ratio - 1).abs() > cfg.clip_coef).float().mean(),
        }
    return loss, metrics


make_rollouts = LocalRollouts


def make_optimizer(model: nn.Module, cfg: PPOConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=cfg.adam_eps)


def update(
    model: nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout, cfg: PPOConfig, progress: float = 0.0
) -> dict[str, torch.Tensor]:
    """update_epochs x num_minibatches clipped steps on one rollout; ``progress`` is the share of
    the agent's budget spent before it, which anneals the learning rate. Returns the last
    minibatch's metrics, as CleanRL logs them."""
    if cfg.anneal_lr:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * max(0.0, 1.0 - progress)
    n_steps, num_envs = rollout.rewards.shape
    with torch.no_grad():
        logits, values = model(rollout.obs.flatten(0, 1))
        values = values.view(n_steps + 1, num_envs)
        old_log_probs = torch.log_softmax(logits[: n_steps * num_envs], -1).gather(1, rollout.actions.view(-1, 1))
        rewards = (rollout.rewards.sign() if cfg.clip_rewards else rollout.rewards) + rollout.bootstrap
        advantages = gae(rewards, rollout.dones, values, cfg.gamma, cfg.gae_lambda)
        returns = advantages + values[:-1]

    obs, actions = rollout.obs[:-1].flatten(0, 1), rollout.actions.flatten()
    old_log_probs, old_values = old_log_probs.squeeze(1), values[:-1].flatten()
    advantages, returns = advantages.flatten(), returns.flatten()
    for _ in range(cfg.update_epochs):
        for batch in torch.randperm(len(actions), device=actions.device).tensor_split(cfg.num_minibatches):
            new_logits, new_values = model(obs[batch])
            loss, metrics = ppo_loss(
                new_logits,
                new_values,
                actions[batch],
                old_log_probs[batch],
                old_values[batch],
                advantages[batch],
                returns[batch],
                cfg,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
    return metrics
