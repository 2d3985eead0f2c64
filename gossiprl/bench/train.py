"""`gossiprl bench train`: how fast the agent loop trains, against its limits, in one run.

Every row is measured in the same invocation, back to back, so rows compare as ratios even on a
noisy host: the raw vector env (random actions, no learning), the minimal hand-written A2C loop
(``lean``: the limit of a torch loop doing the same work), one agent of `gossiprl run` with
default flags, both again while another process keeps one core busy (the normal case on a shared
cluster node; and the agent once more with as many torch threads as cores, the old default,
which collapsed there), n minimal loops side by side in their own processes (the host's ceiling
for a swarm of n that never talks: a ring's rate over it is what gossip costs, apart from what
the cores can give), and rings of 2 and 4 agents with blocking sync gossip (PALA's Algorithm 2, the default),
overlapped sync gossip and async gossip. Swarm rows are real `gossiprl run`s
(broker, agent processes) cut off after a fixed time; their rate is the sum of the agents'
steady-state frames/s (after the warm-up updates, so start-up is left out), and the time split
is the agents' mean share of rollout, learn, gossip wait and mix over the same window.

Frames/s on a loaded host move with the load, so every training row also gives its CPU time per
frame (the minimal loops' own process CPU; a swarm row's, the launcher with its broker and every
process the run started, read from /proc while every agent was in its steady state) and its ratio to
the same baseline: a host busier in one row than in the next moves the rates, not the CPU each frame
took.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..rl.envs import atari_game, is_atari, steps_batched
from .lean import lean_a2c_fps, side_by_side_fps

SWARM_LAYOUTS = (("sync", False), ("sync", True), ("async", True))
"""(mode, gossip_overlap) of the swarm rows: blocking sync (PALA's, the default), overlapped sync, async."""

SHARES = ("rollout", "learn", "gossip_wait", "mix")

MINATAR_LOOP_ROWS = {
    "raw vector env, MinAtar's own loop": "raw vector env, random actions",
    "minimal A2C loop, MinAtar's own loop": "minimal A2C loop",
}
"""The rows a batched MinAtar game (``envs.BATCHED_GAMES``) adds, each the row named beside it with
the games stepped one at a time in MinAtar's own code: what the batch buys."""


def raw_ceiling(env_id: str, num_envs: int, seconds: float, threads: int = 0, batched: bool = True) -> float:
    """Frames/s of the bare vector env with random actions (Atari frames include the skipped ones);
    ``batched``: ``make_env``'s."""
    if is_atari(env_id):
        from ale_py.vector_env import AtariVectorEnv

        env = AtariVectorEnv(
            atari_game(env_id), num_envs, num_threads=threads or os.cpu_count() or 1, frameskip=4, reward_clipping=False
        )
        frames_per_step = 4
    else:
        from ..rl.envs import make_env

        env = make_env(env_id, num_envs, 0, batched=batched).env
        frames_per_step = 1
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    n = env.single_action_space.n
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, n, size=num_envs))
        steps += 1
    elapsed = time.perf_counter() - start
    env.close()
    return steps * num_envs * frames_per_step / elapsed


@contextlib.contextmanager
def busy_core():
    """Another process spinning on one core for as long as the block runs; yields its pid."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it take its core before anything is timed
        yield spinner.pid
    finally:
        spinner.kill()
        spinner.wait()


SAMPLE_S = 0.5
"""How often the CPU time of the row's processes is read (a read lists /proc: a few ms of CPU)."""


