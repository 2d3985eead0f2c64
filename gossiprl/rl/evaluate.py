"""Score the final policy of every agent of a run, the way the papers' Table 1 does.

Training curves mix many policies (the one at each update) and, on Atari, use exploration
that the final policy may not need; the number a paper reports is the final policy's mean
+- std over a fixed count of fresh episodes. This module replays each agent's last
checkpoint for exactly that count, in a fresh env built from the checkpoint's own config,
so it needs nothing from the run but ``agent-<rank>/checkpoint.pt``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from gossiprl.rl.agent import load_checkpoint
from gossiprl.rl.envs import VecEnv, is_atari, make_env
from gossiprl.rl.models import make_model

UNLIMITED_EPISODE_STEPS = 27_000
"""Steps after which an episode of an env with no time limit of its own is cut short.

Without it a policy that learned to stall (or an env that never terminates) would hang the
evaluation forever. 27,000 steps is what ALE's own 108,000-frame cap means at frameskip 4, so
every env gets the same 30-minute-of-play ceiling. Atari and time-limited gymnasium envs
(almost all of them) end their episodes themselves and are never cut."""

_CHECKPOINT_DIR = re.compile(r"agent-(\d+)")


def check_env_module(env_id: str, source, allowed: bool) -> None:
    """Refuse an env id read from a run directory that would import a module (``MODULE:ENV_ID``).

    A run directory may come from anywhere, and is data: a config naming ``<rundir>.payload:CartPole-v1``
    ran the code bundled with it on ``load_policy`` and ``gossiprl eval``. A module already imported
    by the caller costs nothing to name; any other is imported only when the caller says so.
    """
    module, sep, _ = env_id.rpartition(":")
    if sep and not allowed and module not in sys.modules:
        raise ValueError(
            f"{source} names env id {env_id!r}, which would import module {module!r} to register its env; "
            "a run directory is data, so nothing it names is imported unless you trust it and say so: "
            "import_env_module=True (gossiprl eval --import-env-module), or import the module yourself first"
        )


def evaluate(
    run_dir: str | os.PathLike,
    episodes: int = 10,
    greedy: bool = False,
    device: str = "cpu",
    seed: int = 12345,
    num_envs: int | None = None,
    import_env_module: bool = False,
) -> dict:
    """Play ``episodes`` complete episodes with each agent's final policy; mean +- std.

    Actions are sampled from the policy by default because that is the policy the papers
    train and report; ``greedy`` takes the argmax, which can score higher or lock into loops.
    Every agent gets the same env seeds (``seed``, ``seed + 1``, ...) and action-sampling
    seed, so differences between agents come from their weights, not from luck of the draw.

    Episodes run ``min(episodes, num_envs or 8)`` at a time in a vector env. Counting whichever episodes
    finish first would favour short ones (in CartPole, the failures), so each env slot
    instead owns a fixed quota of episodes, decided before play: slot i plays its first
    ``episodes // n (+1 for the first episodes % n slots)`` episodes and anything it plays
    after that is ignored while the other slots finish.

    std is the population std (ddof=0), so one episode gives 0 rather than NaN. An env id of the
    form MODULE:ENV_ID is refused unless ``import_env_module`` (see ``check_env_module``).
    Returns ``{"agents": {rank: {"mean", "std", "returns", "frames"}}, "overall": {"mean",
    "std", "episodes"}, "protocol": str}``; ``frames`` is how long that agent had trained.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if num_envs is not None and num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    checkpoints = _find_checkpoints(Path(run_dir))
    slots = min(num_envs or 8, episodes)
    generator = torch.Generator()
    agents: dict[int, dict] = {}
    env_ids: set[str] = set()
    # A batch of <= 8 observations gains nothing from intra-op threads, and beside ALE's
    # worker threads they made the Nature CNN ~100x slower (120 ms a step, 2 loaded cores);
    # the caller's thread count is restored on the way out.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for rank, path in checkpoints.items():
            env_id, agents[rank] = _evaluate_checkpoint(
                path, episodes, greedy, device, seed, slots, generator, import_env_module
            )
            env_ids.add(env_id)
    finally:
        torch.set_num_threads(threads)

    pooled = [r for agent in agents.values() for r in agent["returns"]]
    protocol = (
        f"final checkpoint of each of {len(agents)} agent(s) on {', '.join(sorted(env_ids))}: "
        f"{episodes} complete episodes per agent, {'greedy (argmax)' if greedy else 'sampled'} "
        f"actions, {slots} env(s) each playing a fixed quota of episodes, env seeds "
        f"{seed}..{seed + slots - 1}, unclipped returns; mean +- population std over episodes"
    )
    return {
        "agents": agents,
        "overall": {"mean": float(np.mean(pooled)), "std": float(np.std(pooled)), "episodes": len(pooled)},
        "protocol": protocol,
    }


