"""One vector-env interface over two backends: ALE's native AtariVectorEnv and gymnasium.

The learner only ever sees ``reset() -> obs`` and ``step(actions) -> (obs, reward, done)``
with same-step autoreset, so the obs returned with ``done`` is already the next episode's
first frame and no transition crosses an episode boundary. Episode scores are summed here
from the raw rewards, so they are the real game scores whether or not the loss clips.
"""

from __future__ import annotations

import difflib
import importlib
import re

import ale_py
import gymnasium as gym
import numpy as np
from ale_py.vector_env import AtariVectorEnv
from gymnasium.vector import AutoresetMode

from .space_invaders import SpaceInvaders

gym.register_envs(ale_py)

ATARI_FRAMESKIP = 4
"""Emulator frames per agent step; the papers count Atari frames as agent steps x 4."""


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")


MINATAR_PREFIX = "MinAtar/"


def is_minatar(env_id: str) -> bool:
    """MinAtar (10x10 Atari stand-ins: Breakout, SpaceInvaders, Asterix, Freeway, Seaquest),
    the CPU-scale proxy for the papers' Atari games."""
    return env_id.startswith(MINATAR_PREFIX)


def _register_minatar() -> None:
    """MinAtar's gymnasium ids exist only after its own ``register_envs()``; it is an optional
    extra (it pulls pandas, scipy, seaborn), so it is imported on first use of one of its ids."""
    if "MinAtar/Breakout-v1" in gym.registry:  # registered already (registering twice only warns)
        return
    try:
        from minatar.gym import register_envs
    except ImportError:
        raise ValueError("MinAtar ids need the minatar package: pip install 'gossiprl[minatar]'") from None
    register_envs()


def atari_game(env_id: str) -> str:
    """ALE ROM name for an id: ``ALE/MsPacman-v5`` and ``MsPacmanNoFrameskip-v4`` -> ``ms_pacman``."""
    name = env_id.removeprefix("ALE/").split("-v")[0].removesuffix("NoFrameskip")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _unknown(env_id: str) -> ValueError:
    return ValueError(
        f"unknown env id {env_id!r}: use a gymnasium registry id (e.g. 'CartPole-v1', 'Acrobot-v1') "
        f"or an Atari id (e.g. 'ALE/Pong-v5', 'BreakoutNoFrameskip-v4') "
        f"or a MinAtar id (e.g. 'MinAtar/Breakout-v1'), or MODULE:ENV_ID for an env that MODULE registers"
        + _did_you_mean(env_id)
    )


