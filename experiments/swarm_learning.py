"""Swarm learning: why a ring of 4 fell behind one agent per agent-frame, and which defaults fix it.

Every setting gets the same frames *per agent* (``--frames`` is per agent here: a ring of 4 trains
4x the frames of one agent, each of its agents as many as the single agent), on MinAtar Breakout.
The settings take the suspects of the diagnosis apart, one at a time:

* ``old defaults``: what main did before: no entropy bonus off Atari, each agent its own initial
  network, blocking gossip (PALA's Algorithm 2);
* ``entropy 0.01, shared init``: the papers' entropy bonus on MinAtar and one initial network for
  the swarm (GALA), with blocking gossip (the defaults of ``gossiprl run`` since this study) and
  with overlapped gossip (``--gossip-overlap``): does the one round of delay cost learning?
* ``lr x2``: the learning rate at sqrt(n) times the single agent's 7e-4 for n = 4 (the square-root
  rule for adaptive optimizers, and GALA's README setting for 4 learners), on the overlapped ring;
  one agent at lr x2 too, so a gain that is only "a better lr" shows itself;
* ``lr rule``: the overlapped ring with ``--overlap-lr-scale``, the learning rate times 2 - p_ii
  (1.5 on a ring), which makes the swarm's mean move as far per round as blocking gossip does;
  and the blocking ring at lr x2, the other half of the learning-rate question.

    python -m experiments.swarm_learning --frames 250000            # the diagnosis, 3 seeds
    python -m experiments.swarm_learning --quick                    # CartPole smoke test
"""

from __future__ import annotations

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.launch import SwarmConfig
from gossiprl.rl.a2c import ATARI_LR
from gossiprl.rl.settings import A2CConfig

LR = ATARI_LR
"""The rate every arm but the lr x2 ones ran at: A2C's default then, on every env."""
OLD = {"shared_init": False, "gossip_overlap": False}
OLD_A2C = {"entropy_coef": 0.0, "lr": LR}
NEW_A2C = {"entropy_coef": 0.01, "lr": LR}
OVERLAPPED = {"shared_init": True, "gossip_overlap": True, "overlap_lr_scale": False}
LR_RULE = {"shared_init": True, "gossip_overlap": True, "overlap_lr_scale": True}
BLOCKING = {"shared_init": True, "gossip_overlap": False}

SETTINGS = {
    # name: (agents, AgentConfig fields, A2CConfig fields); every field that decides the outcome is
    # spelt out, so a cell means the same thing whatever the defaults are when it runs
    "1 agent, entropy 0 (old default)": (1, {}, OLD_A2C),
    "ring of 4, old defaults (entropy 0, own inits, blocking)": (4, OLD, OLD_A2C),
    "1 agent, entropy 0.01": (1, {}, NEW_A2C),
    "ring of 4, entropy 0.01, shared init, overlapped": (4, OVERLAPPED, NEW_A2C),
    "ring of 4, entropy 0.01, shared init, blocking": (4, BLOCKING, NEW_A2C),
    "ring of 4, entropy 0.01, shared init, overlapped, lr x2": (4, OVERLAPPED, {**NEW_A2C, "lr": 2 * LR}),
    "1 agent, entropy 0.01, lr x2": (1, {}, {**NEW_A2C, "lr": 2 * LR}),
    "ring of 4, entropy 0.01, shared init, overlapped, lr rule (x1.5)": (4, LR_RULE, NEW_A2C),
    "ring of 4, entropy 0.01, shared init, blocking, lr x2": (4, BLOCKING, {**NEW_A2C, "lr": 2 * LR}),
}

CONTROL = {
    ring: next(one for one, (n, _, a) in SETTINGS.items() if n == 1 and a == a2c)
    for ring, (agents, _, a2c) in SETTINGS.items()
    if agents > 1
}
"""Each ring's control: the one agent trained with the same A2C settings (entropy, learning rate),
so a ring that beats it does so by gossip, not by its hyperparameters."""


def build(quick: bool, frames_per_agent: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells = []
    for setting, (agents, agent, a2c) in SETTINGS.items():
        swarm = SwarmConfig(agents=agents, topology="ring") if agents > 1 else SwarmConfig(agents=1, topology=None)
        cells += [
            Cell(
                setting,
                seed,
                agents,
                frames_per_agent * agents,
                swarm,
                a2c=A2CConfig(**a2c),
                agent=agent,
                labels={"agents_in_swarm": agents},
            )
            for seed in seeds
        ]
    return cells, list(SETTINGS)


STUDY = Study(
    "swarm_learning",
    "Swarm learning",
    "does a ring of 4 learn at least as much per agent-frame as one agent, and which defaults decide it?",
    build,
    real_frames=250_000,
    quick_frames=4_000,
    frames_per_agent=True,
    quick_settings=2,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
