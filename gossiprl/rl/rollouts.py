"""Where an update's experience comes from: the agent's own envs, stepped in the loop (A2C, PPO).

The loop (``agent.train``) asks a rollout source for one filled ``Rollout`` per update and never
steps an env itself, so a learner whose actors run apart from it (IMPALA's ``actors.ActorPool``)
plugs into the same loop, gossip, logging and checkpoints. ``LocalRollouts`` is the synchronous
source: act n_steps in every env with the learner's own network, which is the network the update
then changes.
"""

from __future__ import annotations

from typing import Protocol

import gymnasium as gym
import torch
from torch import nn

from gossiprl.rl.envs import make_env


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

    def truncation_bonus(self, step: int, envs: torch.Tensor, final_values: torch.Tensor, cfg) -> None:
        """Envs cut by a time limit at ``step`` get gamma * V(final obs) added to that step's return.

        The step stays done, so nothing of the next episode leaks in, but the return goes
        on as if the episode had. Kept apart from the rewards so reward clipping leaves it alone.
        """
        self.bootstrap[step, envs] = cfg.gamma * final_values.float()

    def next_rollout(self) -> None:
        self.obs[0].copy_(self.obs[-1])
        self.bootstrap.zero_()


def sample(logits: torch.Tensor) -> torch.Tensor:
    """One action per row from softmax(logits), by the Gumbel-max trick: argmax(logits + Gumbel
    noise) is distributed as the softmax, in three elementwise ops and no normalisation (0.14 ms
    less per step of 16 envs than softmax + multinomial on one thread)."""
    return (logits - torch.empty_like(logits).exponential_().log()).argmax(-1)


def act(model: nn.Module, envs, rollout: Rollout, cfg, logits_out: torch.Tensor | None = None) -> None:
    """Step ``envs`` for every row of ``rollout`` from ``rollout.obs[0]``, sampling from ``model``.

    ``logits_out`` (n_steps, num_envs, actions), when given, receives the acting policy's logits
    (what an off-policy learner needs of the behaviour policy). An episode cut by a time limit is
    bootstrapped from V(final obs) under ``model``."""
    device = rollout.obs.device
    for step in range(rollout.actions.shape[0]):
        with torch.inference_mode():
            logits, _ = model(rollout.obs[step])
            actions = sample(logits)
        if logits_out is not None:
            logits_out[step].copy_(logits)
        obs, rewards, dones, (cut, final_obs) = envs.step(actions.cpu().numpy())
        rollout.actions[step] = actions
        rollout.obs[step + 1].copy_(torch.from_numpy(obs))
        rollout.rewards[step].copy_(torch.from_numpy(rewards))
        rollout.dones[step].copy_(torch.from_numpy(dones))
        if len(cut):  # time limit: bootstrap from the state the episode was cut in
            with torch.no_grad():
                _, cut_values = model(torch.from_numpy(final_obs).to(device))
            rollout.truncation_bonus(step, torch.from_numpy(cut).to(device), cut_values, cfg)


class RolloutSource(Protocol):
    observation_space: gym.Space
    action_space: gym.Space
    frames_per_update: int
    """Frames one filled rollout holds (env steps x the env's frames per step)."""

    def start(self, model: nn.Module, flat_params: torch.Tensor, device: torch.device, stop=None) -> Rollout:
        """Begin acting with ``model`` (whose parameters are ``flat_params``); return the storage
        ``next`` fills. ``stop`` is the agent's (Event-like): a source that waits on others (IMPALA's
        actors) gives up its waits once it is set, so a stopped agent ends rather than hangs."""

    def next(self, version: int) -> dict[str, float] | None:
        """Fill the rollout for update ``version + 1`` (``version`` updates done); return 'impala/...'
        style stats of the filling ({} if it has none), or None when ``stop`` was set before it was filled."""

    def pop_episodes(self) -> list[tuple[float, int]]:
        """(return, length) of every episode whose steps the rollouts handed out so far ended."""

    def close(self) -> None: ...


class LocalRollouts:
    """The agent's own ``num_envs`` envs, stepped by the learner's network in the loop's thread."""

    def __init__(self, cfg, hp, seed: int, env_threads: int):
        self.envs = make_env(cfg.env_id, hp.num_envs, seed, sticky_actions=cfg.sticky_actions, num_threads=env_threads)
        self.observation_space, self.action_space = self.envs.observation_space, self.envs.action_space
        self.frames_per_update = hp.n_steps * hp.num_envs * self.envs.frames_per_step
        self.hp = hp

    def start(self, model: nn.Module, flat_params: torch.Tensor, device: torch.device, stop=None) -> Rollout:
        """``stop`` goes unused: the envs are the agent's own, and a rollout waits on nobody."""
        first_obs = torch.from_numpy(self.envs.reset())
        self.model = model
        self.rollout = Rollout(self.hp.n_steps, self.hp.num_envs, first_obs.shape[1:], first_obs.dtype, device)
        self.rollout.obs[0].copy_(first_obs)
        self.started = False
        return self.rollout

    def next(self, version: int) -> dict[str, float]:
        if self.started:
            self.rollout.next_rollout()
        self.started = True
        act(self.model, self.envs, self.rollout, self.hp)
        return {}

    def pop_episodes(self) -> list[tuple[float, int]]:
        return self.envs.pop_episodes()

    def close(self) -> None:
        self.envs.close()
