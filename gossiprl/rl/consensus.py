"""The consensus policy: the plain average of every agent's final parameters, and its score.

Gossip drives the agents towards that average; it is the one policy a user would deploy
after a decentralised run, so it is judged on its own, beside each agent. For independent
agents (no gossip) the average of unrelated networks is usually worse than any of them,
which is exactly what the comparison should show.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from gossiprl.rl.agent import load_checkpoint
from gossiprl.rl.envs import make_env
from gossiprl.rl.evaluate import _find_checkpoints, _play, _step_cap, check_env_module
from gossiprl.rl.models import make_model
from gossiprl.rl.policy import average_state_dicts


def average_checkpoints(paths: list[Path]) -> tuple[dict, dict]:
    """(averaged model state dict, config of the first checkpoint); every agent must share one env and network.

    Checkpoints are read through agent.load_checkpoint, so a corrupt file is refused
    by name rather than averaged in."""
    if not paths:
        raise ValueError("no checkpoints to average")
    checkpoints = [load_checkpoint(path) for path in paths]
    config = checkpoints[0]["config"]
    for path, checkpoint in zip(paths, checkpoints):
        if checkpoint["config"]["env_id"] != config["env_id"]:
            raise ValueError(
                f"{path} was trained on {checkpoint['config']['env_id']}, not {config['env_id']}: "
                f"only agents of one env can be averaged"
            )
    return average_state_dicts([checkpoint["model"] for checkpoint in checkpoints]), config


def evaluate_consensus(
    run_dir: str | os.PathLike | list[Path],
    episodes: int = 10,
    greedy: bool = False,
    device: str = "cpu",
    seed: int = 12345,
    num_envs: int | None = None,
    import_env_module: bool = False,
) -> dict:
    """Play ``episodes`` episodes with the agents' averaged parameters, under the same protocol
    (env seeds, per-slot quotas, sampled actions) as ``evaluate.evaluate`` plays each agent.

    ``run_dir`` is a run directory, or an explicit list of checkpoint paths (independent
    agents trained in separate run dirs). Returns ``{"mean", "std", "returns", "agents"}``.
    ``import_env_module``: as ``evaluate.check_env_module`` says.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    paths = list(run_dir) if isinstance(run_dir, list) else list(_find_checkpoints(Path(run_dir)).values())
    state, config = average_checkpoints(paths)
    check_env_module(config["env_id"], paths[0], import_env_module)
    slots = min(num_envs or 8, episodes)
    envs = make_env(config["env_id"], slots, seed, sticky_actions=config.get("sticky_actions", 0.0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = make_model(envs.observation_space, envs.action_space)
        model.load_state_dict(state)
        model.to(device).eval()
        generator = torch.Generator()
        generator.manual_seed(seed)
        returns = _play(model, envs, episodes, greedy, device, generator, _step_cap(config["env_id"]))
    finally:
        torch.set_num_threads(threads)
        envs.close()
    return {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "returns": returns, "agents": len(paths)}
