"""`gossiprl bench learners`: how fast IMPALA trains against A2C on the same host, in one run.

Rows, back to back so they compare as ratios on a noisy host: one A2C agent (the baseline), one
IMPALA agent with each of ``actor_counts`` actors, once as threads of the learner and once as
processes of their own (``--actor-placement``), and a ring of 2 of each learner. Every row is a
real `gossiprl run` cut off after a fixed time (``train.swarm_row``): its rate is the sum of the
agents' steady-state frames/s, and IMPALA's rows add the policy lag (in updates) and the queue's
depth, averaged over the run's updates. A2C's rate counts frames it acted and learned from;
IMPALA's counts frames its learner learned from, which its actors made beside it. Actor processes
start before their learner trains (each builds its envs, and imports torch where it cannot fork
from a forkserver), so their rows allow that start-up on top of the training time; it is not in
the rate.

Wall-clock rates on a loaded host move with the load, so each row also gives the CPU time it spent
per frame: the CPU seconds of the launcher with its broker and of every process the row started
(agents, actor processes, with all their threads), read from /proc over the agents' steady window
(Linux only; elsewhere the column is left out). A row that trains slower only because the host was
busier keeps its CPU time per frame.
"""

from __future__ import annotations

import os
from dataclasses import replace

from .train import STARTUP_ALLOWANCES, swarm_row

PROCESS_START_S = 15.0
"""Seconds of start-up a row allows each actor process (its envs, and a torch import where actors
cannot fork from a forkserver) on top of each of the agents' allowances
(``train.STARTUP_ALLOWANCES``): on the loaded 2-core VM, 8 spawned actors had not all started 100 s
after launch."""


def run(env_id: str, seconds: float, actor_counts=(1, 4, 8), device: str = "cpu", echo=print) -> dict:
    """Measure every row (see the module docstring), print the table, return the figures."""
    from ..launch import SwarmConfig
    from ..rl.settings import AgentConfig

    a2c = AgentConfig(env_id=env_id, device=device)
    impala = replace(a2c, algo="impala")
    echo(f"{env_id}: {os.cpu_count()} cores, device {device}; {seconds:g} s per row, ratios to one A2C agent")
    rows: list[dict] = []

    def add(name: str, swarm, cfg, actor_processes: int = 0) -> None:
        allowances = tuple(a + PROCESS_START_S * actor_processes for a in STARTUP_ALLOWANCES)
        row = {"row": name, **swarm_row(swarm, cfg, seconds, allowances)}
        row.pop("window", None)
        rows.append(row)
        ratio = f"{row['fps'] / rows[0]['fps']:5.2f}x" if rows[0]["fps"] > 0 else "  n/a"
        line = f"  {name:<44} {row['fps']:8,.0f} frames/s  {ratio} one A2C agent"
        if row.get("cpu_ms_per_frame") is not None:
            line += f"  {row['cpu_ms_per_frame']:6.3f} CPU ms/frame"
        if "impala/policy_lag_mean" in row:
            line += f"  | lag {row['impala/policy_lag_mean']:.2f} updates, queue {row['impala/queue_depth']:.1f}"
        echo(line + ("" if row["steady"] else "  (never finished its warm-up: rate over the whole run)"))

    def actors(n: int, placement: str):
        return replace(impala, impala=replace(impala.impala, actors_per_agent=n, actor_placement=placement))

    one, ring = SwarmConfig(agents=1, topology=None), SwarmConfig(agents=2, topology="ring")
    add("a2c, one agent", one, a2c)
    for n in actor_counts:
        add(f"impala, one agent, {n} actor thread(s)", one, actors(n, "thread"))
        add(f"impala, one agent, {n} actor process(es)", one, actors(n, "process"), actor_processes=n)
    add("a2c, ring of 2", ring, a2c)
    placement = impala.impala.actor_placement
    processes = 2 * impala.impala.actors_per_agent if placement == "process" else 0
    add(f"impala, ring of 2, {impala.impala.actors_per_agent} actor {placement}(s) each", ring, impala, processes)
    return {"env": env_id, "cores": os.cpu_count(), "seconds": seconds, "rows": rows}
