"""IMPALA's actors (Espeholt et al. 2018): threads that roll out with the parameters they last
received and hand their trajectories to the learner through a bounded queue.

The shape is torchbeast monobeast's: actors act, the learner learns, and two things pass between
them. ``trajectories`` (a bounded ``queue.Queue``) carries each unroll to the learner: the
observations, actions, rewards, dones, the behaviour policy's logits and the parameter version the
actor acted with. ``ParameterBoard`` carries the learner's newest parameters back: the learner
publishes after each update (and after gossip has mixed the neighbours in), an actor copies them
at the start of each unroll if they are newer than its own. The actor's parameters are therefore
up to a few updates old; that lag is what V-trace (``vtrace``) corrects, and what the learner logs.

Threads, not processes: a process per actor pays a torch import and a network of its own, and on
this project's 2-core hosts, shared with the swarm's other agents, it found no idle core to repay
that. Measured with the same actors as spawned processes, the threads trained MinAtar Breakout as
fast in the steady state and CartPole faster, and started in a fraction of the time
(docs/algorithm.md, "IMPALA").
A full queue blocks the actors rather than dropping their unrolls, so no trajectory is lost or
duplicated and the actors cannot run far ahead of the learner.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch
from torch import nn

from gossiprl.rl.envs import make_env
from gossiprl.rl.models import flatten_parameters, make_model
from gossiprl.rl.rollouts import Rollout, act

POLL_S = 0.05
"""How often a blocked actor or the waiting learner looks up from the queue to check for a stop
or a failed actor."""


class Batch(Rollout):
    """One update's rollout of ``batch_size`` unrolls side by side, ``num_envs`` columns each, plus
    what an off-policy learner needs: the behaviour policy's logits (n_steps, columns, actions)."""

    def __init__(self, n_steps, num_envs, obs_shape, obs_dtype, device, num_actions: int):
        super().__init__(n_steps, num_envs, obs_shape, obs_dtype, device)
        self.behaviour_logits = torch.zeros((n_steps, num_envs, num_actions), device=device)


@dataclass
class Trajectory:
    """One actor's unroll, as it travels through the queue."""

    actor: int
    index: int
    """The actor's count of unrolls before this one: the learner can tell a lost or repeated one."""
    version: int
    """The learner's update count behind the parameters the actor acted with."""
    rollout: Rollout
    logits: torch.Tensor
    episodes: list[tuple[float, int]]
    """(return, length) of the episodes that ended in this unroll."""


class ParameterBoard:
    """The learner's newest parameters and their version; actors copy from it when theirs are older."""

    def __init__(self, flat_params: torch.Tensor):
        self.flat = flat_params.detach().to("cpu", copy=True)
        self.version = 0
        self.lock = threading.Lock()

    def publish(self, flat_params: torch.Tensor, version: int) -> None:
        with self.lock:
            self.flat.copy_(flat_params)
            self.version = version

    def fetch(self, into: torch.Tensor, have: int) -> int:
        """Copy the parameters into ``into`` unless it already holds version ``have``; return the version it holds."""
        with self.lock:
            if self.version != have:
                into.copy_(self.flat)
            return self.version


class Actor(threading.Thread):
    """Unroll ``n_steps`` in its envs, hand the trajectory over, take the newest parameters, repeat."""

    def __init__(self, index: int, envs, model: nn.Module, board: ParameterBoard, trajectories, stop, hp):
        super().__init__(name=f"actor-{index}", daemon=True)
        self.index, self.envs, self.model, self.board = index, envs, model, board
        self.trajectories, self.stop, self.hp = trajectories, stop, hp
        self.flat = flatten_parameters(model)
        self.error: BaseException | None = None
        self.unrolls = 0
        """Unrolls handed over so far."""

    def run(self) -> None:
        try:
            self.act()
        except BaseException as err:  # handed to the learner, which raises it in the agent's thread
            self.error = err

    def act(self) -> None:
        obs = torch.from_numpy(self.envs.reset())
        version = -1
        num_actions = int(self.envs.action_space.n)
        while not self.stop.is_set():
            version = self.board.fetch(self.flat, version)
            rollout = Rollout(self.hp.n_steps, self.hp.num_envs, obs.shape[1:], obs.dtype, torch.device("cpu"))
            rollout.obs[0].copy_(obs)
            logits = torch.empty((self.hp.n_steps, self.hp.num_envs, num_actions))
            act(self.model, self.envs, rollout, self.hp, logits)
            obs = rollout.obs[-1]
            trajectory = Trajectory(self.index, self.unrolls, version, rollout, logits, self.envs.pop_episodes())
            while not self.stop.is_set():
                try:
                    self.trajectories.put(trajectory, timeout=POLL_S)
                    self.unrolls += 1
                    break
                except queue.Full:
                    continue