def _did_you_mean(env_id: str) -> str:
    """``"; did you mean 'CartPole-v1'?"`` for a near miss of an id a run accepts, else ``""``."""
    if "minatar" in env_id.lower():  # its ids exist only once the (optional) package registers them
        try:
            _register_minatar()
        except ValueError:
            pass
    accepted = [i for i, spec in gym.registry.items() if is_atari(i) or not str(spec.entry_point).startswith("ale_py")]
    close = difflib.get_close_matches(env_id, accepted, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def registered_id(env_id: str) -> str:
    """gymnasium's ``module:EnvId`` form: import the module that registers EnvId, return EnvId.

    Agents of ``gossiprl run`` are fresh (spawned) processes, so an env that the user's own code
    registers must be registered again in each of them; naming the module in the id does that
    wherever the id travels (launcher, agents, eval, load_policy, a resumed run's config.json).
    The name comes from the user's command line or config, never from a socket, and must be a
    dotted Python name of a module already installed or on PYTHONPATH.
    """
    module, sep, name = env_id.rpartition(":")
    if not sep:
        return env_id
    if not MODULE_NAME.fullmatch(module):
        raise ValueError(
            f"{module!r} in env id {env_id!r} is not a Python module name; give MODULE:ENV_ID, e.g. 'my_envs:Maze-v0'"
        )
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ValueError(
            f"cannot import {module!r}, the module env id {env_id!r} names to register "
            f"{name!r}: {err} (is it installed, or on PYTHONPATH?)"
        ) from None
    return name


def env_spec(env_id: str) -> float | None:
    """Check that ``env_id`` can be made, without making it; return its solve threshold.

    The threshold is gymnasium's ``reward_threshold`` (475 for CartPole-v1); Atari games have
    none, so a run on them stops at its frame budget unless told otherwise.
    """
    env_id = registered_id(env_id)
    if is_atari(env_id):
        if atari_game(env_id) not in ale_py.roms.get_all_rom_ids():
            raise _unknown(env_id)
        return None
    if is_minatar(env_id):
        _register_minatar()
    spec = gym.registry.get(env_id)
    if spec is None:
        raise _unknown(env_id)
    if str(spec.entry_point).startswith("ale_py"):
        raise ValueError(
            f"{env_id!r} is ALE without the DeepMind preprocessing; use 'ALE/<Game>-v5' or '<Game>NoFrameskip-v4'"
        )
    return spec.reward_threshold


class VecEnv:
    """A gymnasium VectorEnv in same-step autoreset mode, plus episode bookkeeping."""

    def __init__(self, env: gym.vector.VectorEnv, frames_per_step: int, seed: int):
        self.env = env
        self.num_envs = env.num_envs
        self.observation_space = env.single_observation_space
        self.action_space = env.single_action_space
        self.frames_per_step = frames_per_step
        """Frames counted per env per step (4 on Atari, see ATARI_FRAMESKIP)."""
        self._seed = seed
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._finished: list[tuple[float, int]] = []

    def reset(self) -> np.ndarray:
        """Reset all envs; the first reset takes the seed, later ones continue the seeded RNGs."""
        obs, _ = self.env.reset(seed=self._seed)
        self._seed = None
        self._returns[:] = 0
        self._lengths[:] = 0
        return obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """obs, reward, done, and the envs cut by a time limit as (indices, their final obs).

        A time limit is not a terminal state: the learner must bootstrap those episodes
        from V(final obs) instead of cutting the return to zero. Treating CartPole's
        500-step limit as a failure teaches the critic that standing up for long is bad,
        and the policy collapses just as it gets good.
        """
        obs, reward, terminated, truncated, info = self.env.step(actions)
        done = terminated | truncated
        cut = np.flatnonzero(truncated & ~terminated)
        final_obs = np.stack([info["final_obs"][i] for i in cut]) if len(cut) else obs[:0]
        self._returns += reward
        self._lengths += 1
        if done.any():
            for i in np.flatnonzero(done):
                self._finished.append((float(self._returns[i]), int(self._lengths[i])))
            self._returns[done] = 0
            self._lengths[done] = 0
        return obs, reward, done, (cut, final_obs)

    def pop_episodes(self) -> list[tuple[float, int]]:
        """(return, length in agent steps) of every episode finished since the last call."""
        finished, self._finished = self._finished, []
        return finished

    def close(self) -> None:
        self.env.close()


BATCHED_GAMES = {"space_invaders": SpaceInvaders}
"""MinAtar games stepped as one numpy batch (MinAtar's name for the game: its batch class)."""


def steps_batched(env_id: str) -> bool:
    """Whether ``env_id`` is a MinAtar game that ``make_env`` steps as one batch."""
    env_spec(env_id)  # registers MinAtar's ids, and says what is valid if this one is not
    env_id = registered_id(env_id)
    return is_minatar(env_id) and gym.registry[env_id].kwargs["game"] in BATCHED_GAMES


class MinAtarVectorEnv:
    """MinAtar's games with gymnasium's same-step autoreset semantics.

    It is what ``gym.make_vec(id, vectorization_mode="sync")`` computes, seeds included (env i's
    RNG is seeded with seed + i on the first reset and continues after), without the per-env
    checker and order-enforcing wrappers and per-step copies: stepping 16 Breakout envs took
    0.32 ms there and 0.14 ms here, about a tenth of the agent's time at 16 envs x 5 steps.
    SpaceInvaders, whose game costs several times Breakout's, steps all its envs as one numpy
    batch (``space_invaders.SpaceInvaders``, MinAtar's rules unchanged) unless ``batched`` is False;
    the other games step one by one in MinAtar's own code.
    """

    def __init__(self, spec_kwargs: dict, num_envs: int, batched: bool = True):
        from minatar import Environment

        kwargs = dict(spec_kwargs)
        game, minimal = kwargs.pop("game"), kwargs.pop("use_minimal_action_set", False)
        first = Environment(env_name=game, **kwargs)
        if batched and game in BATCHED_GAMES:
            self.games = BATCHED_GAMES[game](num_envs, **kwargs)
        else:
            self.games = OneByOne([first] + [Environment(env_name=game, **kwargs) for _ in range(num_envs - 1)])
        self.num_envs = num_envs
        self.action_set = np.array(first.minimal_action_set() if minimal else range(first.num_actions()))
        self.single_action_space = gym.spaces.Discrete(len(self.action_set))
        self.single_observation_space = gym.spaces.Box(0.0, 1.0, shape=first.state_shape(), dtype=bool)
        self._obs = np.zeros((num_envs, *first.state_shape()), dtype=bool)
        self._empty = self._obs[:0]

    def reset(self, seed: int | None = None):
        if seed is not None:
            for i in range(self.num_envs):
                self.games.seed(i, seed + i)
        self.games.reset(np.arange(self.num_envs))
        self.games.state(self._obs)
        return self._obs.copy(), {}

    def step(self, actions: np.ndarray):
        rewards, terminated = self.games.act(self.action_set[actions])
        self.games.reset(np.flatnonzero(terminated))
        self.games.state(self._obs)
        return self._obs.copy(), rewards, terminated, np.zeros_like(terminated), {"final_obs": self._empty}

    def close(self) -> None:
        self.games = None


class OneByOne:
    """MinAtar ``Environment`` s behind ``SpaceInvaders``' batch interface, stepped in a loop."""

    def __init__(self, games: list):
        self.games = games

    def seed(self, i: int, seed: int) -> None:
        self.games[i].seed(seed)

    def reset(self, envs: np.ndarray) -> None:
        for i in envs:
            self.games[i].reset()

    def act(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rewards = np.zeros(len(self.games), dtype=np.float64)
        terminated = np.zeros(len(self.games), dtype=bool)
        for i, (game, action) in enumerate(zip(self.games, actions)):
            rewards[i], terminated[i] = game.act(action)
        return rewards, terminated

    def state(self, out: np.ndarray) -> None:
        for i, game in enumerate(self.games):
            out[i] = game.state()


def make_env(
    env_id: str, num_envs: int, seed: int, *, sticky_actions: float = 0.0, num_threads: int = 0, batched: bool = True
) -> VecEnv:
    """Build ``num_envs`` copies of ``env_id``; env i is seeded with ``seed + i``.

    Atari follows the DeepMind protocol the papers use (30 no-op starts, frameskip 4 with
    max-pooling, 84x84 grayscale, 4-frame stack, full episodes) but leaves rewards unclipped:
    the A2C loss clips, and the logged scores stay real. ``sticky_actions`` is ALE's
    repeat_action_probability (0 as in the papers, 0.25 for the v5 protocol). ``num_threads``
    bounds ALE's worker threads so several agents on one host do not oversubscribe the cores.
    ``batched`` False steps a batched MinAtar game (``BATCHED_GAMES``) in MinAtar's own loop: the
    same frames, slower; benchmarks and tests compare the two.
    """
    env_spec(env_id)
    env_id = registered_id(env_id)
    if is_atari(env_id):
        env = AtariVectorEnv(
            atari_game(env_id),
            num_envs,
            num_threads=num_threads,
            repeat_action_probability=sticky_actions,
            autoreset_mode=AutoresetMode.SAME_STEP,
            img_height=84,
            img_width=84,
            grayscale=True,
            stack_num=4,
            frameskip=ATARI_FRAMESKIP,
            maxpool=True,
            noop_max=30,
            episodic_life=False,
            reward_clipping=False,
        )
        return VecEnv(env, ATARI_FRAMESKIP, seed)
    if sticky_actions:
        raise ValueError(f"sticky_actions applies to Atari only, not {env_id!r}")
    if is_minatar(env_id):
        return VecEnv(MinAtarVectorEnv(gym.registry[env_id].kwargs, num_envs, batched), 1, seed)
    try:
        env = gym.make_vec(
            env_id, num_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}
        )
    except gym.error.Error as e:
        raise _unknown(env_id) from e
    return VecEnv(env, 1, seed)
