"""The consensus policy is the plain average of the agents' final parameters, and refuses to
average agents of different envs; the launcher's summary shows per-agent and pooled scores side by side."""

import pytest
import torch

from gossiprl.rl.agent import CheckpointError, save_checkpoint
from gossiprl.rl.consensus import average_checkpoints, evaluate_consensus


def write_checkpoint(path, env_id, weight):
    path.parent.mkdir(parents=True)
    assert save_checkpoint(
        path,
        {
            "model": {"w": torch.full((2, 3), weight), "steps": torch.tensor(4)},
            "optimizer": {},
            "config": {"env_id": env_id},
            "counters": {"updates": 0, "frames": 0, "episodes": 0, "wall_s": 0.0},
        },
    )
    return path


def test_average_is_elementwise_mean_and_keeps_dtypes(tmp_path):
    paths = [
        write_checkpoint(tmp_path / f"agent-{r}" / "checkpoint.pt", "CartPole-v1", w)
        for r, w in enumerate((1.0, 2.0, 6.0))
    ]
    state, config = average_checkpoints(paths)
    assert torch.equal(state["w"], torch.full((2, 3), 3.0))
    assert state["steps"].dtype == torch.int64 and config["env_id"] == "CartPole-v1"


def test_agents_of_different_envs_are_not_averaged(tmp_path):
    paths = [
        write_checkpoint(tmp_path / "agent-0" / "checkpoint.pt", "CartPole-v1", 1.0),
        write_checkpoint(tmp_path / "agent-1" / "checkpoint.pt", "Acrobot-v1", 1.0),
    ]
    with pytest.raises(ValueError, match="only agents of one env"):
        average_checkpoints(paths)
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([])


def test_a_run_dir_without_checkpoints_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint.pt"):
        evaluate_consensus(tmp_path)


def test_a_tampered_checkpoint_is_refused_not_averaged(tmp_path):
    paths = [write_checkpoint(tmp_path / f"agent-{r}" / "checkpoint.pt", "CartPole-v1", 1.0) for r in range(2)]
    state = torch.load(paths[1], weights_only=True)
    state["model"]["w"] += 1e3
    torch.save(state, paths[1])
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        average_checkpoints(paths)
