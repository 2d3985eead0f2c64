"""Start a swarm on this host (the GALA layout) or one agent of a swarm spread over hosts (PALA).

``run`` owns a broker and one process per agent, named by role (``agent-3``). Agent processes
report to the launcher over one queue, ``reports``, with ("progress" | "done" | "failed", rank,
payload) tuples; the launcher decides when the swarm stops (total frames, the solve threshold
over the last 100 episodes of all agents together, Ctrl-C or SIGTERM, a crashed agent under
``fail_fast``) and tells agents through one Event, ``stop``. Without ``fail_fast`` a crashed
agent is named, with its traceback, and the broker rewires the survivors around it. Children
are joined in ``finally``: no orphans.
"""
from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import topologies

from .broker import Broker
from .client import BrokerUnavailable, GossipClient
from .gossip import Gossip

log = logging.getLogger("gossiprl.launch")

RANK_VARIABLES = ("SLURM_PROCID", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")

LOCAL_HEARTBEAT_S = 0.25
"""Heartbeat of agents that share a host with their broker. At the end of a run the launcher
closes the broker, and an agent parked on a turn lock notices after 3 silent heartbeats;
pings are cheap on one host, so they come often and the swarm stops within a second."""


class RunError(RuntimeError):
    """A run that cannot start as asked; the message says why and what to do instead."""


@dataclass
class SwarmConfig:
    agents: int = 4
    """Number of agents; 1 with no topology is plain A2C (no broker)."""
    topology: str | None = "ring"
    """ring, sparse, full, or a .npy/.csv mixing matrix; None only with one agent."""
    peers: int | None = None
    """Out-peers per agent for the sparse topology (default ceil(log2 n))."""
    time_varying: bool = False
    """Sparse: one rotating peer per round, as GALA/SGP."""
    mode: str = "sync"
    """sync: PALA's turn locks; async: GALA-style non-blocking."""
    max_staleness: int | None = None
    """async: an agent waits for an in-peer after this many rounds without its letter."""
    codec: str = "raw"
    """Parameters on the wire: raw float32, or bf16 / fp16 (half the bytes)."""
    transport: str = "ipc"
    """ipc (unix sockets, fastest on one host) or tcp (loopback)."""
    gossip_timeout: float = 60.0
    """Seconds an agent waits for a turn lock before it skips the round and trains on."""
    stop_at_return: float | None = None
    """Stop the swarm once the mean of the last 100 episodes of all agents reaches this."""
    max_seconds: float | None = None
    """Stop the swarm after this much wall-clock time."""
    fail_fast: bool = False
    """Stop every agent when one fails; by default the others carry on, rewired around it."""


@dataclass
class Progress:
    """What the launcher knows of the swarm, from the agents' reports."""

    agents: int
    frames: dict[int, int] = field(default_factory=dict)
    gossip_s: dict[int, float] = field(default_factory=dict)
    busy_s: dict[int, float] = field(default_factory=dict)
    returns: deque = field(default_factory=lambda: deque(maxlen=100))
    episodes: int = 0
    agent_returns: dict[int, deque] = field(default_factory=dict)
    """Each agent's own last 100 episodes: the pooled window is dominated by whichever agents
    finish episodes fastest (the worst ones, on CartPole), so both are shown."""

    def add(self, rank: int, report: dict) -> None:
        self.frames[rank] = report["frames"]
        self.gossip_s[rank] = report["gossip_s"]
        self.busy_s[rank] = report["wall_s"]
        self.returns.extend(report["returns"])
        self.agent_returns.setdefault(rank, deque(maxlen=100)).extend(report["returns"])
        self.episodes += len(report["returns"])

    @property
    def total_frames(self) -> int:
        return sum(self.frames.values())

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else math.nan

    @property
    def agent_means(self) -> list[float]:
        return [sum(r) / len(r) for r in self.agent_returns.values() if r]

    @property
    def gossip_share(self) -> float:
        busy = sum(self.busy_s.values())
        return sum(self.gossip_s.values()) / busy if busy else 0.0


def rank_from_environment(explicit: int | None) -> int:
    """--rank, else the launcher's variable (Slurm, torchrun, Open MPI, MPICH)."""
    if explicit is not None:
        return explicit
    for name in RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise RunError(f"no --rank given and none of {', '.join(RANK_VARIABLES)} is set")


def prepare_run_dir(run_dir: Path, resume: bool, config: dict) -> None:
    """Refuse to mix two runs in one directory; write config.json atomically for a new run."""
    config_path = run_dir / "config.json"
    if resume:
        if not config_path.exists():
            raise RunError(f"cannot resume: {run_dir} holds no run (no config.json)")
        return
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RunError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = config_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2, default=str))
    os.replace(tmp, config_path)


