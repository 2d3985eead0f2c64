"""The learners side by side: A2C, PPO and IMPALA, one agent and a ring of 4, on one engine.

PALA's Table 1 compares PALA-A2C with A2C, GALA-A2C and IMPALA; this study asks the same of
gossiprl's three learners on MinAtar Breakout, each with its own papers' defaults (A2C: the PALA /
GALA papers'; PPO: CleanRL's Atari settings; IMPALA: Espeholt et al. 2018's), at equal frames per
agent (``--frames`` is per agent: the rings train 4x as many in all). The well-known
implementation's curves for A2C and PPO on the same env, frames and seeds are
experiments/baselines.py's Stable-Baselines3 runs, which RESULTS.md shows beside this study.

    python -m experiments.learners --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/learners
    python -m experiments.learners --quick
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig

ALGOS = {"A2C": "a2c", "PPO": "ppo", "IMPALA": "impala"}
LAYOUTS = {"1 agent": 1, "ring of 4": 4}
SETTINGS = {f"{name}, {layout}": (algo, agents) for layout, agents in LAYOUTS.items() for name, algo in ALGOS.items()}
"""setting: (--algo, agents); every other flag is `gossiprl run`'s default for that learner."""


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells = []
    for setting, (algo, agents) in SETTINGS.items():
        swarm = SwarmConfig(agents=agents, topology="ring" if agents > 1 else None)
        # A2C is `gossiprl run`'s default learner, so its cells name no change: then they are
        # swarm_vs_one's "1 agent" and "ring of 4" cells, and the shared cache runs each once
        agent = {} if algo == "a2c" else {"algo": algo}
        cells += [
            Cell(setting, seed, agents, frames_per_agent * agents, swarm, agent=agent, labels={"algo": algo})
            for seed in seeds
        ]
    return cells, list(SETTINGS)


STUDY = Study(
    "learners",
    "A2C, PPO and IMPALA on one engine",
    "how do gossiprl's learners compare per frame, alone and as a ring of 4, and against Stable-Baselines3?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    quick_settings=3,
    frames_per_agent=True,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
