"""`gossiprl bench learners`: how fast IMPALA trains against A2C on the same host, in one run.

Rows, back to back so they compare as ratios on a noisy host: one A2C agent (the baseline), one
IMPALA agent with each of ``actor_counts`` actor threads, and a ring of 2 of each. Every row is a
real `gossiprl run` cut off after a fixed time (``train.swarm_row``): its rate is the sum of the
agents' steady-state frames/s, and IMPALA's rows add the policy lag (in updates) and the queue's
depth, averaged over the run's updates. A2C's rate counts frames it acted and learned from;
IMPALA's counts frames its learner learned from, which its actors made in threads beside it.
"""

from __future__ import annotations

import os
from dataclasses import replace

from .train import swarm_row


def run(env_id: str, seconds: float, actor_counts=(1, 2, 4), device: str = "cpu", echo=print) -> dict:
    """Measure every row (see the module docstring), print the table, return the figures."""
    from ..launch import SwarmConfig
    from ..rl.settings import AgentConfig

    a2c = AgentConfig(env_id=env_id, device=device)
    impala = replace(a2c, algo="impala")
    echo(f"{env_id}: {os.cpu_count()} cores, device {device}; {seconds:g} s per row, ratios to one A2C agent")
    rows: list[dict] = []

    def add(name: str, swarm, cfg) -> None:
        row = {"row": name, **swarm_row(swarm, cfg, seconds)}
        rows.append(row)
        ratio = f"{row['fps'] / rows[0]['fps']:5.2f}x" if rows[0]["fps"] > 0 else "  n/a"
        line = f"  {name:<36} {row['fps']:10,.0f} frames/s  {ratio} one A2C agent"
        if "impala/policy_lag_mean" in row:
            line += f"  | lag {row['impala/policy_lag_mean']:.2f} updates, queue {row['impala/queue_depth']:.1f}"
        echo(line + ("" if row["steady"] else "  (never finished its warm-up: rate over the whole run)"))

    one, ring = SwarmConfig(agents=1, topology=None), SwarmConfig(agents=2, topology="ring")
    add("a2c, one agent", one, a2c)
    for n in actor_counts:
        add(f"impala, one agent, {n} actor(s)", one, replace(impala, impala=replace(impala.impala, actors_per_agent=n)))
    add("a2c, ring of 2", ring, a2c)
    add("impala, ring of 2, 2 actors each", ring, impala)
    return {"env": env_id, "cores": os.cpu_count(), "seconds": seconds, "rows": rows}
