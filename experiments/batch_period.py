"""Batch size and gossip period (PALA paper Fig. 12): n-steps x envs per update, and gossip
every k updates, 4 agents on a sync ring, equal total frames.

    python -m experiments.batch_period            # MinAtar Breakout, 5 seeds
    python -m experiments.batch_period --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.rl.a2c import A2CConfig

AGENTS = 4
SETTINGS = {  # setting -> (n_steps, num_envs, gossip every k updates)
    "5 steps x 16 envs, gossip every update": (5, 16, 1),
    "5 steps x 16 envs, gossip every 4": (5, 16, 4),
    "5 steps x 16 envs, gossip every 16": (5, 16, 16),
    "5 steps x 4 envs, gossip every update": (5, 4, 1),
    "20 steps x 16 envs, gossip every update": (20, 16, 1),
}


def build(quick: bool, frames: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells = []
    for setting, (n_steps, num_envs, every) in SETTINGS.items():
        cells += [
            Cell(
                setting,
                seed,
                AGENTS,
                frames,
                SwarmConfig(agents=AGENTS, topology="ring"),
                a2c=A2CConfig(n_steps=n_steps, num_envs=num_envs),
                gossip_every=every,
                labels={"batch": n_steps * num_envs},
            )
            for seed in seeds
        ]
    return cells, list(SETTINGS)


STUDY = Study(
    "batch_period",
    "Batch size and gossip period",
    "how do the batch per update (n-steps x envs) and gossiping only every k updates trade "
    "communication time against learning, for the same frames?",
    build,
    real_frames=100_000,
    quick_settings=2,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
