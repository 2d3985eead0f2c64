"""Topology ablation: does who-talks-to-whom matter? ring / sparse / time-varying sparse / full
mixing vs independent agents (no gossip, same seeds), at 4 and 8 agents, equal total frames.

    python -m experiments.topology_ablation            # MinAtar Breakout, 3 seeds
    python -m experiments.topology_ablation --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig

TOPOLOGIES = {
    "ring": ("ring", False),
    "none": (None, False),
    "sparse": ("sparse", False),
    "sparse-tv": ("sparse", True),
    "full": ("full", False),
}
"""name -> (launcher topology, time-varying); 'none' is independent agents."""


def build(quick: bool, frames: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells, settings = [], []
    for n in (4,) if quick else (4, 8):
        for name, (topology, time_varying) in TOPOLOGIES.items():
            setting = f"{name if topology else 'none (independent)'}, {n} agents"
            settings.append(setting)
            swarm = SwarmConfig(agents=n, topology=topology, time_varying=time_varying) if topology else None
            cells += [Cell(setting, seed, n, frames, swarm, labels={"topology": name}) for seed in seeds]
    return cells, settings


STUDY = Study(
    "topology_ablation",
    "Topology ablation",
    "does the gossip topology (ring, sparse, time-varying sparse, full, or none) change what the "
    "swarm learns for the same frames and the same time?",
    build,
    real_frames=100_000,
    quick_settings=2,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
