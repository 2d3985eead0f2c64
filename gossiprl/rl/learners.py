"""The update rules the agent loop runs, behind one interface: ``--algo`` picks one by name.

The loop (``agent.train``) is shared: it takes one filled ``Rollout`` per update from the
learner's rollout source, hands it to the learner's ``update``, then gossips, logs and
checkpoints whatever the learner is. A learner is a module with the four names below, readable top
to bottom on its own (``a2c``, ``ppo``, ``impala``); its hyperparameters are the dataclass of the
same name in ``settings.LEARNERS``, which every learner's config gives ``num_envs``, ``n_steps``
and ``gamma`` (the rollout's shape and time-limit bootstrap).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch
from torch import nn

from gossiprl.rl import a2c, impala, ppo
from gossiprl.rl.rollouts import Rollout, RolloutSource


class Learner(Protocol):
    def resolve_defaults(self, cfg, env_id: str):
        """The config with its env-dependent defaults (None fields) filled in."""

    def make_rollouts(self, cfg, hp, seed: int, env_threads: int) -> RolloutSource:
        """Where the learner's experience comes from: its own envs stepped in the loop
        (``rollouts.LocalRollouts``) or actors apart from it (``actors.ActorPool``)."""

    def make_optimizer(self, model: nn.Module, cfg) -> torch.optim.Optimizer:
        """The optimizer over the model's parameters, which the loop checkpoints."""

    def update(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout, cfg, progress: float
    ) -> dict[str, torch.Tensor]:
        """Learn from one full rollout, in place; ``progress`` is the share of the agent's budget
        spent before it (for schedules). Returns 'losses/...' metrics as detached tensors."""


LEARNERS: dict[str, Learner] = {"a2c": a2c, "ppo": ppo, "impala": impala}


def resolved(cfg):
    """An AgentConfig with its learner's env-dependent defaults (None fields) filled in, as its
    agents resolve them: what a run's checkpoints and config.json's ``learned_with`` record, so a default that moves
    later (MinAtar's A2C rate did) does not change what a resumed run learns with. (Overlapped
    gossip's rate rule, --overlap-lr-scale, scales the rate further in the loop.)"""
    return replace(cfg, **{cfg.algo: LEARNERS[cfg.algo].resolve_defaults(getattr(cfg, cfg.algo), cfg.env_id)})
