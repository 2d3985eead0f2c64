"""A ring of 4 against one agent at 4x A2C's Atari rate, on seeds the sweep did not use: a confirmation.

experiments.lr_sweep listed, among the comparisons beside its claim (95 % intervals each, uncorrected,
no verdict read off them), that at 2.8e-3 (4x A2C's Atari rate) a ring of 4 ended above one agent per
agent frame on Breakout: 16.65 [14.71, 19.76] against 12.39 [11.19, 14.86], P = 0.93 [0.70, 1.00]
(SpaceInvaders' 2.8e-3 ring was still running when this was fixed: its first three seeds' agents
averaged 124-128 against one agent's IQM of 69.50). One comparison of many, picked after the fact,
is a hypothesis, not a result. This study tests it as a claim fixed before its cells
ran, on seeds 6-10, which no other study runs: the same two arms (every flag but the rate is `gossiprl
run`'s default), equal frames per agent (``--frames`` is per agent), judged by P(ring > one agent)
alone (experiments/claims.py).

    python -m experiments.lr_confirm --frames 1000000 --out experiments/results/lr_confirm
    python -m experiments.lr_confirm --env MinAtar/SpaceInvaders-v1 --frames 1000000 \\
        --out experiments/results/lr_confirm_spaceinvaders
    python -m experiments.lr_confirm --quick
"""

from __future__ import annotations

from experiments import lr_sweep
from experiments.study import Study, command

SETTINGS = ("1 agent, lr 2.8e-3", "ring of 4, lr 2.8e-3")
"""lr_sweep's 4x arms, built by lr_sweep: on a seed both plan, a cell is the sweep's, run once."""


def build(quick: bool, frames_per_agent: int, seeds: list[int]):
    cells, _ = lr_sweep.build(quick, frames_per_agent, seeds)
    return [c for c in cells if c.setting in SETTINGS], list(SETTINGS)


STUDY = Study(
    "lr_confirm",
    "A ring of 4 against one agent at 4x A2C's Atari rate, on fresh seeds",
    "at 2.8e-3, does each agent of a ring of 4 learn more per frame than one agent, on seeds the learning-rate "
    "sweep did not use?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    frames_per_agent=True,
    real_seeds="6,7,8,9,10",
)
main = command(STUDY)

if __name__ == "__main__":
    main()
