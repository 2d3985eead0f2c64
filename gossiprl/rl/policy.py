"""A trained swarm's policy as an object a user can call, without knowing how runs are laid out.

``load_policy(run_dir)`` gives the consensus policy (the plain average of every agent's final
parameters: gossip drives the agents towards it, so it is the one policy to deploy after a
decentralised run); ``load_policy(run_dir, agent=3)`` gives one agent's own. Checkpoints are
read through ``agent.load_checkpoint`` (weights only, checked against their SHA-256 for
corruption): a run directory may come from anywhere, and nothing in it is executed, nor any
module it names imported unless the caller says so (``import_env_module``).

Observations are what ``gossiprl.rl.envs.make_env`` yields for the run's env (on Atari: 4 stacked
84x84 grayscale frames); ``Policy.make_env`` builds that env. ``record_videos`` plays episodes
into MP4s through gymnasium's RecordVideo.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from gossiprl.rl.agent import load_checkpoint
from gossiprl.rl.envs import ATARI_FRAMESKIP, atari_game, env_spec, is_atari, make_env
from gossiprl.rl.evaluate import _find_checkpoints, check_env_module
from gossiprl.rl.models import make_model


class Policy:
    """``act`` for plain use, ``predict`` in Stable-Baselines3's shape for code written against it."""

    def __init__(
        self,
        model: torch.nn.Module,
        env_id: str,
        observation_space: gym.Space,
        name: str,
        config: dict,
        device: str = "cpu",
    ):
        self.model = model.to(device).eval()
        self.env_id = env_id
        self.observation_space = observation_space
        self.name = name
        """'consensus' or 'agent-<rank>'."""
        self.config = config
        self.device = device

    @torch.inference_mode()
    def act(self, obs, deterministic: bool = True, generator: torch.Generator | None = None):
        """The action for one observation (an int), or an array of actions for a batch.

        Greedy by default, as a deployed policy is usually run; ``deterministic=False`` samples
        from the policy, which is how it was trained and how ``gossiprl eval`` scores it.
        """
        obs = np.asarray(obs, dtype=self.observation_space.dtype)
        single = obs.shape == self.observation_space.shape
        if not single and obs.shape[1:] != self.observation_space.shape:
            raise ValueError(
                f"{self.name} takes observations of shape {self.observation_space.shape} "
                f"(or a batch of them), got {obs.shape}"
            )
        batch = torch.from_numpy(np.ascontiguousarray(obs[None] if single else obs)).to(self.device)
        logits, _ = self.model(batch)
        logits = logits.float().cpu()
        if deterministic:
            actions = logits.argmax(-1)
        else:
            actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(1)
        actions = actions.numpy()
        return int(actions[0]) if single else actions

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = True):
        """(actions, state) as SB3's ``predict``; the policy is feed-forward, so state passes through."""
        return np.asarray(self.act(observation, deterministic=deterministic)), state

    def make_env(self, num_envs: int = 1, seed: int = 0):
        """The vector env this policy was trained on, preprocessed alike (gossiprl's VecEnv)."""
        return make_env(self.env_id, num_envs, seed, sticky_actions=self.config.get("sticky_actions", 0.0))

    def __repr__(self) -> str:
        return f"Policy({self.name} on {self.env_id})"


