"""IMPALA's actors (Espeholt et al. 2018) and the learner's end of them: the rollout source of
``--algo impala``.

The shape is torchbeast monobeast's: actors act, the learner learns, and two things pass between
them. ``trajectories`` carries each unroll to the learner: the observations, actions, rewards,
dones, the behaviour policy's logits and the parameter version the actor acted with. The
parameters travel back: the learner publishes them after each update (and after gossip has mixed
the neighbours in), and an actor takes them at the start of each unroll if they are newer than its
own. The actor's parameters are therefore up to a few updates old; that lag is what V-trace
(``vtrace``) corrects, and what the learner logs.

Where the actors run is ``--actor-placement``. ``process`` (``actor_processes``): each actor is a
process of its own, on this host or another, and the two flows are messages over ZeroMQ
(``gossiprl.comms.trajectories``). ``thread`` (``ActorThreads``, below): each actor is a thread
of the learner's process, ``trajectories`` a bounded ``queue.Queue`` and the parameters a
``ParameterBoard``; no serialisation, no start-up, but the actors share the learner's interpreter.
Either way the queue is bounded and a full queue blocks the actors rather than dropping their
unrolls, so no trajectory is lost or duplicated and the actors cannot run far ahead of the learner.
docs/algorithm.md ("IMPALA") has the measurements behind the default placement.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import torch
from torch import nn

from gossiprl.comms.trajectories import ActorFailed, Trajectory
from gossiprl.rl.envs import make_env
from gossiprl.rl.models import flatten_parameters, make_model
from gossiprl.rl.rollouts import Rollout, act

__all__ = ["ActorFailed", "ActorPool", "ActorThreads", "Batch", "Trajectory"]

POLL_S = 0.05
"""How often a blocked actor or the waiting learner looks up from the queue to check for a stop
or a failed actor."""

BATCH_ARRAYS = {
    "obs": "obs",
    "actions": "actions",
    "rewards": "rewards",
    "dones": "dones",
    "bootstrap": "bootstrap",
    "logits": "behaviour_logits",
}
"""Each array of a trajectory and the field of the batch it fills."""


class Batch(Rollout):
    """One update's rollout of ``batch_size`` unrolls side by side, ``num_envs`` columns each, plus
    what an off-policy learner needs: the behaviour policy's logits (n_steps, columns, actions)."""

    def __init__(self, n_steps, num_envs, obs_shape, obs_dtype, device, num_actions: int):
        super().__init__(n_steps, num_envs, obs_shape, obs_dtype, device)
        self.behaviour_logits = torch.zeros((n_steps, num_envs, num_actions), device=device)


