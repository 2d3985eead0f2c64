"""`gossiprl bench train`: training frames/s of a swarm against the env's own ceiling, in one run.

The ceiling is the raw vector env stepping the same total number of envs with random actions
and no learning (for Atari: ale-py's C++ AtariVectorEnv, all cores). The swarm is a real
`gossiprl run` (broker, agent processes, gossip every update) cut off after a fixed time;
its rate is the sum of the agents' steady-state frames/s. The ratio says how much of the
simulator's speed the learner, the model and the gossip leave.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..rl.envs import atari_game, is_atari


def raw_ceiling(env_id: str, num_envs: int, seconds: float, threads: int = 0) -> float:
    """Frames/s of the bare vector env with random actions (Atari frames include the skipped ones)."""
    if is_atari(env_id):
        from ale_py.vector_env import AtariVectorEnv

        env = AtariVectorEnv(
            atari_game(env_id), num_envs, num_threads=threads or os.cpu_count() or 1, frameskip=4, reward_clipping=False
        )
        frames_per_step = 4
    else:
        import gymnasium as gym

        env = gym.make_vec(env_id, num_envs, vectorization_mode="sync")
        frames_per_step = 1
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    n = env.single_action_space.n
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, n, size=num_envs))
        steps += 1
    elapsed = time.perf_counter() - start
    env.close()
    return steps * num_envs * frames_per_step / elapsed


def run(swarm, agent_cfg, seconds: float, echo=print) -> dict:
    """Ceiling and swarm (``swarm`` training ``agent_cfg``'s env for ``seconds``), measured back
    to back; returns the figures and their ratio."""
    from .. import launch

    env_id, agents = agent_cfg.env_id, swarm.agents
    total_envs = agents * agent_cfg.a2c.num_envs
    echo(
        f"{env_id}: {agents} agents x {agent_cfg.a2c.num_envs} envs = {total_envs} envs, "
        f"{os.cpu_count()} cores, device {agent_cfg.device}"
    )
    ceiling = raw_ceiling(env_id, total_envs, min(seconds, 20.0))
    echo(f"  raw vector env, random actions      {ceiling:12,.0f} frames/s")
    swarm = replace(swarm, total_frames=10**12, max_seconds=seconds)
    cfg = replace(agent_cfg, log_every=10**9, checkpoint_every=10**9)
    with tempfile.TemporaryDirectory(prefix="gossiprl-bench-") as tmp:
        summary = launch.run(swarm, cfg, Path(tmp) / "run", echo=echo, show_progress=False)
    idle = sorted(set(range(agents)) - {rank for rank, s in summary["per_agent"].items() if s["fps"]})
    if idle:
        raise launch.RunError(
            f"agents {idle} trained no frame within {seconds:g}s (starting up took it all, e.g. on "
            "a loaded machine, or they failed): give --seconds more time"
        )
    agent_fps = sum(s["fps"] for s in summary["per_agent"].values())
    shares = {
        k: float(np.mean([s[f"{k}_share"] for s in summary["per_agent"].values()]))
        for k in ("rollout", "learn", "gossip")
    }
    layout = f"{swarm.topology or 'no gossip'}, {swarm.mode}, {swarm.data_plane}"
    echo(f"  gossiprl training ({layout})  {agent_fps:12,.0f} frames/s")
    echo(f"  ratio to the ceiling                {agent_fps / ceiling:12.1%}")
    echo("  time per agent: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    return {
        "env": env_id,
        "agents": agents,
        "data_plane": swarm.data_plane,
        "envs_per_agent": agent_cfg.a2c.num_envs,
        "seconds": seconds,
        "ceiling_fps": ceiling,
        "train_fps": agent_fps,
        "ratio": agent_fps / ceiling,
        "time_shares": shares,
        "mean_return": summary["mean_return"],
        "cores": os.cpu_count(),
    }
