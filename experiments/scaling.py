"""Agent-count scaling (PALA paper Figs. 6-8): 1 agent (plain A2C) and rings of 2-16 agents,
same total frames, on the same cores: score vs frames and vs wall-clock, and where each
agent's time goes (rollout, learn, gossip wait + transfer, mix) per update.

    python -m experiments.scaling            # MinAtar Breakout, 3 seeds
    python -m experiments.scaling --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig

COUNTS = (1, 2, 4, 8, 16)


def build(quick: bool, frames: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells, settings = [], []
    for n in COUNTS:
        setting = "1 agent (plain A2C)" if n == 1 else f"{n} agents, ring"
        settings.append(setting)
        swarm = SwarmConfig(agents=1, topology=None) if n == 1 else SwarmConfig(agents=n, topology="ring")
        cells += [Cell(setting, seed, n, frames, swarm) for seed in seeds]
    return cells, settings


STUDY = Study(
    "scaling",
    "Agent-count scaling",
    "on a fixed pair of cores, does splitting the same frames over more gossiping agents learn "
    "faster per frame or per second, and where does the time go?",
    build,
    real_frames=100_000,
    time_split=True,
    quick_settings=2,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