class ActorFailed(RuntimeError):
    """An actor thread raised; the learner re-raises it so the run ends with the actor's error."""


class ActorPool:
    """The rollout source of ``--algo impala``: ``actors_per_agent`` actor threads and the queue and
    board between them and this learner (``rollouts.RolloutSource``)."""

    def __init__(self, cfg, hp, seed: int, env_threads: int):
        self.hp = hp
        # env i of actor a is seeded seed + a * num_envs + i: no two actors play the same episodes
        self.envs = [
            make_env(
                cfg.env_id,
                hp.num_envs,
                seed + a * hp.num_envs,
                sticky_actions=cfg.sticky_actions,
                num_threads=max(1, env_threads // hp.actors_per_agent),
            )
            for a in range(hp.actors_per_agent)
        ]
        self.observation_space, self.action_space = self.envs[0].observation_space, self.envs[0].action_space
        self.frames_per_update = hp.n_steps * hp.num_envs * hp.batch_size * self.envs[0].frames_per_step
        self.trajectories: queue.Queue[Trajectory] = queue.Queue(maxsize=hp.queue_size)
        self.stop = threading.Event()
        self.actors: list[Actor] = []
        self.episodes: list[tuple[float, int]] = []
        self.taken: list[Trajectory] = []
        """The last batch's trajectories, in the order they fill its columns."""

    def start(self, model: nn.Module, flat_params: torch.Tensor, device: torch.device) -> Batch:
        self.flat_params = flat_params
        self.board = ParameterBoard(flat_params)
        for a, envs in enumerate(self.envs):
            copy = make_model(self.observation_space, self.action_space)
            actor = Actor(a, envs, copy, self.board, self.trajectories, self.stop, self.hp)
            actor.flat.copy_(self.board.flat)
            self.actors.append(actor)
        obs_dtype = torch.from_numpy(self.observation_space.sample()).dtype
        self.batch = Batch(
            self.hp.n_steps,
            self.hp.num_envs * self.hp.batch_size,
            self.observation_space.shape,
            obs_dtype,
            device,
            int(self.action_space.n),
        )
        for actor in self.actors:
            actor.start()
        return self.batch

    def next(self, version: int) -> dict[str, float]:
        """Publish the learner's parameters as ``version``, then wait for ``batch_size`` unrolls."""
        self.check_actors()
        self.board.publish(self.flat_params, version)
        depth = self.trajectories.qsize()
        self.taken = []
        while len(self.taken) < self.hp.batch_size:
            try:
                self.taken.append(self.trajectories.get(timeout=POLL_S))
            except queue.Empty:
                self.check_actors()
        width = self.hp.num_envs
        for j, trajectory in enumerate(self.taken):
            columns = slice(j * width, (j + 1) * width)
            for name in ("obs", "actions", "rewards", "dones", "bootstrap"):
                getattr(self.batch, name)[:, columns].copy_(getattr(trajectory.rollout, name))
            self.batch.behaviour_logits[:, columns].copy_(trajectory.logits)
            self.episodes += trajectory.episodes
        lags = [version - trajectory.version for trajectory in self.taken]
        return {
            "impala/policy_lag_mean": sum(lags) / len(lags),
            "impala/policy_lag_max": float(max(lags)),
            "impala/queue_depth": float(depth),
        }

    def check_actors(self) -> None:
        for actor in self.actors:
            if actor.error is not None:
                raise ActorFailed(f"{actor.name} failed: {type(actor.error).__name__}: {actor.error}") from actor.error

    def pop_episodes(self) -> list[tuple[float, int]]:
        episodes, self.episodes = self.episodes, []
        return episodes

    def close(self) -> None:
        self.stop.set()
        for actor in self.actors:
            actor.join()
        for envs in self.envs:
            envs.close()
