"""Ordering ablation, the PALA paper's central claim: sync turn locks vs async gossip with
max-staleness 1, 4 and unbounded vs no gossip at all, 4 agents on a ring, equal total frames.

    python -m experiments.ordering_ablation            # MinAtar Breakout, 3 seeds
    python -m experiments.ordering_ablation --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig

AGENTS = 4
MODES = {
    "sync (turn locks)": ("sync", None),
    "none (independent)": (None, None),
    "async, max-staleness 1": ("async", 1),
    "async, max-staleness 4": ("async", 4),
    "async, unbounded": ("async", None),
}


def build(quick: bool, frames: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells = []
    for setting, (mode, staleness) in MODES.items():
        swarm = SwarmConfig(agents=AGENTS, topology="ring", mode=mode, max_staleness=staleness) if mode else None
        cells += [
            Cell(setting, seed, AGENTS, frames, swarm, labels={"mode": mode or "none", "max_staleness": staleness})
            for seed in seeds
        ]
    return cells, list(MODES)


STUDY = Study(
    "ordering_ablation",
    "Ordering ablation",
    "do PALA's turn locks (sync) learn better than unordered async gossip, or than no gossip, "
    "for the same frames and the same time?",
    build,
    real_frames=100_000,
    quick_settings=2,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
