"""Agent-count scaling (PALA paper Figs. 6-8): 1 agent (plain A2C) and rings of 2-16 agents,
the same frames for each agent (a swarm of n trains n times as many): score vs frames per agent,
which is wall-clock when each agent has its own cores and GPU as in the paper, and where each
agent's time goes (rollout, learn, gossip wait + transfer, mix) per update on these shared cores.

    python -m experiments.scaling            # MinAtar Breakout, 1M frames per agent, 5 seeds
    python -m experiments.scaling --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig

COUNTS = (1, 2, 4, 8, 16)


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells, settings = [], []
    for n in COUNTS:
        setting = "1 agent (plain A2C)" if n == 1 else f"{n} agents, ring"
        settings.append(setting)
        swarm = SwarmConfig(agents=1, topology=None) if n == 1 else SwarmConfig(agents=n, topology="ring")
        cells += [Cell(setting, seed, n, frames_per_agent * n, swarm) for seed in seeds]
    return cells, settings


STUDY = Study(
    "scaling",
    "Agent-count scaling",
    "with the same frames for each agent, do more gossiping agents learn more per agent step (the "
    "wall-clock of the paper's setting, each agent on its own hardware), and where does each agent's time go?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    time_split=True,
    quick_settings=2,
    frames_per_agent=True,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
