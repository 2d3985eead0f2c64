"""PALA's Table 1 on MinAtar Breakout and SpaceInvaders: A2C, PALA-A2C, GALA-A2C, PPO and IMPALA at
one frame budget.

PALA's Table 1 sets each method's score at a fixed budget of frames side by side. Here every
agent gets ``--frames`` (a ring of 4 trains 4x as many in all), and the arms are:

* ``A2C, 1 agent`` and ``PALA-A2C, sync ring of 4``: swarm_vs_one's "1 agent" and "ring of 4",
  `gossiprl run`'s defaults when they ran (the ring: PALA's turn locks, blocking gossip);
* ``GALA-A2C, async ring of 4``: the same ring in async mode, which is GALA's gossip buffer
  (facebookresearch/gala ``GossipBuffer``): a writer skips an out-peer whose last letter is
  still unread, a reader mixes in what is there and trains on otherwise. Its staleness is left
  unbounded (no ``max_staleness``), as GALA's README runs it (``--sync-freq 100000000``). Gossip
  stays on the learner's thread (no ``gossip_overlap``): GALA's learner writes and aggregates
  in its own loop, and its non-blocking is the skipping, which async mode does; the overlap
  would also add a round of delay and scale the learning rate, so the arm would differ from
  PALA-A2C in more than the ordering. The learning rate is the studies' in every A2C arm:
  on MinAtar 1.4e-3 (the default when they ran; ``common.STUDY_MINATAR_LR``), the rate GALA's README
  gives 4 learners on Atari, for one agent and swarms alike (docs/swarm-learning.md);
* ``PPO, 1 agent`` and ``IMPALA, 1 agent``: experiments/learners' cells of the same names.

Every cell but GALA-A2C's is taken from the study it belongs to (``build`` calls theirs and
renames the cells), so its fingerprint is theirs and a cell either study finished is reused from
the shared cache instead of being run again (tests/unit/experiments/test_table1.py checks it).
RESULTS.md's "Table 1 on MinAtar" section sets the arms beside Stable-Baselines3's A2C and PPO,
the MinAtar paper's published AC(λ) and the untrained policy.

    python -m experiments.table1 --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/table1
    python -m experiments.table1 --env MinAtar/SpaceInvaders-v1 --frames 1000000 --seeds 1,2,3,4,5 \
        --out experiments/results/table1_spaceinvaders
    python -m experiments.table1 --quick
"""

from __future__ import annotations

from dataclasses import replace

from experiments import learners, swarm_vs_one
from experiments.common import REAL_ENV, Cell
from experiments.study import Study, command

ONE = "A2C, 1 agent"
GALA = "GALA-A2C, async ring of 4"
PALA = "PALA-A2C, sync ring of 4"
SOURCES = {
    ONE: (swarm_vs_one, "1 agent"),
    PALA: (swarm_vs_one, "ring of 4"),
    GALA: (swarm_vs_one, "ring of 4"),
    "PPO, 1 agent": (learners, "PPO, 1 agent"),
    "IMPALA, 1 agent": (learners, "IMPALA, 1 agent"),
}
"""setting: (the study whose cell it is, that cell's setting there); GALA-A2C is that cell in async mode."""

FRAMES = 1_000_000
SEEDS = [1, 2, 3, 4, 5]
GAMES = {REAL_ENV: "table1", "MinAtar/SpaceInvaders-v1": "table1_spaceinvaders"}
"""The games RESULTS.md sets a Table 1 for, and each one's results dir."""


def command_for(env: str) -> str:
    """The run RESULTS.md's Table 1 on ``env`` plans (experiments/run_all.sh runs it): the budget of
    PALA's comparison scaled to MinAtar, and the seeds of the studies it shares cells with."""
    game = "" if env == REAL_ENV else f" --env {env}"
    return (
        f"python -m experiments.table1{game} --frames {FRAMES} --seeds {','.join(map(str, SEEDS))} "
        f"--out experiments/results/{GAMES[env]}"
    )


COMMAND = command_for(REAL_ENV)


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    built = {
        study: {(c.setting, c.seed): c for c in study.build(quick, frames_per_agent, seeds)[0]}
        for study in {study for study, _ in SOURCES.values()}
    }
    cells = []
    for setting, (study, source) in SOURCES.items():
        for seed in seeds:
            cell = replace(built[study][source, seed], setting=setting)
            if setting == GALA:
                cell = replace(cell, swarm=replace(cell.swarm, mode="async", max_staleness=None))
            cells.append(replace(cell, labels={**cell.labels, "mode": cell.swarm.mode if cell.agents > 1 else "none"}))
    return cells, list(SOURCES)


STUDY = Study(
    "table1",
    "PALA's Table 1 on MinAtar",
    "at one frame budget per agent, how do A2C, PALA-A2C (sync ring), GALA-A2C (async ring), PPO and IMPALA score?",
    build,
    real_frames=FRAMES,
    quick_frames=4_000,
    quick_settings=3,
    frames_per_agent=True,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
