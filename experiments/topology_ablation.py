"""Topology ablation: does who-talks-to-whom matter? ring / sparse / time-varying sparse / full /
one-peer-exponential (SGP's: one letter a round, exact average every log2 n rounds) mixing vs
independent agents (no gossip, same seeds), at 4 and 8 agents, the same frames for each agent.

    python -m experiments.topology_ablation            # MinAtar Breakout, 1M frames per agent, 5 seeds
    python -m experiments.topology_ablation --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.settings import NO_GOSSIP

TOPOLOGIES = {
    "ring": ("ring", False),
    "none": (NO_GOSSIP, False),
    "sparse": ("sparse", False),
    "sparse-tv": ("sparse", True),
    "full": ("full", False),
    "one-peer-exponential": ("one-peer-exponential", False),
}
"""name -> (launcher topology, time-varying); 'none' is independent agents."""


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells, settings = [], []
    for n in (4,) if quick else (4, 8):
        for name, (topology, time_varying) in TOPOLOGIES.items():
            setting = f"{'none (independent)' if topology == NO_GOSSIP else name}, {n} agents"
            settings.append(setting)
            swarm = SwarmConfig(agents=n, topology=topology, time_varying=time_varying)
            cells += [Cell(setting, seed, n, frames_per_agent * n, swarm, labels={"topology": name}) for seed in seeds]
    return cells, settings


STUDY = Study(
    "topology_ablation",
    "Topology ablation",
    "does the gossip topology (ring, sparse, time-varying sparse, full, one-peer-exponential, or none) change "
    "what the "
    "swarm learns for the same frames per agent?",
    build,
    real_frames=1_000_000,
    quick_frames=4_000,
    quick_settings=2,
    frames_per_agent=True,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