def unroll_arrays(rollout: Rollout, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """An actor's unroll as the trajectory's arrays, by name."""
    return {name: logits if name == "logits" else getattr(rollout, name) for name in BATCH_ARRAYS}


class ActorPool:
    """The rollout source of ``--algo impala`` (``rollouts.RolloutSource``): ``actors_per_agent``
    actors where ``--actor-placement`` puts them, and the batch their unrolls fill."""

    def __init__(self, cfg, hp, seed: int, env_threads: int):
        from gossiprl.rl.actor_processes import ActorProcesses

        hp.check_actors()
        self.hp = hp
        placement = {"thread": ActorThreads, "process": ActorProcesses}[hp.actor_placement]
        self.actors = placement(cfg, hp, seed, env_threads)
        self.observation_space, self.action_space = self.actors.observation_space, self.actors.action_space
        self.frames_per_update = hp.n_steps * hp.num_envs * hp.batch_size * self.actors.frames_per_step
        self.episodes: list[tuple[float, int]] = []
        self.taken: list[Trajectory] = []
        """The last batch's trajectories, in the order they fill its columns."""

    def start(self, model: nn.Module, flat_params: torch.Tensor, device: torch.device, stop=None) -> Batch:
        self.flat_params, self.stop = flat_params, stop
        obs_dtype = torch.from_numpy(self.observation_space.sample()).dtype
        self.batch = Batch(
            self.hp.n_steps,
            self.hp.num_envs * self.hp.batch_size,
            self.observation_space.shape,
            obs_dtype,
            device,
            int(self.action_space.n),
        )
        self.actors.start(flat_params, stop)
        return self.batch

    def next(self, version: int) -> dict[str, float] | None:
        """Publish the learner's parameters as ``version``, then wait for ``batch_size`` unrolls; None
        once ``stop`` is set while it waits: actors from elsewhere may all have left, and with none of
        its own (--actors-per-agent 0) the learner waited for ever, until its launcher killed it."""
        self.actors.publish(self.flat_params, version)
        depth = self.actors.depth()
        self.taken = []
        while len(self.taken) < self.hp.batch_size:
            trajectory = self.actors.take(POLL_S)
            if trajectory is not None:
                self.taken.append(trajectory)
            elif self.stop is not None and self.stop.is_set():
                return None
        width = self.hp.num_envs
        for j, trajectory in enumerate(self.taken):
            columns = slice(j * width, (j + 1) * width)
            for name, field in BATCH_ARRAYS.items():
                fill(getattr(self.batch, field)[:, columns], trajectory.arrays[name])
            self.episodes += trajectory.episodes
        lags = [version - trajectory.version for trajectory in self.taken]
        return {
            "impala/policy_lag_mean": sum(lags) / len(lags),
            "impala/policy_lag_max": float(max(lags)),
            "impala/queue_depth": float(depth),
            **{f"impala/{name}_total": float(count) for name, count in self.actors.channel_counts().items()},
        }

    def pop_episodes(self) -> list[tuple[float, int]]:
        episodes, self.episodes = self.episodes, []
        return episodes

    def close(self) -> None:
        self.actors.close()


def fill(dest: torch.Tensor, source) -> None:
    """Copy a trajectory's array (a tensor, or a read-only numpy array off the wire) into ``dest``."""
    if isinstance(source, torch.Tensor):
        dest.copy_(source)
    elif dest.device.type == "cpu":
        dest.numpy()[...] = source
    else:
        dest.copy_(torch.from_numpy(np.array(source)))


# ------------------------------------------------------------------ actors as threads


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
            arrays = unroll_arrays(rollout, logits)
            trajectory = Trajectory(self.index, self.unrolls, version, arrays, self.envs.pop_episodes())
            while not self.stop.is_set():
                try:
                    self.trajectories.put(trajectory, timeout=POLL_S)
                    self.unrolls += 1
                    break
                except queue.Full:
                    continue


class ActorThreads:
    """``--actor-placement thread``: ``actors_per_agent`` actor threads in the learner's process,
    the queue ``trajectories`` and the ``ParameterBoard`` between them and the learner."""

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
        self.frames_per_step = self.envs[0].frames_per_step
        self.trajectories: queue.Queue[Trajectory] = queue.Queue(maxsize=hp.queue_size)
        self.stop = threading.Event()
        self.actors: list[Actor] = []

    def start(self, flat_params: torch.Tensor, stop=None) -> None:
        """``stop`` goes unused: threads are running once started, with no join to wait for."""
        self.board = ParameterBoard(flat_params)
        for a, envs in enumerate(self.envs):
            copy = make_model(self.observation_space, self.action_space)
            actor = Actor(a, envs, copy, self.board, self.trajectories, self.stop, self.hp)
            actor.flat.copy_(self.board.flat)
            self.actors.append(actor)
        for actor in self.actors:
            actor.start()

    def publish(self, flat_params: torch.Tensor, version: int) -> None:
        self.check_actors()
        self.board.publish(flat_params, version)

    def depth(self) -> int:
        return self.trajectories.qsize()

    def channel_counts(self) -> dict[str, int]:
        """Nothing: threads hand their unrolls over in memory, with no channel to refuse or drop."""
        return {}

    def take(self, timeout: float) -> Trajectory | None:
        try:
            return self.trajectories.get(timeout=timeout)
        except queue.Empty:
            self.check_actors()
            return None

    def check_actors(self) -> None:
        for actor in self.actors:
            if actor.error is not None:
                raise ActorFailed(f"{actor.name} failed: {type(actor.error).__name__}: {actor.error}") from actor.error

    def close(self) -> None:
        self.stop.set()
        for actor in self.actors:
            actor.join()
        for envs in self.envs:
            envs.close()
