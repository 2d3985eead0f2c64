"""Ordering ablation, the PALA paper's central claim: sync turn locks vs async gossip with
max-staleness 1, 4 and unbounded vs no gossip at all, 4 agents on a ring, the same frames for each agent;
and sync with overlapped gossip (the turn locks kept, each round's letters mixed one update late, the
learning rate scaled by 2 - p_ii as `gossiprl run --gossip-overlap` does), which costs the turn locks'
waiting less.

    python -m experiments.ordering_ablation            # MinAtar Breakout, 1M frames per agent, 5 seeds
    python -m experiments.ordering_ablation --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.settings import NO_GOSSIP

AGENTS = 4
MODES = {
    "sync (turn locks)": ("sync", None),
    "none (independent)": (None, None),
    "async, max-staleness 1": ("async", 1),
    "async, max-staleness 4": ("async", 4),
    "async, unbounded": ("async", None),
    "sync, overlapped": ("sync", None),
}
"""Last the arm added after the others had run: --quick keeps the first two settings, as before."""
OVERLAPPED = {"sync, overlapped": {"gossip_overlap": True}}


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells = []
    for setting, (mode, staleness) in MODES.items():
        swarm = (
            SwarmConfig(agents=AGENTS, topology="ring", mode=mode, max_staleness=staleness)
            if mode
            else SwarmConfig(agents=AGENTS, topology=NO_GOSSIP)
        )
        cells += [
            Cell(
                setting,
                seed,
                AGENTS,
                frames_per_agent * AGENTS,
                swarm,
                labels={"mode": mode or "none", "max_staleness": staleness},
                agent=OVERLAPPED.get(setting, {}),
            )
            for seed in seeds
        ]
    return cells, list(MODES)


STUDY = Study(
    "ordering_ablation",
    "Ordering ablation",
    "do PALA's turn locks (sync) learn better than unordered async gossip, or than no gossip, "
    "for the same frames per agent?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    quick_settings=2,
    frames_per_agent=True,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