class DescendantsCPU:
    """CPU seconds (user + system) a row spends: this process's (the launcher and its broker) and its
    descendants', sampled in a thread while the block runs. Left out: the sampler thread itself, and
    each process in ``exclude`` (a busy-core spinner: the load, not the row's work) with its own
    descendants. A process that exits keeps the last CPU it was seen with, so the total never falls
    when an agent finishes before the others. Read from /proc: where there is none (not Linux),
    ``works`` is False and nothing is sampled."""

    works = Path("/proc/self/stat").exists()

    def __init__(self, exclude=()):
        self.exclude = set(exclude)
        self.samples: list[tuple[float, float]] = []
        self._seen: dict[tuple[int, int], float] = {}
        """Each descendant, by (pid, start time), with the most CPU it was seen with."""
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
        while self.works and not self._stop.wait(SAMPLE_S):
            own = time.process_time() - time.thread_time()  # this thread's own reads are not the row's work
            self.samples.append((time.perf_counter(), own + self.read()))

    def read(self) -> float:
        """The descendants' CPU seconds so far, those that have exited included."""
        children: dict[int, list[int]] = {}
        cpu: dict[int, tuple[int, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:  # gone since the listing
                continue
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            cpu[pid] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / self._tick)
        todo = [child for child in children.get(os.getpid(), []) if child not in self.exclude]
        while todo:
            pid = todo.pop()
            if pid in cpu:
                started, seconds = cpu[pid]
                self._seen[pid, started] = max(seconds, self._seen.get((pid, started), 0.0))
            todo += [child for child in children.get(pid, []) if child not in self.exclude]
        return sum(self._seen.values())

    def between(self, since: float, until: float) -> float | None:
        """CPU seconds spent from ``since`` to ``until`` (perf_counter readings): the CPU rate between
        the first and last samples inside, times the window's length. A window with fewer than two
        samples inside (a --quick row's second of steady state on a loaded host, sampled every 0.5 s)
        takes the rate between the nearest samples around it; None without one on each side."""
        inside = [(t, cpu) for t, cpu in self.samples if since <= t <= until]
        if len(inside) < 2:
            before = [(t, cpu) for t, cpu in self.samples if t <= since]
            after = [(t, cpu) for t, cpu in self.samples if t >= until]
            if not before or not after:
                return None
            inside = [before[-1], after[0]]
        (first, start), (last, end) = inside[0], inside[-1]
        return (end - start) * (until - since) / max(last - first, 1e-9)


STARTUP_ALLOWANCES = (10.0, 30.0, 90.0)
"""Seconds a swarm row allows its agents to start before its window, tried in turn: a row whose
agents did not all reach their steady state in time (a loaded host: spawn, torch's import, the
swarm waiting for its slowest member) runs again with the next allowance rather than report
start-up as training."""

QUICK_ALLOWANCES = (3.0, 10.0, 30.0, 90.0)
"""--quick's, for its 1 s rows: agents forked from a server that has imported torch start in a
second or two on an idle 2-core VM, so the first allowance is short; a row whose agents did not
start in time runs again with the full allowances (but the old-threads row, which may never warm
up, has its one try: a smoke run then reports its rate over the whole run, as it says)."""


def swarm_row(swarm, agent_cfg, seconds: float, allowances=STARTUP_ALLOWANCES, exclude=()) -> dict:
    """One real `gossiprl run` cut off after ``seconds`` of training; its steady-state figures, the
    CPU milliseconds per frame of every process it started over the agents' steady window (Linux:
    None elsewhere, or when the window is too short to sample; ``exclude``: pids not to count, as
    ``DescendantsCPU``'s), and which try it took."""
    tries = 0
    for allowance in allowances:
        tries += 1
        with DescendantsCPU(exclude) as sampler:
            agents = _timed_run(replace(swarm, total_frames=10**12, max_seconds=seconds + allowance), agent_cfg)
        steady = all("steady_fps" in s for s in agents)
        if steady:
            break
    # An agent so slow it never finished its warm-up (threads collapsing on a busy core) is still a
    # figure: its rate over the whole run, start-up included, which flatters it if anything.
    prefix = "steady_" if steady else ""
    # the rollout source's stats (IMPALA's lag and queue depth), the agents' mean
    sourced = {k for s in agents for k in s if "/" in k}
    fps = sum(s[f"{prefix}fps"] for s in agents)
    # the CPU is read while every agent was in its steady state, where the summed rate holds
    window = (max(s["steady_since"] for s in agents), min(s["steady_until"] for s in agents)) if steady else None
    cpu = sampler.between(*window) if window and window[1] > window[0] and sampler.works else None
    return {
        "fps": fps,
        "cpu_ms_per_frame": 1000 * cpu / max(fps * (window[1] - window[0]), 1e-9) if cpu is not None else None,
        "window": window,
        "shares": {k: float(np.mean([s.get(f"{prefix}{k}_share", 0.0) for s in agents])) for k in SHARES},
        "steady": steady,
        "allowance": allowance,
        "tries": tries,
        **{k: float(np.mean([s[k] for s in agents if k in s])) for k in sorted(sourced)},
    }


def _timed_run(swarm, agent_cfg) -> list[dict]:
    """The per-agent summaries of one `gossiprl run` stopped by its time limit."""
    from .. import launch

    cfg = replace(agent_cfg, log_every=10**9, checkpoint_every=10**9)
    with tempfile.TemporaryDirectory(prefix="gossiprl-bench-") as tmp:
        summary = launch.run(swarm, cfg, Path(tmp) / "run", echo=lambda *a, **k: None, show_progress=False)
    if summary["failed"]:
        raise launch.RunError(f"the swarm of {swarm.agents} failed: {summary['failed']}")
    return list(summary["per_agent"].values())


def run(
    env_id: str,
    seconds: float,
    agent_counts=(2, 4),
    data_plane: str = "broker",
    device: str = "cpu",
    echo=print,
    allowances=STARTUP_ALLOWANCES,
) -> dict:
    """Measure every row (see the module docstring), print the table, return the figures;
    ``allowances``: the swarm rows' start-up allowances (``swarm_row``)."""
    from ..rl.settings import AgentConfig
    from ..settings import SwarmConfig

    agent_cfg = AgentConfig(env_id=env_id, device=device)
    num_envs = agent_cfg.a2c.num_envs
    echo(
        f"{env_id}: {num_envs} envs x {agent_cfg.a2c.n_steps} steps per agent, {os.cpu_count()} cores, "
        f"device {device}, data plane {data_plane}; {seconds:g} s per row"
    )
    rows: list[dict] = []

    def add(name: str, fps: float, shares: dict | None = None, steady: bool = True, window=None, **more) -> None:
        """One row; ``window``, the agents' steady window, is for benchmarks that time it from outside;
        ``more``: the CPU per frame, and the swarm rows' start-up allowance and try."""
        rows.append({"row": name, "fps": fps, "shares": shares, "steady": steady, **more})
        echo(_format(rows[-1], rows))

    _start_agent_server()
    add("raw vector env, random actions", raw_ceiling(env_id, num_envs, min(seconds, 10.0), threads=1))
    add("minimal A2C loop", **lean_a2c_fps(env_id, seconds, num_envs, agent_cfg.a2c.n_steps))
    if steps_batched(env_id):  # what stepping the game as one batch buys, against MinAtar's own loop
        raw, lean = MINATAR_LOOP_ROWS
        add(raw, raw_ceiling(env_id, num_envs, min(seconds, 10.0), threads=1, batched=False))
        add(lean, **lean_a2c_fps(env_id, seconds, num_envs, agent_cfg.a2c.n_steps, batched=False))
    one = SwarmConfig(agents=1, topology=None)
    add("one agent, default flags", **swarm_row(one, agent_cfg, seconds, allowances))
    with busy_core() as spinner:
        add("minimal A2C loop, one core busy", **lean_a2c_fps(env_id, seconds, num_envs, agent_cfg.a2c.n_steps))
        add("one agent, one core busy", **swarm_row(one, agent_cfg, seconds, allowances, exclude=(spinner,)))
        every_core = replace(agent_cfg, torch_threads=os.cpu_count() or 1)
        # the collapse this row shows may never reach the steady state: one try
        old = swarm_row(one, every_core, seconds, allowances[:1], exclude=(spinner,))
        add("one agent, one core busy, old threads", **old)
    for n in agent_counts:
        add(f"{n} minimal loops side by side", **side_by_side_fps(env_id, seconds, n, num_envs, agent_cfg.a2c.n_steps))
        for mode, overlap in SWARM_LAYOUTS:
            swarm = SwarmConfig(agents=n, topology="ring", mode=mode, data_plane=data_plane)
            cfg = replace(agent_cfg, gossip_overlap=overlap)
            name = f"ring of {n}, {mode}, {'overlapped' if overlap else 'blocking'}"
            add(name, **swarm_row(swarm, cfg, seconds, allowances))
    return {"env": env_id, "cores": os.cpu_count(), "data_plane": data_plane, "seconds": seconds, "rows": rows}


def _start_agent_server() -> None:
    """On Linux, start the forkserver agents fork from (``launch.agent_context``), which imports
    torch first, and wait until it serves: before any row is timed, so the first swarm row's
    start-up allowance is not spent on it, and no row shares the cores with its imports. Elsewhere
    agents are spawned, each importing for itself, and there is nothing to start."""
    from ..launch import agent_context

    if not sys.platform.startswith("linux"):
        return
    first = agent_context().Process(target=time.sleep, args=(0,))
    first.start()
    first.join()
    if first.exitcode != 0:
        raise RuntimeError(f"the agents' forkserver could not start a process (exit code {first.exitcode})")


def _format(row: dict, rows: list[dict]) -> str:
    """A table line: the rate, its ratio to the one-agent row (or, under load, to the minimal
    loop under the same load), the CPU per frame with the same ratio (what a loaded host's
    preemption does not move), where the agents' time went, and whether the row took a retry."""
    by_name = {r["row"]: r for r in rows}

    def ratio(baseline: str, key: str = "fps") -> str:
        mine, theirs = row.get(key), by_name[baseline].get(key)
        return f"{mine / theirs:5.2f}x" if mine and theirs else "  n/a"

    baseline = None
    if row["row"] in MINATAR_LOOP_ROWS:
        baseline, what = MINATAR_LOOP_ROWS[row["row"]], "batched"
    elif row["row"] == "one agent, default flags" or row["row"].endswith("side by side"):
        baseline, what = "minimal A2C loop", "minimal loop"
    elif row["row"].startswith("one agent, one core busy"):
        baseline, what = "minimal A2C loop, one core busy", "minimal loop under the same load"
    line = f"  {row['row']:<38} {row['fps']:10,.0f} frames/s"
    if baseline:
        line += f"  {ratio(baseline)} {what}"
    elif row["row"].startswith("ring"):
        n = row["row"].split()[2].rstrip(",")
        baseline = f"{n} minimal loops side by side"
        line += f"  {ratio('one agent, default flags')} one agent, {ratio(baseline)} side by side"
    if row.get("cpu_ms_per_frame"):
        line += f"  | CPU {row['cpu_ms_per_frame'] * 1000:6.1f} us/frame"
        if baseline:
            line += f" ({ratio(baseline, 'cpu_ms_per_frame')} of {baseline.replace('A2C ', '')}'s)"
    if not row["steady"]:
        line += "  (never finished its warm-up: rate over the whole run)"
    if row.get("tries", 1) > 1:
        line += f"  (try {row['tries']}: its agents were given {row['allowance']:g} s to start)"
    if row["shares"]:
        line += "  | " + ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in row["shares"].items())
    return line
