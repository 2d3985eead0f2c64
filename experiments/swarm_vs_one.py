"""One agent against a ring of 4 with `gossiprl run`'s defaults, at equal frames per agent.

The check experiments/swarm_learning's diagnosis leads to: with the defaults as they are now, does
each agent of a ring of 4 learn at least as much per frame as one agent alone? ``--frames`` is per
agent (the ring trains 4x as many in all), and a third arm gives one agent the ring's total.
Scores are each agent's own last-100 mean; summary.csv has their mean with a Student-t interval
over seeds, and RESULTS.md the interquartile mean of all agents' scores with a bootstrap interval.

Two more arms test the reading of docs/swarm-learning.md that the ring's mean is one learner with
a 4x batch: the ring at twice the learning rate (the square-root rule for adaptive optimizers at
n = 4, GALA's README setting for 4 learners), and one agent at twice the rate, its control, so a
gain that is only "a better learning rate" shows itself there too.

    python -m experiments.swarm_vs_one --frames 1000000 --seeds 1,2,3,4,5
    python -m experiments.swarm_vs_one --quick
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.rl.settings import A2CConfig

LR = A2CConfig().lr
EQUAL_TOTAL = "1 agent, the ring's total frames"
RING_LR2 = "ring of 4, lr x2"
ONE_LR2 = "1 agent, lr x2"
SETTINGS = {
    "1 agent": (1, 1, {}),
    "ring of 4": (4, 1, {}),
    EQUAL_TOTAL: (1, 4, {}),
    RING_LR2: (4, 1, {"lr": 2 * LR}),
    ONE_LR2: (1, 1, {"lr": 2 * LR}),
}
"""setting: (agents, budget in multiples of --frames per agent, A2CConfig fields changed). The
third arm is one agent given as many frames as the whole ring (4M at --frames 1000000): the
comparison at equal total frames, where the ring has no advantage of experience, and one agent's
curve that far (toward the published 5M). The lr arms name only the rate, so the default arms'
cells (and the cache entries other studies share with them) stay the same runs."""


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells = []
    for setting, (agents, budget, a2c) in SETTINGS.items():
        swarm = SwarmConfig(agents=agents, topology="ring" if agents > 1 else None)
        cells += [
            Cell(setting, seed, agents, frames_per_agent * agents * budget, swarm, a2c=A2CConfig(**a2c))
            for seed in seeds
        ]
    return cells, list(SETTINGS)


STUDY = Study(
    "swarm_vs_one",
    "A ring of 4 against one agent",
    "with gossiprl run's defaults, does each agent of a ring of 4 learn at least as much per frame as one agent? "
    "And does twice the learning rate turn the ring's 4x batch into more learning, where it does not for one agent?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    frames_per_agent=True,
    quick_settings=3,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