def _agent_process(rank, address, n, agent_cfg, run_dir, resume, gossip_timeout, codec, stop, reports):
    """Body of the process ``agent-<rank>``: train, gossiping through the broker at ``address``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; Ctrl-C reaches it
    from .agent import train

    threading.Thread(target=_stop_when_orphaned, args=(stop,), name="orphan-watch", daemon=True).start()

    gossip = None
    try:
        if address is not None:
            client = GossipClient(address, rank, n=n, timeout=gossip_timeout, codec=codec,
                                  heartbeat=LOCAL_HEARTBEAT_S, takeover=resume)
            gossip = Gossip(client)
        summary = train(agent_cfg, run_dir, rank=rank, gossip=gossip, resume=resume, stop=stop,
                        progress=lambda report: reports.put(("progress", rank, report)))
        reports.put(("done", rank, summary))
    except BaseException:
        reports.put(("failed", rank, traceback.format_exc(limit=8)))
        raise SystemExit(1)
    finally:
        if gossip is not None:
            gossip.close()


def _stop_when_orphaned(stop) -> None:
    """If the launcher dies without a word (kill -9), stop after this update, checkpoint and exit."""
    mp.parent_process().join()
    stop.set()


def run(swarm: SwarmConfig, agent_cfg, run_dir: Path, resume: bool = False, echo=print,
        show_progress: bool = True) -> dict:
    """Train a swarm on this host; returns (and writes) summary.json's contents."""
    from dataclasses import replace

    topo = None
    if swarm.agents > 1 or swarm.topology is not None:
        if swarm.topology is None:
            raise RunError("more than one agent needs a --topology")
        topo = make_topology(swarm)
    agent_cfg = replace(agent_cfg, agents=swarm.agents)
    run_dir = Path(run_dir)
    prepare_run_dir(run_dir, resume, {"swarm": asdict(swarm), "agent": asdict(agent_cfg),
                                      "topology": topo.to_dict() if topo else None})
    ctx = mp.get_context("spawn")
    stop, reports = ctx.Event(), ctx.Queue()
    progress = Progress(swarm.agents)
    procs: dict[int, mp.Process] = {}
    broker = None
    summaries: dict[int, dict] = {}
    failures: dict[int, str] = {}
    reported: set[int] = set()
    stopped_by = "total frames"
    solved_at = None
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gossiprl-") as tmp:
        if topo is not None:
            bind = f"ipc://{tmp}/broker" if swarm.transport == "ipc" else "tcp://127.0.0.1:0"
            broker = Broker(topo, bind=bind, mode=swarm.mode, max_staleness=swarm.max_staleness).start()
        bar = _progress_bar(swarm.agents * agent_cfg.total_frames, show_progress)
        try:
            for rank in range(swarm.agents):
                procs[rank] = ctx.Process(
                    target=_agent_process, name=f"agent-{rank}",
                    args=(rank, broker.address if broker else None, swarm.agents, agent_cfg, str(run_dir),
                          resume, swarm.gossip_timeout, swarm.codec, stop, reports))
                procs[rank].start()
            while len(summaries) + len(failures) < swarm.agents:
                if swarm.max_seconds is not None and time.perf_counter() - start > swarm.max_seconds \
                        and not stop.is_set():
                    stopped_by = f"time limit of {swarm.max_seconds:g}s"
                    stop.set()
                try:
                    kind, rank, payload = reports.get(timeout=0.5)
                except queue.Empty:
                    kind = None
                if kind == "progress":
                    progress.add(rank, payload)
                    bar(progress)
                    if (swarm.stop_at_return is not None and len(progress.returns) == 100
                            and progress.mean_return >= swarm.stop_at_return and not stop.is_set()):
                        stopped_by = f"solved: mean return {progress.mean_return:.1f} >= {swarm.stop_at_return}"
                        solved_at = {"frames": progress.total_frames, "wall_seconds": time.perf_counter() - start,
                                     "mean_return": progress.mean_return}
                        stop.set()
                elif kind == "done":
                    summaries[rank] = payload
                elif kind == "failed":
                    failures[rank] = payload
                for rank, p in procs.items():  # killed outright (OOM, kill -9): no report comes
                    if not p.is_alive() and rank not in summaries and rank not in failures:
                        failures[rank] = f"process exited with code {p.exitcode} without a report"
                for rank in sorted(failures.keys() - reported):
                    reported.add(rank)
                    echo(f"agent-{rank} failed: {failures[rank].strip()}")
                    if swarm.fail_fast:
                        stopped_by = f"agent-{rank} failed (--fail-fast)"
                        stop.set()
                    elif broker is not None:
                        echo(f"carrying on with the other agents; the topology is rewired around agent-{rank}")
                        broker.declare_gone(rank)
        except KeyboardInterrupt:
            stopped_by = "interrupted"
            echo("\ninterrupted: stopping agents (they write a final checkpoint)")
            stop.set()
            _drain_until_done(reports, summaries, failures, swarm.agents, progress, timeout=60)
        finally:
            stop.set()
            for p in procs.values():
                if p.pid is None:  # start() itself failed; its error is already on its way up
                    continue
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
                    p.join(5)
            if broker is not None:
                broker.close()
            bar(None)
    wall = time.perf_counter() - start
    frames = sum(s["frames"] for s in summaries.values())
    summary = {
        "frames": frames,
        "wall_seconds": wall,
        "fps": sum(s["fps"] * s["wall_seconds"] for s in summaries.values()) / wall,
        "mean_return": progress.mean_return,
        "mean_return_definition": "mean of the last 100 episodes of all agents pooled (the stop rule); "
                                  "agents_mean_return / agents_min_return: mean and worst of each agent's "
                                  "own last-100 mean",
        "agents_mean_return": _mean([s["mean_return"] for s in summaries.values()]),
        "agents_min_return": min((s["mean_return"] for s in summaries.values()), default=math.nan),
        "episodes": progress.episodes,
        "agents": swarm.agents,
        "stopped_by": stopped_by,
        "solved_at": solved_at,
        "gossip_share": progress.gossip_share,
        "per_agent": {rank: summaries[rank] for rank in sorted(summaries)},
        "failed": {rank: failures[rank].strip().splitlines()[-1] for rank in sorted(failures)},
    }
    tmp_path = run_dir / "summary.json.tmp"
    tmp_path.write_text(json.dumps(summary, indent=2, default=_json_default))
    os.replace(tmp_path, run_dir / "summary.json")
    return summary


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _json_default(value):
    return None if isinstance(value, float) and math.isnan(value) else str(value)


