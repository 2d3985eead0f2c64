"""A2C's learning rate on MinAtar: 1x, 2x and 4x the Atari rate, one agent and a ring of 4.

swarm_vs_one found twice A2C's Atari rate (7e-4) better for one agent in every seed of two MinAtar
games, and for a ring of 4 less surely. This study picks MinAtar's default from a sweep rather than
from that one step, and asks whether the ring wants a larger rate than one agent (the square-root
rule for adaptive optimizers says 2x at n = 4): each rate is run for both, at equal frames per agent
(``--frames`` is per agent). Every arm names its rate, so the 7e-4 and 1.4e-3 arms are
swarm_vs_one's cells, read from the shared cache, and the default can move without moving them.

    python -m experiments.lr_sweep --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/lr_sweep
    python -m experiments.lr_sweep --env MinAtar/SpaceInvaders-v1 --frames 1000000 --seeds 1,2,3,4,5 \\
        --out experiments/results/lr_sweep_spaceinvaders
    python -m experiments.lr_sweep --quick
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.rl.a2c import ATARI_LR
from gossiprl.rl.settings import A2CConfig

RATES = {"lr 7e-4": ATARI_LR, "lr 1.4e-3": 2 * ATARI_LR, "lr 2.8e-3": 4 * ATARI_LR}
LAYOUTS = {"1 agent": 1, "ring of 4": 4}
SETTINGS = {f"{layout}, {rate}": (agents, lr) for layout, agents in LAYOUTS.items() for rate, lr in RATES.items()}
"""setting: (agents, A2C's lr); every other flag is `gossiprl run`'s default."""


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells = []
    for setting, (agents, lr) in SETTINGS.items():
        swarm = SwarmConfig(agents=agents, topology="ring" if agents > 1 else None)
        cells += [
            Cell(setting, seed, agents, frames_per_agent * agents, swarm, a2c=A2CConfig(lr=lr), labels={"lr": lr})
            for seed in seeds
        ]
    return cells, list(SETTINGS)


STUDY = Study(
    "lr_sweep",
    "A2C's learning rate on MinAtar",
    "which of 1x, 2x and 4x A2C's Atari rate learns most per frame on MinAtar, for one agent and for a ring of 4?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    quick_settings=2,
    frames_per_agent=True,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