def load_policy(
    run_dir: str | os.PathLike, agent: str | int = "consensus", device: str = "cpu", import_env_module: bool = False
) -> Policy:
    """The consensus policy of a run (``agent="consensus"``, the default) or agent ``rank``'s own.

    The env comes from the run's config.json when there is one (a ``gossiprl run``), else from
    the checkpoints (agents of a ``gossiprl agent`` swarm write only their own); every averaged
    checkpoint must have been trained on that env. An env id of the form MODULE:ENV_ID is refused
    unless ``import_env_module`` or MODULE is already imported (``evaluate.check_env_module``).
    """
    checkpoints = _find_checkpoints(Path(run_dir))
    if agent == "consensus":
        paths, name = list(checkpoints.values()), "consensus"
    else:
        try:
            rank = int(agent)
        except (TypeError, ValueError):
            raise ValueError(f"agent must be 'consensus' or a rank, got {agent!r}") from None
        if rank not in checkpoints:
            raise FileNotFoundError(
                f"no checkpoint for agent {rank} in {run_dir}: it has ranks {', '.join(map(str, checkpoints))}"
            )
        paths, name = [checkpoints[rank]], f"agent-{rank}"
    states = [load_checkpoint(p) for p in paths]
    env_id = _run_env_id(Path(run_dir)) or states[0]["config"]["env_id"]
    for path, state in zip(paths, states):
        if state["config"]["env_id"] != env_id:
            raise ValueError(
                f"{path} was trained on {state['config']['env_id']}, not {env_id}: only agents of one env make a policy"
            )
    check_env_module(env_id, run_dir, import_env_module)
    envs = make_env(env_id, 1, 0, sticky_actions=states[0]["config"].get("sticky_actions", 0.0))
    observation_space, action_space = envs.observation_space, envs.action_space
    envs.close()
    model = make_model(observation_space, action_space)
    model.load_state_dict(average_state_dicts([s["model"] for s in states]))
    return Policy(model, env_id, observation_space, name, states[0]["config"], device)


def average_state_dicts(states: list[dict]) -> dict:
    """The element-wise mean of model state dicts of one architecture (the consensus parameters)."""
    return {key: torch.stack([s[key].float() for s in states]).mean(0).to(states[0][key].dtype) for key in states[0]}


def _run_env_id(run_dir: Path) -> str | None:
    path = run_dir / "config.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())["agent"]["env_id"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a gossiprl run config ({type(err).__name__}: {err})") from None


def render_env(policy: Policy) -> gym.Env:
    """One env that renders RGB frames and yields the observations the policy was trained on.

    Training envs are vectorised (ALE's native vector env on Atari) and cannot render, so video
    replays through a single gymnasium env with the same preprocessing.
    """
    env_spec(policy.env_id)
    if not is_atari(policy.env_id):
        return gym.make(policy.env_id, render_mode="rgb_array")
    env = gym.make(
        f"ALE/{atari_game(policy.env_id).title().replace('_', '')}-v5",
        render_mode="rgb_array",
        frameskip=1,
        repeat_action_probability=policy.config.get("sticky_actions", 0.0),
    )
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=ATARI_FRAMESKIP, screen_size=84, grayscale_obs=True, terminal_on_life_loss=False
    )
    return gym.wrappers.FrameStackObservation(env, 4, padding_type="zero")  # as AtariVectorEnv pads


def record_videos(
    policy: Policy,
    video_dir: str | os.PathLike,
    episodes: int = 1,
    seed: int = 12345,
    deterministic: bool = False,
    max_steps: int = 27_000,
) -> list[Path]:
    """Play ``episodes`` episodes into ``video_dir/<policy name>/*.mp4``; returns the files written.

    Sampled actions by default, as ``gossiprl eval`` scores the policy; ``max_steps`` caps an
    episode of an env with no time limit (the 27,000 steps ALE's own cap means).
    """
    out = Path(video_dir) / policy.name
    driver = os.environ.get("SDL_VIDEODRIVER")
    if driver is None:  # frames are drawn off-screen: without a display SDL printed an XDG_RUNTIME_DIR error per policy
        os.environ["SDL_VIDEODRIVER"] = "dummy"
    try:
        env = gym.wrappers.RecordVideo(
            render_env(policy), str(out), episode_trigger=lambda _: True, name_prefix=policy.name, disable_logger=True
        )
        generator = torch.Generator()
        generator.manual_seed(seed)
        try:
            for episode in range(episodes):
                obs, _ = env.reset(seed=seed + episode)
                for _ in range(max_steps):
                    obs, _, terminated, truncated, _ = env.step(policy.act(obs, deterministic, generator))
                    if terminated or truncated:
                        break
        finally:
            env.close()  # pygame quits here, so a later window of this process reads SDL_VIDEODRIVER afresh
    finally:
        if driver is None:
            del os.environ["SDL_VIDEODRIVER"]
    return sorted(out.glob("*.mp4"))