def _drain_until_done(reports, summaries, failures, n, progress, timeout):
    deadline = time.monotonic() + timeout
    while len(summaries) + len(failures) < n and time.monotonic() < deadline:
        try:
            kind, rank, payload = reports.get(timeout=0.5)
        except queue.Empty:
            continue
        if kind == "progress":
            progress.add(rank, payload)
        elif kind == "done":
            summaries[rank] = payload
        else:
            failures[rank] = payload


def make_topology(swarm: SwarmConfig):
    if swarm.topology in topologies.NAMES:
        options = {}
        if swarm.peers is not None:
            options["peers"] = swarm.peers
        if swarm.time_varying:
            options["time_varying"] = True
        return topologies.make(swarm.topology, swarm.agents, **options)
    topo = topologies.from_matrix(swarm.topology)
    if topo.n != swarm.agents:
        raise RunError(f"{swarm.topology} is a {topo.n}x{topo.n} matrix but --agents is {swarm.agents}")
    return topo


def _progress_bar(total_frames: int, enabled: bool):
    """A tqdm line: frames, frames/s, mean return over the last 100 episodes, share of time in gossip."""
    if not enabled:
        return lambda progress: None
    from tqdm import tqdm

    bar = tqdm(total=total_frames, unit="frame", unit_scale=True, dynamic_ncols=True, smoothing=0.1)

    def update(progress: Progress | None) -> None:
        if progress is None:
            bar.close()
            return
        bar.update(progress.total_frames - bar.n)
        means = progress.agent_means
        own = f" (agents {min(means):.0f}-{max(means):.0f})" if len(means) > 1 else ""
        bar.set_postfix_str(f"return {progress.mean_return:.1f}{own}  gossip {100 * progress.gossip_share:.0f}%",
                            refresh=False)

    return update


def run_agent(address: str, rank: int, agent_cfg, run_dir: Path, resume: bool = False,
              gossip_timeout: float = 60.0, codec: str = "raw", stop=None, connect_timeout: float = 120.0,
              echo=print, **client_options) -> dict:
    """One agent of a multi-host swarm (the PALA layout): the broker runs elsewhere.

    Agents of a batch job may start before their broker, so registration is retried for
    ``connect_timeout`` seconds. ``resume`` continues from this rank's checkpoint, or from the
    neighbours' parameters when there is none, and takes the rank over from a registration
    the broker may still hold for this agent's previous, dead process.
    """
    from .agent import train

    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            client = GossipClient(address, rank, timeout=gossip_timeout, codec=codec, takeover=resume,
                                  **client_options)
            break
        except BrokerUnavailable as err:
            if time.monotonic() > deadline:
                raise RunError(f"no broker answered at {address} within {connect_timeout:g}s: {err}") from None
            echo(f"agent-{rank}: waiting for the broker ({err})")
    gossip = Gossip(client)
    try:
        return train(agent_cfg, run_dir, rank=rank, gossip=gossip, resume=resume, stop=stop)
    finally:
        gossip.close()