def _find_checkpoints(run_dir: Path) -> dict[int, Path]:
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run dir at {run_dir}: expected a directory holding agent-<rank>/checkpoint.pt")
    found = {
        int(m.group(1)): p
        for p in run_dir.glob("agent-*/checkpoint.pt")
        if (m := _CHECKPOINT_DIR.fullmatch(p.parent.name))
    }
    if not found:
        raise FileNotFoundError(
            f"no agent-<rank>/checkpoint.pt under {run_dir}: "
            f"train into it first (a checkpoint is written at the end of training)"
        )
    return dict(sorted(found.items()))


def _evaluate_checkpoint(
    path: Path,
    episodes: int,
    greedy: bool,
    device: str,
    seed: int,
    slots: int,
    generator: torch.Generator,
    import_env_module: bool,
) -> tuple[str, dict]:
    """A fresh env per agent, seeded alike, so every agent meets the same start states."""
    checkpoint = load_checkpoint(path)
    config = checkpoint["config"]
    env_id = config["env_id"]
    check_env_module(env_id, path, import_env_module)
    envs = make_env(env_id, slots, seed, sticky_actions=config.get("sticky_actions", 0.0))
    try:
        model = make_model(envs.observation_space, envs.action_space)
        model.load_state_dict(checkpoint["model"])
        model.to(device).eval()
        generator.manual_seed(seed)
        returns = _play(model, envs, episodes, greedy, device, generator, _step_cap(env_id))
    finally:
        envs.close()
    return env_id, {
        "mean": float(np.mean(returns)),
        "std": float(np.std(returns)),
        "returns": returns,
        "frames": int(checkpoint["counters"]["frames"]),
    }


def _step_cap(env_id: str) -> int | None:
    if is_atari(env_id):
        return None
    spec = gym.registry.get(env_id)
    return UNLIMITED_EPISODE_STEPS if spec is None or spec.max_episode_steps is None else None


@torch.inference_mode()
def _play(
    model: torch.nn.Module,
    envs: VecEnv,
    episodes: int,
    greedy: bool,
    device: str,
    generator: torch.Generator,
    step_cap: int | None,
) -> list[float]:
    """Returns summed here from the raw step rewards rather than taken from
    ``pop_episodes``, because the quota needs to know which slot each episode came from."""
    n = envs.num_envs
    quota = [episodes // n + (i < episodes % n) for i in range(n)]
    finished: list[list[float]] = [[] for _ in range(n)]
    running = np.zeros(n, dtype=np.float64)
    steps = np.zeros(n, dtype=np.int64)
    obs = envs.reset()
    while any(len(slot) < q for slot, q in zip(finished, quota)):
        logits, _ = model(torch.from_numpy(obs).to(device))
        logits = logits.float().cpu()
        if greedy:
            actions = logits.argmax(-1)
        else:
            # sampled on the CPU with our own generator: same actions on any device, and the
            # caller's global torch RNG is left alone
            actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(1)
        obs, reward, done, _ = envs.step(actions.numpy())
        running += reward
        steps += 1
        if step_cap is not None and (cut := (steps >= step_cap) & ~done).any():
            # a time limit the env lacks, applied the way gymnasium's TimeLimit would:
            # the cut episode counts with the return it reached, and only that env restarts
            obs, _ = envs.env.reset(options={"reset_mask": cut})
            done = done | cut
        for i in np.flatnonzero(done):
            if len(finished[i]) < quota[i]:
                finished[i].append(float(running[i]))
        running[done] = 0
        steps[done] = 0
    return [r for slot in finished for r in slot]
