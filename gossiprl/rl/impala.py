"""IMPALA's learner (Espeholt et al. 2018), the update rule of ``--algo impala``.

Read top to bottom: the env-dependent defaults, then one update. The experience comes from
actors that act with the parameters they last received (``actors.ActorPool``), so the
batch was drawn from a behaviour policy mu a few updates older than the learner's pi. V-trace
(``vtrace``) corrects for that: the value targets v_s and the policy-gradient advantages
rho_s (r_s + gamma v_{s+1} - V(x_s)) weigh each step by its truncated importance ratio pi/mu.
Everything else is A2C's: the same loss shape, mean-reduced over the batch, and RMSProp. On
policy (mu = pi, so every ratio is 1 and no truncation bites) the loss is exactly A2C's on the
same rollout. The hyperparameters, ImpalaConfig, are declared in ``settings``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from gossiprl.rl import a2c
from gossiprl.rl.a2c import actor_critic_loss
from gossiprl.rl.actors import ActorPool, Batch
from gossiprl.rl.envs import is_atari, is_minatar
from gossiprl.rl.settings import ImpalaConfig
from gossiprl.rl.vtrace import vtrace


def resolve_defaults(cfg: ImpalaConfig, env_id: str) -> ImpalaConfig:
    """Fill the settings whose default depends on the kind of env (None in ImpalaConfig): the
    paper's unrolls (20 steps), batch (8 unrolls of 4 envs) and entropy cost 0.01 on Atari and
    MinAtar games; on control tasks A2C's: 5-step unrolls, 4 to a batch (80 transitions) and no
    entropy bonus; rewards clipped on Atari only; the queue holds two batches unless told."""
    games = is_atari(env_id) or is_minatar(env_id)
    batch_size = (8 if games else 4) if cfg.batch_size is None else cfg.batch_size
    return replace(
        cfg,
        n_steps=(20 if games else 5) if cfg.n_steps is None else cfg.n_steps,
        batch_size=batch_size,
        queue_size=2 * batch_size if cfg.queue_size is None else cfg.queue_size,
        clip_rewards=is_atari(env_id) if cfg.clip_rewards is None else cfg.clip_rewards,
        entropy_coef=(0.01 if games else 0.0) if cfg.entropy_coef is None else cfg.entropy_coef,
    )


make_rollouts = ActorPool


make_optimizer = a2c.make_optimizer  # RMSProp, as the paper's, from the same fields as A2C's


def update(
    model: nn.Module, optimizer: torch.optim.Optimizer, rollout: Batch, cfg: ImpalaConfig, progress: float = 0.0
) -> dict[str, torch.Tensor]:
    """One V-trace step on a batch of unrolls; ``progress`` (the share of the budget spent) anneals
    the learning rate. Also returns 'impala/rho_clipped', the share of steps whose ratio pi/mu
    exceeded rho_bar: how much of the batch V-trace truncated."""
    if cfg.anneal_lr:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * max(0.0, 1.0 - progress)
    n_steps, columns = rollout.rewards.shape
    logits, values = model(rollout.obs.flatten(0, 1))
    logits, values = logits[: n_steps * columns], values.view(n_steps + 1, columns)
    actions = rollout.actions.flatten()
    with torch.no_grad():
        log_pi = torch.log_softmax(logits, -1).gather(1, actions.unsqueeze(1)).view(n_steps, columns)
        log_mu = torch.log_softmax(rollout.behaviour_logits, -1).gather(2, rollout.actions.unsqueeze(2)).squeeze(2)
        log_rhos = log_pi - log_mu
    rewards = (rollout.rewards.clamp(-1, 1) if cfg.clip_rewards else rollout.rewards) + rollout.bootstrap
    vs, pg_advantages = vtrace(
        log_rhos,
        cfg.gamma * (1.0 - rollout.dones),
        rewards,
        values.detach(),
        rho_bar=cfg.rho_bar,
        c_bar=cfg.c_bar,
        pg_rho_bar=cfg.rho_bar,
    )
    # the paper's section 4.2 loss: policy gradient with V-trace's advantages, squared error
    # against its targets, minus the entropy bonus
    loss, metrics = actor_critic_loss(
        logits, values[:-1].flatten(), actions, vs.flatten(), pg_advantages.flatten(), cfg.value_coef, cfg.entropy_coef
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    metrics["impala/rho_clipped"] = (log_rhos > math.log(cfg.rho_bar)).float().mean()
    return metrics
