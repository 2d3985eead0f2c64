"""`gossiprl bench learners`: how fast IMPALA trains against A2C on the same host, in one run.

Rows, back to back so they compare as ratios on a noisy host: one A2C agent (the baseline), one
IMPALA agent with each of ``actor_counts`` actors, once as threads of the learner and once as
processes of their own (``--actor-placement``), and a ring of 2 of each learner. Every row is a
real `gossiprl run` cut off after a fixed time (``train.swarm_row``): its rate is the sum of the
agents' steady-state frames/s, and IMPALA's rows add the policy lag (in updates) and the queue's
depth, averaged over the run's updates. A2C's rate counts frames it acted and learned from;
IMPALA's counts frames its learner learned from, which its actors made beside it. Actor processes
start before their learner trains (each imports torch), so their rows allow that start-up on top
of the training time; it is not in the rate.

Wall-clock rates on a loaded host move with the load, so each row also gives the CPU time it
spent per frame: the CPU seconds of every process the row started (agents, actor processes, with
all their threads), read from /proc over the agents' steady window (Linux only; elsewhere the
column is left out). A row that trains slower only because the host was busier keeps its CPU
time per frame.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from .train import STARTUP_ALLOWANCES, swarm_row

SAMPLE_S = 0.25
"""How often the CPU time of the row's processes is read."""
PROCESS_START_S = 15.0
"""Seconds of start-up a row allows each actor process (a torch import and its envs) on top of each
of the agents' allowances (``train.STARTUP_ALLOWANCES``): on the loaded 2-core VM, 8 of them had
not all started 100 s after launch."""


class DescendantsCPU:
    """CPU seconds (user + system) of this process's descendants, sampled in a thread while the block
    runs. This process itself is left out: it only launches the row and samples."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self._thread = threading.Thread(target=self._sample, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append((time.perf_counter(), self.read()))

    def read(self) -> float:
        children: dict[int, list[int]] = {}
        cpu: dict[int, float] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:  # gone since the listing
                continue
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            cpu[pid] = (int(fields[11]) + int(fields[12])) / self._tick
        total, todo = 0.0, list(children.get(os.getpid(), []))
        while todo:
            pid = todo.pop()
            total += cpu.get(pid, 0.0)
            todo += children.get(pid, [])
        return total

    def between(self, since: float, until: float) -> float | None:
        """CPU seconds spent from ``since`` to ``until`` (perf_counter readings), from the nearest samples."""
        inside = [cpu for t, cpu in self.samples if since <= t <= until]
        if len(inside) < 2:
            return None
        first = next(t for t, _ in self.samples if t >= since)
        last = max(t for t, _ in self.samples if t <= until)
        return (inside[-1] - inside[0]) * (until - since) / max(last - first, 1e-9)


def run(env_id: str, seconds: float, actor_counts=(1, 4, 8), device: str = "cpu", echo=print) -> dict:
    """Measure every row (see the module docstring), print the table, return the figures."""
    from ..launch import SwarmConfig
    from ..rl.settings import AgentConfig

    a2c = AgentConfig(env_id=env_id, device=device)
    impala = replace(a2c, algo="impala")
    measure_cpu = Path("/proc/self/stat").exists()
    echo(f"{env_id}: {os.cpu_count()} cores, device {device}; {seconds:g} s per row, ratios to one A2C agent")
    rows: list[dict] = []

    def add(name: str, swarm, cfg, actor_processes: int = 0) -> None:
        allowances = tuple(a + PROCESS_START_S * actor_processes for a in STARTUP_ALLOWANCES)
        with DescendantsCPU() as sampler:
            row = {"row": name, **swarm_row(swarm, cfg, seconds, allowances)}
        window = row.pop("window", None)
        cpu = sampler.between(*window) if measure_cpu and window else None
        if cpu is not None:
            row["cpu_ms_per_frame"] = 1000 * cpu / max(row["fps"] * (window[1] - window[0]), 1e-9)
        rows.append(row)
        ratio = f"{row['fps'] / rows[0]['fps']:5.2f}x" if rows[0]["fps"] > 0 else "  n/a"
        line = f"  {name:<44} {row['fps']:8,.0f} frames/s  {ratio} one A2C agent"
        if "cpu_ms_per_frame" in row:
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
