"""evaluate and plot_runs on a hand-made run dir, so they are checked without training anything."""

import csv
import json
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import pytest
import torch

from gossiprl.draw import _mean_curve, plot_runs
from gossiprl.rl import evaluate as evaluate_module
from gossiprl.rl.agent import METRIC_COLUMNS, AgentConfig, save_checkpoint
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


def write_metrics(agent_dir, rows):
    agent_dir.mkdir(parents=True, exist_ok=True)
    with open(agent_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, METRIC_COLUMNS)
        writer.writeheader()
        for frames, wall_s, ret in rows:
            writer.writerow(
                {
                    "frames": frames,
                    "wall_s": wall_s,
                    "updates": frames // 80,
                    "episodic_return": "" if ret is None else ret,
                    "mean_return_100": "" if ret is None else ret,
                }
            )


def test_plot_runs_writes_a_png(tmp_path):
    gala = tmp_path / "gala"
    write_metrics(gala / "agent-0", [(800, 1.0, None), (1600, 2.0, 15.0), (2400, 3.0, 20.0), (3200, 4.0, 30.0)])
    # agent-1 logs at other frames and was resumed from 1200 after logging up to 2000
    write_metrics(gala / "agent-1", [(1200, 1.5, 12.0), (2000, 2.5, 99.0), (1600, 2.1, 16.0), (2800, 3.5, 26.0)])
    (gala / "config.json").write_text(
        json.dumps(
            {"swarm": {"agents": 2, "topology": "ring", "mode": "async"}, "agent": {}, "topology": {"name": "ring"}}
        )
    )
    single = tmp_path / "a2c"
    write_metrics(single / "agent-0", [(800, 0.5, 10.0), (1600, 1.0, 14.0)])
    out = tmp_path / "curves.png"
    plot_runs([gala, single], out, smooth=2)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_agents_logged_at_different_frames_are_averaged_where_all_reached():
    a = np.array([[0, 0, 0.0], [10, 1, 10.0], [20, 2, 20.0]])
    b = np.array([[5, 0, 0.0], [15, 1, 0.0], [30, 3, 0.0]])
    x, y = _mean_curve([a, b], 0, smooth=1, scale=2)
    assert x.tolist() == [10, 20, 30, 40]  # frames 5..20, charged for both agents
    assert y.tolist() == [2.5, 5.0, 7.5, 10.0]


def test_plot_runs_without_metrics_names_the_run(tmp_path):
    (tmp_path / "empty" / "agent-0").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="metrics.csv") as err:
        plot_runs([tmp_path / "empty"], tmp_path / "x.png")
    assert str(tmp_path / "empty") in str(err.value)
    assert not (tmp_path / "x.png").exists()
