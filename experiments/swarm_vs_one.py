"""One agent against a ring of 4 with `gossiprl run`'s defaults as they were planned, at equal frames per agent.

The check experiments/swarm_learning's diagnosis leads to: with the defaults as they were then (on
MinAtar lr 1.4e-3, the studies' rate, ``common.STUDY_MINATAR_LR``; the default is 2.8e-3 since
experiments.lr_confirm), does
each agent of a ring of 4 learn at least as much per frame as one agent alone? ``--frames`` is per
agent (the ring trains 4x as many in all), and a third arm gives one agent the ring's total.
Scores are each agent's own last-100 mean; summary.csv has their mean with a Student-t interval
over seeds, and RESULTS.md the interquartile mean of all agents' scores with a bootstrap interval.

Two more arms run both at A2C's Atari rate, 7e-4, the default before experiments.lr_sweep gave
MinAtar 1.4e-3: the comparison as it stood before (and the papers' rate). The arm given the ring's
total frames runs at 7e-4 too, so it is compared with the ring at 7e-4; at the new rate it was not
run (4M frames a cell).

    python -m experiments.swarm_vs_one --frames 1000000 --seeds 1,2,3,4,5
    python -m experiments.swarm_vs_one --quick
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.rl.a2c import ATARI_LR
from gossiprl.rl.settings import A2CConfig

EQUAL_TOTAL = "1 agent at lr 7e-4, the ring's total frames"
ONE_ATARI = "1 agent, lr 7e-4"
RING_ATARI = "ring of 4, lr 7e-4"
SETTINGS = {
    "1 agent": (1, 1, {}),
    "ring of 4": (4, 1, {}),
    EQUAL_TOTAL: (1, 4, {"lr": ATARI_LR}),
    ONE_ATARI: (1, 1, {"lr": ATARI_LR}),
    RING_ATARI: (4, 1, {"lr": ATARI_LR}),
}
"""setting: (agents, budget in multiples of --frames per agent, A2CConfig fields changed). The
third arm is one agent given as many frames as the whole ring (4M at --frames 1000000): the
comparison at equal total frames, where the ring has no advantage of experience, and one agent's
curve that far (toward the published 5M). Each arm's cells are named by the rate they run at
(experiments.common.a2c_rate), so the default arms are lr_sweep's 1.4e-3 cells and the 7e-4 arms
are the ones this study ran when 7e-4 was the default: the shared cache runs each once."""


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
    "with gossiprl run's defaults of 2026-11-27 (lr 1.4e-3 on MinAtar), does each agent of a ring of 4 learn at "
    "least as much per frame as one agent? "
    "And at A2C's Atari rate, the default before MinAtar got its own?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    frames_per_agent=True,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
