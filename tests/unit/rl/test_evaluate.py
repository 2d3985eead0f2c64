"""evaluate on a hand-made run dir, so it is checked without training anything."""

import json
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import pytest
import torch

from gossiprl.rl import evaluate as evaluate_module
from gossiprl.rl.agent import AgentConfig, save_checkpoint
from gossiprl.rl.envs import make_env
from gossiprl.rl.evaluate import evaluate
from gossiprl.rl.models import make_model

ENDLESS = "gossiprl-test/Endless-v0"


class Endless(gym.Env):
    """Reward 1 a step, never terminates, and registered with no time limit."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, False, False, {}


if ENDLESS not in gym.registry:
    gym.register(ENDLESS, entry_point=Endless)


def write_checkpoint(agent_dir, env_id="CartPole-v1", frames=1000, always_right=False):
    """A checkpoint with agent.py's keys. ``always_right`` tilts an untrained policy slightly
    towards action 1: argmax then always pushes right (CartPole falls in ~10 steps) while
    sampling stays close to a coin flip."""
    envs = make_env(env_id, 1, 0)
    model = make_model(envs.observation_space, envs.action_space)
    envs.close()
    if always_right:
        with torch.no_grad():
            model.actor[-1].weight.zero_()
            model.actor[-1].bias.copy_(torch.tensor([0.0, 0.05]))
    agent_dir.mkdir(parents=True)
    save_checkpoint(
        agent_dir / "checkpoint.pt",
        {
            "model": model.state_dict(),
            "optimizer": {},
            "counters": {"updates": frames // 80, "frames": frames, "episodes": 40, "wall_s": 12.5},
            "recent_returns": [20.0, 22.0],
            "config": asdict(AgentConfig(env_id=env_id)),
        },
    )


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "ring-2"
    write_checkpoint(run / "agent-0", frames=1000)
    write_checkpoint(run / "agent-1", frames=1200, always_right=True)
    return run


@pytest.mark.parametrize("episodes", [3, 11])
def test_each_agent_plays_exactly_the_episodes_asked(run_dir, episodes):
    result = evaluate(run_dir, episodes=episodes)
    assert sorted(result["agents"]) == [0, 1]
    pooled = []
    for rank, frames in [(0, 1000), (1, 1200)]:
        agent = result["agents"][rank]
        returns = agent["returns"]
        assert len(returns) == episodes
        assert all(r > 0 and float(r).is_integer() for r in returns)  # CartPole pays 1 per step
        assert agent["mean"] == pytest.approx(np.mean(returns))
        assert agent["std"] == pytest.approx(np.std(returns))
        assert agent["frames"] == frames
        pooled += returns
    assert result["overall"] == pytest.approx(
        {"mean": np.mean(pooled), "std": np.std(pooled), "episodes": 2 * episodes}
    )
    assert f"{episodes} complete episodes" in result["protocol"]
    json.dumps(result)  # the CLI prints it with --json


def test_greedy_takes_the_argmax_and_seeds_make_it_repeatable(run_dir):
    greedy = evaluate(run_dir, episodes=6, greedy=True)["agents"][1]["returns"]
    sampled = evaluate(run_dir, episodes=6)["agents"][1]["returns"]
    assert max(greedy) <= 12 < np.mean(sampled)  # always pushing right topples the pole at once
    assert evaluate(run_dir, episodes=6)["agents"][1]["returns"] == sampled
    assert evaluate(run_dir, episodes=6, seed=7)["agents"][1]["returns"] != sampled


def test_env_without_time_limit_is_cut_at_the_safety_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate_module, "UNLIMITED_EPISODE_STEPS", 25)
    write_checkpoint(tmp_path / "agent-0", env_id=ENDLESS)
    assert evaluate(tmp_path, episodes=3, num_envs=2)["agents"][0]["returns"] == [25.0, 25.0, 25.0]


def test_missing_checkpoints_give_one_line_naming_the_path(tmp_path):
    (tmp_path / "agent-0").mkdir()
    for where in (tmp_path, tmp_path / "nowhere"):
        with pytest.raises(FileNotFoundError) as err:
            evaluate(where)
        assert str(where) in str(err.value) and "checkpoint.pt" in str(err.value)
        assert "\n" not in str(err.value)
