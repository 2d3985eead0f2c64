"""load_policy and video on real checkpoints written by a short training run."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

import gossiprl
from gossiprl.rl.a2c import A2CConfig
from gossiprl.rl.agent import AgentConfig, load_checkpoint, train
from gossiprl.rl.policy import load_policy, record_videos
from helpers import invoke


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Two independently trained CartPole agents (a few hundred frames each: real checkpoints, fast)."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = AgentConfig(env_id="CartPole-v1", total_frames=400, torch_threads=1, a2c=A2CConfig(num_envs=4))
    for rank in range(2):
        train(replace(cfg, seed=rank + 1), run_dir, rank=rank)
    return run_dir


def test_consensus_is_the_mean_of_the_agents_parameters(run_dir):
    states = [load_checkpoint(run_dir / f"agent-{r}" / "checkpoint.pt")["model"] for r in range(2)]
    consensus = gossiprl.load_policy(run_dir).model.state_dict()
    own = load_policy(run_dir, agent=1).model.state_dict()
    for key in states[0]:
        assert torch.allclose(consensus[key], (states[0][key] + states[1][key]) / 2)
        assert torch.equal(own[key], states[1][key])
    assert not torch.equal(states[0][key], states[1][key])


def test_act_and_predict_take_one_observation_or_a_batch(run_dir):
    policy = load_policy(run_dir, agent="0")
    envs = policy.make_env(num_envs=3, seed=0)
    batch = envs.reset()
    envs.close()
    logits, _ = policy.model(torch.from_numpy(batch))
    greedy = policy.act(batch)
    assert greedy.shape == (3,) and np.array_equal(greedy, logits.argmax(-1).numpy())
    assert policy.act(batch[1]) == greedy[1] and isinstance(policy.act(batch[1]), int)
    actions, state = policy.predict(batch, state="s", episode_start=np.ones(3, bool))
    assert np.array_equal(actions, greedy) and state == "s"
    sampled = {tuple(policy.act(batch, deterministic=False)) for _ in range(50)}
    assert len(sampled) > 1
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        policy.act(np.zeros(3))


def test_bad_run_dir_or_rank_is_one_clear_line(run_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no run dir at"):
        load_policy(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no agent-<rank>/checkpoint.pt"):
        load_policy(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint for agent 7 .* ranks 0, 1"):
        load_policy(run_dir, agent=7)
    with pytest.raises(ValueError, match="'consensus' or a rank"):
        load_policy(run_dir, agent="best")


def test_import_gossiprl_does_not_import_torch():
    code = "import sys, gossiprl; assert 'torch' not in sys.modules; print(callable(gossiprl.load_policy))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_video_is_a_real_mp4(run_dir, tmp_path):
    imageio = pytest.importorskip("imageio.v3", reason="the rl extra's video packages are not installed")
    files = record_videos(load_policy(run_dir), tmp_path, episodes=2)
    assert [f.parent.name for f in files] == ["consensus", "consensus"]
    for path in files:
        assert path.stat().st_size > 0 and path.read_bytes()[4:8] == b"ftyp"
        frame = imageio.imread(path, index=0)
        assert frame.ndim == 3 and frame.shape[2] == 3 and frame.std() > 0


def test_eval_video_writes_an_mp4_per_policy(run_dir, tmp_path, capfd, monkeypatch):
    pytest.importorskip("imageio.v3", reason="the rl extra's video packages are not installed")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)  # a server, a container, ssh without a session
    monkeypatch.delenv("SDL_VIDEODRIVER", raising=False)
    result = invoke("eval", run_dir, "--episodes", 2, "--video", tmp_path)
    assert result.exit_code == 0, result.output
    assert "XDG_RUNTIME_DIR" not in capfd.readouterr().err  # SDL's own, written to fd 2 once per policy
    assert "SDL_VIDEODRIVER" not in os.environ
    for name in ("consensus", "agent-0", "agent-1"):
        assert f"video: 1 episode(s) in {tmp_path / name}" in result.output
        (video,) = (tmp_path / name).glob("*.mp4")
        assert video.read_bytes()[4:8] == b"ftyp"


def test_atari_video_replays_the_training_preprocessing(tmp_path):
    pytest.importorskip("cv2", reason="the rl extra's opencv (gymnasium's Atari preprocessing) is not installed")
    from dataclasses import asdict

    from gossiprl.rl.agent import save_checkpoint
    from gossiprl.rl.envs import make_env
    from gossiprl.rl.models import make_model
    from gossiprl.rl.policy import render_env

    envs = make_env("ALE/Pong-v5", 1, 0)
    trained_on = envs.reset()[0]
    model = make_model(envs.observation_space, envs.action_space)
    envs.close()
    (tmp_path / "run" / "agent-0").mkdir(parents=True)
    save_checkpoint(
        tmp_path / "run" / "agent-0" / "checkpoint.pt",
        {
            "model": model.state_dict(),
            "optimizer": {},
            "recent_returns": [],
            "counters": {"updates": 0, "frames": 0, "episodes": 0, "wall_s": 0.0},
            "config": asdict(AgentConfig(env_id="ALE/Pong-v5")),
        },
    )
    policy = load_policy(tmp_path / "run")
    env = render_env(policy)
    replayed, _ = env.reset(seed=0)
    env.close()
    assert replayed.shape == trained_on.shape == (4, 84, 84) and replayed.dtype == trained_on.dtype
    assert np.array_equal(replayed[:3], trained_on[:3])  # zero padding before the first frame, as in training
    assert np.abs(replayed[3].astype(int) - trained_on[3]).mean() < 1  # Pong's first frame, whatever the no-ops
    (video,) = record_videos(policy, tmp_path / "videos", max_steps=100)
    assert video.stat().st_size > 0 and video.read_bytes()[4:8] == b"ftyp"


PAYLOAD = """
import pathlib
pathlib.Path(__file__).with_name("payload-ran").write_text("the run dir's code ran")
"""


def _run_dir_naming_a_module(tmp_path, monkeypatch):
    """A run dir whose config and checkpoint name env 'payload_19:CartPole-v1', payload_19 bundled beside it."""
    import gymnasium as gym

    from gossiprl.rl.agent import save_checkpoint
    from gossiprl.rl.models import make_model

    (tmp_path / "payload_19.py").write_text(PAYLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = gym.make("CartPole-v1")
    model = make_model(env.observation_space, gym.spaces.Discrete(2))
    config = {"env_id": "payload_19:CartPole-v1"}
    counters = {"updates": 1, "frames": 8, "episodes": 0, "wall_s": 1.0}
    run_dir = tmp_path / "run"
    (run_dir / "agent-0").mkdir(parents=True)
    save_checkpoint(
        run_dir / "agent-0" / "checkpoint.pt",
        {"model": model.state_dict(), "optimizer": {}, "counters": counters, "config": config},
    )
    (run_dir / "config.json").write_text(json.dumps({"agent": config}))
    return run_dir


@pytest.mark.timeout(60)
def test_a_run_dir_never_makes_load_policy_or_eval_import_the_module_it_names(tmp_path, monkeypatch):
    """Issue 19 F12: a run dir whose config said env_id '<rundir>.payload:CartPole-v1' ran its bundled
    code on gossiprl.load_policy and gossiprl eval."""
    run_dir = _run_dir_naming_a_module(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="import_env_module=True"):
        load_policy(run_dir)
    result = invoke("eval", run_dir, "--episodes", 1)
    assert result.exit_code == 1 and "--import-env-module" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "payload-ran").exists(), "the run dir's module was imported"
    policy = load_policy(run_dir, import_env_module=True)  # the caller trusts it and says so
    assert (tmp_path / "payload-ran").exists() and policy.env_id == "payload_19:CartPole-v1"
