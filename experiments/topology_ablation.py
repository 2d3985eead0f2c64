"""Topology ablation: does who-talks-to-whom matter? ring / sparse / full / one-peer-exponential
(SGP's: one letter a round, exact average every log2 n rounds) mixing vs independent agents (no
gossip, same seeds), at 4 and 8 agents, the same frames for each agent.

``sparse --time-varying`` is not an arm: it is the one-peer exponential graph (the same matrices,
round for round: the same digest), and a sync cell on the same matrices is the same run. It was one until
2026-11-28: on Breakout at 4 agents its seeds 2-5 scored exactly what one-peer-exponential's did (its
seed 1, resumed after a stop, drew other episodes from the stop on).

    python -m experiments.topology_ablation            # MinAtar Breakout, 1M frames per agent, 5 seeds
    python -m experiments.topology_ablation --quick    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.settings import NO_GOSSIP

TOPOLOGIES = ("ring", NO_GOSSIP, "sparse", "full", "one-peer-exponential")
"""The launcher's topologies; NO_GOSSIP is independent agents."""


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells, settings = [], []
    for n in (4,) if quick else (4, 8):
        for topology in TOPOLOGIES:
            setting = f"{'none (independent)' if topology == NO_GOSSIP else topology}, {n} agents"
            settings.append(setting)
            swarm = SwarmConfig(agents=n, topology=topology)
            cells += [
                Cell(setting, seed, n, frames_per_agent * n, swarm, labels={"topology": topology}) for seed in seeds
            ]
    return cells, settings


STUDY = Study(
    "topology_ablation",
    "Topology ablation",
    "does the gossip topology (ring, sparse, full, one-peer-exponential, or none) change what the swarm learns "
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
