"""Start a swarm on this host (the GALA layout) or one agent of a swarm spread over hosts (PALA).

``run`` owns a broker and one process per agent, named by role (``agent-3``). Agent processes
report to the launcher over a pipe each, ``reports``, with ("progress" | "done" | "failed",
rank, payload) tuples; the launcher decides when the swarm stops (total frames, the solve
threshold over the last 100 episodes of all agents together, Ctrl-C or SIGTERM, a crashed agent
under ``fail_fast``) and tells agents through one pipe, ``stop``. A crashed agent is named, with
its traceback, and the broker rewires the survivors around it. Children are joined in
``finally``: no orphans.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import topologies

from .comms import keys
from .comms.broker import Broker
from .comms.client import BrokerUnavailable, GossipClient, GossipError
from .comms.dataplane import PLANES
from .comms.gossip import Gossip
from .comms.turnlocks import MODES
from .comms.wire import CODECS
from .rl.settings import host_cores, thread_plan

log = logging.getLogger("gossiprl.launch")

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
"""torchrun's RANK comes before Slurm's: under `srun torchrun` every process torchrun starts on a
node inherits that node's one SLURM_PROCID, while RANK is each process's own."""

LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
"""How many processes the launcher starts per host (torchrun, Slurm, Open MPI, MPICH), in the same
precedence as RANK_VARIABLES."""

LOCAL_HEARTBEAT_S = 0.25
"""Heartbeat of agents that share a host with their broker. At the end of a run the launcher
closes the broker, and an agent parked on a turn lock notices after 3 silent heartbeats;
pings are cheap on one host, so they come often and the swarm stops within a second."""


PEER_TIMEOUT_S = 60.0
"""Seconds of silence after which the local broker declares an agent gone (the broker's default)."""

MAX_HEARTBEAT_S = 10.0
"""The stretched heartbeat's ceiling: a broker that really died is still noticed within 30 s."""

AGENT_MEMORY_MB = 130
"""Resident memory of one CartPole agent process (torch, gymnasium, the model): 100 agents took
12.5 GB. Atari agents take more."""


@dataclass
class HostLoad:
    """How hard a swarm of ``agents`` processes presses on ``cores``, and the timeouts that allow for it.

    With more agents than cores each agent gets ``cores / agents`` of a core, so everything it
    does (starting up, one update, answering a ping) takes ``oversubscription`` times longer;
    with the one-core timeouts, starving agents were declared gone and rejoined over and over
    (100 agents on 2 cores: load 80, exit 1). Heartbeat and timeouts stretch by that factor."""

    agents: int
    cores: int

    @property
    def oversubscription(self) -> float:
        return max(1.0, self.agents / max(1, self.cores))

    @property
    def heartbeat(self) -> float:
        return min(LOCAL_HEARTBEAT_S * self.oversubscription, MAX_HEARTBEAT_S)

    @property
    def peer_timeout(self) -> float:
        return PEER_TIMEOUT_S * self.oversubscription

    def gossip_timeout(self, asked: float) -> float:
        return asked * self.oversubscription

    def warning(self) -> str | None:
        """What to expect and what to do, when there are more agents than cores; None otherwise."""
        if self.agents <= self.cores:
            return None
        x = self.oversubscription
        return (
            f"warning: {self.agents} agents on {self.cores} core(s): each gets {1 / x:.2g} of a core, so expect "
            f"every agent to run ~{x:.3g}x slower than alone, a slow start and about "
            f"{self.agents * AGENT_MEMORY_MB / 1000:.1f} GB of memory in all; heartbeat {self.heartbeat:.2g}s and "
            f"peer timeout {self.peer_timeout:.0f}s are stretched {x:.3g}x so starving agents are not declared "
            f"gone. For speed, run at most {self.cores} agent(s) here or spread the swarm over hosts "
            f"(gossiprl broker + gossiprl agent)."
        )


class RunError(RuntimeError):
    """A run that cannot start as asked; the message says why and what to do instead."""


TRANSPORTS = ("ipc", "tcp")


def return_target(value) -> float | str | None:
    """--stop-at-return's values: a number, 'auto' (the env's reward threshold, which `gossiprl run`
    looks up before it starts) or 'none' / None (never)."""
    if value is None or value == "none":
        return None
    if value == "auto":
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r}: give a number, 'auto' or 'none'") from None


@dataclass
class SwarmConfig:
    """A swarm on one host; with AgentConfig (gossiprl.rl.settings), all that ``run`` needs.

    Fields marked ``may_change_on_resume`` are how long and how the swarm runs, not what it
    learns: a resumed run may take new values for them (``gossiprl.config.resume_values``)."""

    agents: int = field(default=4, metadata={"min": 1, "short": "-n"})
    """Number of agents; 1 with no topology is plain A2C (no broker)."""
    total_frames: int = field(default=2_000_000, metadata={"min": 1, "may_change_on_resume": True})
    """Frames for the whole swarm, split evenly: each agent trains total_frames // agents (its
    AgentConfig.total_frames, which run sets). Counted over a resume, so resuming with a larger
    budget extends the run. Atari frames count the 4 skipped frames, as the papers do."""
    topology: str | None = field(default=None, metadata={"metavar": "NAME|FILE"})
    """A family (ring, sparse, full, ...: `gossiprl topology table` lists them) or a .npy/.csv
    row-stochastic mixing matrix. None: ring with several agents, plain A2C with one."""
    peers: int | None = field(default=None, metadata={"min": 1})
    """Out-peers per agent for the sparse topology (default ceil(log2 n))."""
    time_varying: bool = False
    """Sparse, hypercube: one rotating peer per round, as GALA/SGP."""
    peers_per_round: int | None = field(default=None, metadata={"min": 1})
    """GALA/SGP families: phone-book entries used per round (their peers_per_itr; default 1)."""
    topology_options: dict = field(default_factory=dict, metadata={"flag": "--option", "metavar": "KEY=VALUE"})
    """Any other integer option of the family, e.g. degree=4, seed=1 (random-regular), rows=2 (torus)."""
    mode: str = field(default="sync", metadata={"choices": MODES})
    """sync: PALA's turn locks; async: GALA-style non-blocking (but see max_staleness)."""
    max_staleness: int | None = field(default=None, metadata={"min": 1})
    """async: an agent waits for an in-peer after this many rounds without its letter."""
    codec: str = field(default="raw", metadata={"choices": CODECS})
    """Parameters on the wire: raw float32, or bf16 / fp16 (half the bytes)."""
    transport: str = field(default="ipc", metadata={"choices": TRANSPORTS, "may_change_on_resume": True})
    """ipc (a unix socket in a 0700 directory, fastest on one host) or tcp (loopback, with
    throwaway CURVE keys: loopback is open to every user of the host)."""
    data_plane: str = field(default="broker", metadata={"choices": PLANES, "may_change_on_resume": True})
    """Where parameter bytes travel: through the broker, shared memory (shm), agent to agent
    (direct), or auto (shm on one host, direct across hosts). PROTOCOL.md section 10."""
    gossip_timeout: float = field(default=60.0, metadata={"min": 0, "min_open": True, "may_change_on_resume": True})
    """Seconds an agent waits for a turn lock before it skips the round and trains on."""
    stop_at_return: float | None = field(
        default=None,
        metadata={
            "parse": return_target,
            "cli_default": "auto",
            "metavar": "RETURN|auto|none",
            "may_change_on_resume": True,
        },
    )
    """Stop the swarm once the mean of the last 100 episodes of all agents pooled reaches this;
    None: never. `gossiprl run` defaults to 'auto', the env's reward threshold; the library
    default is None, so studies compare settings at equal frames."""
    max_seconds: float | None = field(default=None, metadata={"min": 0, "min_open": True, "may_change_on_resume": True})
    """Stop the swarm after this much wall-clock time (this session's)."""
    fail_fast: bool = field(default=False, metadata={"may_change_on_resume": True})
    """Stop every agent when one fails; by default the others carry on, rewired around it."""

    def __post_init__(self):
        if self.topology is None and self.agents > 1:
            self.topology = "ring"


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


def agents_per_host_from_environment(explicit: int | None) -> int:
    """--agents-per-host, else the launcher's processes per host, else 1.

    Each agent takes cores / agents-per-host torch threads, so a launcher that starts several
    agents on a host must be counted, or they all take every core and slow each other down."""
    return local_size_from_environment(explicit) or 1


def local_size_from_environment(explicit: int | None) -> int | None:
    """--agents-per-host, else the launcher's processes per host, else None: nobody said."""
    if explicit is not None:
        return explicit
    for name in LOCAL_SIZE_VARIABLES:
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return None


def agents_sharing_host(address: str, swarm_size: int) -> int | None:
    """How many agents to size torch threads for when nobody said: the whole swarm when the
    broker is reached over loopback (or ipc), else None (unknown: one agent per host).

    A broker on loopback runs on this host, and agents that reach it that way do too: the
    README's one-host example (100k frames per agent, 2 cores) took 80.0 s instead of 11.0 s with
    each of its two agents taking every core."""
    return swarm_size if swarm_size > 1 and keys.is_loopback(address) else None


def prepare_run_dir(run_dir: Path, resume: bool, config: dict) -> None:
    """Refuse to mix two runs in one directory; write config.json atomically.

    On resume config.json is rewritten too: it records what the run is now, e.g. a budget the
    resume extended (the flags that may change on resume are ``gossiprl.config``'s business)."""
    config_path = run_dir / "config.json"
    if resume:
        if not config_path.exists():
            raise RunError(f"cannot resume: {run_dir} holds no run (no config.json)")
        try:
            trained_on = json.loads(config_path.read_text())["agent"]["env_id"]
        except (ValueError, KeyError, TypeError, OSError) as err:
            raise RunError(f"cannot resume: {config_path} is unreadable ({type(err).__name__}: {err})") from None
        asked = config["agent"]["env_id"]
        if trained_on != asked:
            raise RunError(
                f"cannot resume: {run_dir} was trained on {trained_on}, this run asks for {asked}; "
                f"resume with --env {trained_on} or choose another --run-dir"
            )
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise RunError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = config_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2, default=str))
    os.replace(tmp, config_path)


def private_endpoint(directory: Path, transport: str) -> tuple[str, tuple | None, tuple | None]:
    """Where a local swarm's broker binds so that other users of this host cannot join it.

    ``directory`` must be private (mode 0700, as tempfile makes it). ipc: the socket file lives
    in it, out of other users' reach. tcp: loopback is open to every local user, so the swarm
    gets throwaway CURVE keys, kept in it: (bind, the broker's curve, the agents' curve).
    """
    if transport == "ipc":
        return f"ipc://{directory}/broker", None, None
    keys.generate(directory / "broker", "broker")
    keys.generate(directory / "agents", "agent")
    return (
        "tcp://127.0.0.1:0",
        (directory / "broker" / "broker.key_secret", directory / "agents"),
        (directory / "agents" / "agent.key_secret", directory / "broker" / "broker.key"),
    )


def _agent_process(
    rank,
    address,
    n,
    agent_cfg,
    run_dir,
    resume,
    gossip_timeout,
    heartbeat,
    codec,
    curve,
    stop_pipe,
    report_pipe,
    private_dir,
):
    """Body of the process ``agent-<rank>``: train, gossiping through the broker at ``address``.

    The launcher talks to it over two plain pipes rather than a multiprocessing Event and Queue:
    those are named POSIX semaphores, which a launcher killed with -9 can never unlink (the
    resource tracker then cleans them up and warns of leaked semaphores). ``stop_pipe`` turns
    readable when the launcher says stop, and at EOF when the launcher is gone; an agent left
    behind that way also removes the launcher's ``private_dir``, which no one else will."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; Ctrl-C reaches it
    from .rl.agent import train

    stop = threading.Event()
    threading.Thread(target=_watch_launcher, args=(stop_pipe, stop), name="launcher-watch", daemon=True).start()
    reports = _Reporter(report_pipe)
    gossip = None
    try:
        if address is not None:
            client = GossipClient(
                address,
                rank,
                n=n,
                timeout=gossip_timeout,
                codec=codec,
                heartbeat=heartbeat,
                takeover=resume,
                curve=curve,
            )
            gossip = Gossip(
                client,
                aggregate=agent_cfg.aggregate,
                deviation_bound=agent_cfg.deviation_bound,
                overlap=agent_cfg.gossip_overlap,
            )
        summary = train(
            agent_cfg,
            run_dir,
            rank=rank,
            gossip=gossip,
            resume=resume,
            stop=stop,
            progress=lambda report: reports.put(("progress", rank, report)),
        )
        reports.put(("done", rank, summary))
    except BaseException:
        reports.put(("failed", rank, traceback.format_exc(limit=8)))
        raise SystemExit(1) from None
    finally:
        if gossip is not None:
            gossip.close()
        if not mp.parent_process().is_alive():
            shutil.rmtree(private_dir, ignore_errors=True)


def _watch_launcher(stop_pipe, stop: threading.Event) -> None:
    """Set ``stop`` when the launcher says so, or dies without a word (kill -9: EOF on the pipe):
    the agent then stops after this update, checkpoints and exits."""
    mp.connection.wait([stop_pipe, mp.parent_process().sentinel])
    stop.set()


class _Reporter:
    """An agent's end of its report pipe. A launcher that is gone makes a report fail, and that
    must not cost the agent its final checkpoint: what cannot be reported is dropped."""

    def __init__(self, pipe):
        self._pipe = pipe

    def put(self, report: tuple) -> None:
        try:
            self._pipe.send(report)
        except OSError:
            pass


class _LauncherStop:
    """The launcher's stop for its agents: one pipe whose read end every agent holds and none
    reads, so one byte written makes it readable for all of them."""

    def __init__(self, ctx):
        self.reader, self._writer = ctx.Pipe(duplex=False)
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._writer.send_bytes(b"stop")

    def is_set(self) -> bool:
        return self._set


class _Reports:
    """The agents' reports, one pipe per agent: ``get`` returns the next (kind, rank, payload)
    or raises queue.Empty after ``timeout``. An agent that exited leaves EOF on its pipe, which is
    dropped (its death is noticed from its process)."""

    def __init__(self):
        self._readers: list = []

    def add(self, reader) -> None:
        self._readers.append(reader)

    def get(self, timeout: float) -> tuple:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._readers:
                time.sleep(max(left, 0))
                raise queue.Empty
            for reader in mp.connection.wait(self._readers, left):
                try:
                    return reader.recv()
                except EOFError:
                    self._readers.remove(reader)
                    reader.close()


def run(
    swarm: SwarmConfig,
    agent_cfg,
    run_dir: Path,
    resume: bool = False,
    echo=print,
    show_progress: bool = True,
    track: dict | None = None,
    metrics_port: int | socket.socket | None = None,
) -> dict:
    """Train a swarm on this host; returns (and writes) summary.json's contents.

    The swarm's budget is ``swarm.total_frames``: each agent's ``total_frames`` (and its
    ``agents_per_host``) is set from the swarm, whatever ``agent_cfg`` held. ``track``
    ({"project", "entity"}) mirrors the swarm's TensorBoard run to Weights & Biases;
    ``metrics_port`` serves the broker's stats on loopback (``gossiprl top``, Prometheus): a port,
    or a socket ``monitor.listen`` bound already."""
    from dataclasses import replace

    from .rl.swarmlog import SwarmLog

    topo = make_topology(swarm) if swarm.topology is not None else None
    agent_cfg = replace(
        agent_cfg, agents_per_host=swarm.agents, total_frames=max(1, swarm.total_frames // swarm.agents)
    )
    load = HostLoad(swarm.agents, host_cores())
    if load.warning():
        echo(load.warning())
    run_dir = Path(run_dir)
    listener = None
    if topo is not None and metrics_port is not None:  # before the run dir: a port in use leaves nothing behind
        from .monitor import listen

        try:
            listener = metrics_port if isinstance(metrics_port, socket.socket) else listen(metrics_port)
        except OSError as err:
            raise RunError(f"cannot serve stats on 127.0.0.1:{metrics_port}: {err.strerror}") from None
    earlier = _earlier_summary(run_dir) if resume else {}
    earlier_wall = earlier["wall_seconds"] if type(earlier.get("wall_seconds")) in (int, float) else 0.0
    earlier_return = earlier["mean_return"] if type(earlier.get("mean_return")) in (int, float) else math.nan
    prepare_run_dir(
        run_dir,
        resume,
        {"swarm": asdict(swarm), "agent": asdict(agent_cfg), "topology": topo.to_dict() if topo else None},
    )
    if resume and not any((run_dir / f"agent-{r}" / "checkpoint.pt").exists() for r in range(swarm.agents)):
        # Each agent would wait to adopt its neighbours' parameters, and none has any: a deadlock.
        echo(f"no agent of {run_dir} wrote a checkpoint before it stopped: its agents start afresh")
        resume = False
    swarm_log = SwarmLog(run_dir, {"swarm": asdict(swarm), "agent": asdict(agent_cfg)}, track)
    ctx = mp.get_context("spawn")
    stop, reports = _LauncherStop(ctx), _Reports()
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
        agent_curve = None
        if topo is not None:
            bind, broker_curve, agent_curve = private_endpoint(Path(tmp), swarm.transport)
            broker = Broker(
                topo,
                bind=bind,
                mode=swarm.mode,
                max_staleness=swarm.max_staleness,
                peer_timeout=load.peer_timeout,
                curve=broker_curve,
                data_plane=swarm.data_plane,
            ).start()
        stats_server = None
        if listener is not None:
            from .monitor import StatsServer

            stats_server = StatsServer(broker.stats, listener)
            echo(f"broker stats on {stats_server.address}/metrics; watch with `gossiprl top {stats_server.address}`")
        bar = _progress_bar(swarm.agents * agent_cfg.total_frames, show_progress)
        try:
            for rank in range(swarm.agents):
                reader, writer = ctx.Pipe(duplex=False)
                reports.add(reader)
                procs[rank] = ctx.Process(
                    target=_agent_process,
                    name=f"agent-{rank}",
                    args=(
                        rank,
                        broker.address if broker else None,
                        swarm.agents,
                        agent_cfg,
                        str(run_dir),
                        resume,
                        load.gossip_timeout(swarm.gossip_timeout),
                        load.heartbeat,
                        swarm.codec,
                        agent_curve,
                        stop.reader,
                        writer,
                        tmp,
                    ),
                )
                procs[rank].start()
                writer.close()  # the agent holds the only write end: its pipe reads EOF once it is gone
            while len(summaries) + len(failures) < swarm.agents:
                if (
                    swarm.max_seconds is not None
                    and time.perf_counter() - start > swarm.max_seconds
                    and not stop.is_set()
                ):
                    stopped_by = f"time limit of {swarm.max_seconds:g}s"
                    stop.set()
                try:
                    kind, rank, payload = reports.get(timeout=0.5)
                except queue.Empty:
                    kind = None
                if kind == "progress":
                    progress.add(rank, payload)
                    swarm_log.add(rank, payload)
                    swarm_log.write(broker.stats() if broker else None)
                    bar(progress)
                    if (
                        swarm.stop_at_return is not None
                        and len(progress.returns) == 100
                        and progress.mean_return >= swarm.stop_at_return
                        and not stop.is_set()
                    ):
                        stopped_by = f"solved: mean return {progress.mean_return:.1f} >= {swarm.stop_at_return}"
                        solved_at = {
                            "frames": progress.total_frames,
                            "session_wall_seconds": time.perf_counter() - start,
                            "mean_return": progress.mean_return,
                        }
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
                    if broker is not None:  # release at once the locks that wait on it, whether or not we stop
                        broker.declare_gone(rank)
                    if swarm.fail_fast:
                        stopped_by = f"agent-{rank} failed (--fail-fast)"
                        stop.set()
                    elif broker is not None and len(failures) + len(summaries) < swarm.agents:
                        echo(f"carrying on with the other agents; the topology is rewired around agent-{rank}")
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
            swarm_log.write(broker.stats() if broker else None, force=True)
            if stats_server is not None:
                stats_server.close()
            if broker is not None:
                broker.close()
            bar(None)
    wall = time.perf_counter() - start
    frames = sum(s["frames"] for s in summaries.values())
    # Earlier sessions of a resumed run: the last summary.json's wall_seconds, or where a launcher
    # killed outright wrote none since, the longest any agent had trained (its checkpoint's wall_s,
    # which leaves out only the seconds each session spends starting its agents).
    before = max([earlier_wall, *(s["run_wall_seconds"] - s["wall_seconds"] for s in summaries.values())])
    if solved_at is not None:
        solved_at["wall_seconds"] = before + solved_at["session_wall_seconds"]
    summary = {
        "frames": frames,
        "wall_seconds": before + wall,
        "session_wall_seconds": wall,
        "fps": sum(s["fps"] * s["wall_seconds"] for s in summaries.values()) / wall,
        "time_definition": "frames and wall_seconds cover every session of the run; session_wall_seconds "
        "and fps only this one: fps is the frames trained in it over its seconds",
        "mean_return": progress.mean_return if progress.returns else earlier_return,
        "mean_return_definition": "mean of the last 100 episodes of all agents pooled (the stop rule); "
        "agents_mean_return / agents_min_return: mean and worst of each agent's "
        "own last-100 mean; consensus_return: the consensus policy (the mean of the agents' final "
        f"parameters) over {CONSENSUS_EPISODES} fresh episodes, as `gossiprl eval` scores it",
        "agents_mean_return": _mean([s["mean_return"] for s in summaries.values()]),
        "agents_min_return": min((s["mean_return"] for s in summaries.values()), default=math.nan),
        "consensus_return": None if stopped_by == "interrupted" else _consensus_return(run_dir, echo),
        "episodes": progress.episodes,
        "agents": swarm.agents,
        "stopped_by": stopped_by,
        "solved_at": solved_at,
        "gossip_share": progress.gossip_share,
        "per_agent": {rank: summaries[rank] for rank in sorted(summaries)},
        "failed": {rank: failures[rank].strip().splitlines()[-1] for rank in sorted(failures)},
    }
    tmp_path = run_dir / "summary.json.tmp"
    tmp_path.write_text(json.dumps(_finite(summary), indent=2, default=str, allow_nan=False))
    os.replace(tmp_path, run_dir / "summary.json")
    swarm_log.close(summary)
    return summary


def _earlier_summary(run_dir: Path) -> dict:
    """The run's last summary.json, every session before this one ({} if there is none to read):
    a resumed session that finishes no episode (its budget was already spent) keeps its return."""
    try:
        earlier = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return earlier if isinstance(earlier, dict) else {}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


CONSENSUS_EPISODES = 10
"""Fresh episodes the consensus policy plays when a run ends: `gossiprl eval`'s default, so summary.json
holds the figure `gossiprl eval` prints for it (same episodes, seeds and sampled actions)."""


def _consensus_return(run_dir: Path, echo) -> float | None:
    """The consensus policy's mean return, for summary.json beside the agents' own; None where no agent
    left a checkpoint or Ctrl-C cut the scoring short (a run that was interrupted is not scored)."""
    from .rl.consensus import evaluate_consensus

    echo(f"scoring the consensus policy (the mean of the agents' parameters) over {CONSENSUS_EPISODES} episodes")
    try:
        return evaluate_consensus(run_dir, episodes=CONSENSUS_EPISODES)["mean"]
    except KeyboardInterrupt:  # the run itself is over: its summary is still written
        echo("consensus policy not scored: interrupted")
    except (FileNotFoundError, ValueError) as err:
        echo(f"consensus policy not scored: {err}")
    return None


def _finite(value):
    """summary.json is strict JSON: NaN and infinity (no episode finished, say) are written null.
    (json.dumps writes a float NaN as the bare word NaN, which no strict reader takes.)"""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


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
    try:
        return topologies.from_spec(
            swarm.topology,
            swarm.agents,
            peers=swarm.peers,
            time_varying=swarm.time_varying,
            peers_per_round=swarm.peers_per_round,
            **swarm.topology_options,
        )
    except topologies.TopologyError as err:
        raise RunError(str(err)) from None


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
        bar.set_postfix_str(_postfix(progress), refresh=False)

    return update


def _postfix(progress: Progress) -> str:
    means = progress.agent_means
    own = f" (agents {min(means):.0f}-{max(means):.0f})" if len(means) > 1 else ""
    return f"return {format_return(progress.mean_return)}{own}  gossip {100 * progress.gossip_share:.0f}%"


NO_EPISODE = "n/a (no episode finished yet)"


def format_return(value: float | None) -> str:
    """A mean return for a person to read: Atari episodes last minutes, and until the first one
    ends there is no return to show; 'nan' there reads like a diverged run."""
    return NO_EPISODE if value is None or math.isnan(value) else f"{value:.1f}"


def run_agent(
    address: str,
    rank: int,
    agent_cfg,
    run_dir: Path,
    resume: bool = False,
    gossip_timeout: float = 60.0,
    codec: str = "raw",
    stop=None,
    connect_timeout: float = 120.0,
    echo=print,
    progress_every: float = 10.0,
    size_from_swarm: bool = False,
    **client_options,
) -> dict:
    """One agent of a multi-host swarm (the PALA layout): the broker runs elsewhere.

    Agents of a batch job may start before their broker, so registration is retried for
    ``connect_timeout`` seconds, or until ``stop`` is set (Ctrl-C, SIGTERM: each try lasts one
    liveness window, 3 s by default); a refusal that would only repeat (a rank the swarm does not
    have, a CURVE key the broker does not admit) ends it at once with the broker's reason.
    ``resume`` continues from this rank's checkpoint, or from the neighbours' parameters when
    there is none, and takes the rank over from a registration the broker may still hold for
    this agent's previous, dead process. Every ``progress_every`` seconds (0: never) it prints a
    progress line, as ``run``'s bar does for a swarm on one host. ``size_from_swarm`` (nobody
    said how many agents share this host) sizes torch threads by ``agents_sharing_host``, and says so.
    """
    from dataclasses import replace

    from .rl.agent import train

    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            client = GossipClient(address, rank, timeout=gossip_timeout, codec=codec, takeover=resume, **client_options)
            break
        except GossipError as err:  # a rank the swarm does not have, a mismatching topology: asking again won't help
            raise RunError(f"agent-{rank}: the broker at {address} refused it: {err}") from None
        except BrokerUnavailable as err:
            if "the broker refused" in str(err):  # a key or mechanism it will refuse every time
                raise RunError(f"agent-{rank}: {err}; not retrying") from None
            if stop is not None and stop.is_set():
                raise RunError(f"agent-{rank}: stopped while waiting for the broker at {address}") from None
            if time.monotonic() > deadline:
                raise RunError(f"no broker answered at {address} within {connect_timeout:g}s: {err}") from None
            echo(f"agent-{rank}: waiting for the broker ({err})")
    sharing = agents_sharing_host(address, client.topology.n) if size_from_swarm else None
    if sharing is not None and not agent_cfg.torch_threads:
        agent_cfg = replace(agent_cfg, agents_per_host=sharing)
        echo(
            f"agent-{rank}: the broker is on this host, so its {sharing} agents may share this host's "
            f"{host_cores()} core(s): {thread_plan(agent_cfg)['env']} env thread(s) each; pass --agents-per-host N "
            "to size it yourself"
        )
    gossip = Gossip(
        client,
        aggregate=agent_cfg.aggregate,
        deviation_bound=agent_cfg.deviation_bound,
        overlap=agent_cfg.gossip_overlap,
    )
    try:
        return train(
            agent_cfg,
            run_dir,
            rank=rank,
            gossip=gossip,
            resume=resume,
            stop=stop,
            progress=_progress_line(rank, echo, progress_every) if progress_every else None,
        )
    finally:
        gossip.close()


def _progress_line(rank: int, echo, every_s: float):
    """A report callback printing frames, frames/s since the last line, the mean of the last 100
    returns and the share of time in gossip. Frames count over a resume, so the rate is taken
    between two reports rather than from the session's start."""
    returns: deque = deque(maxlen=100)
    last: dict = {}

    def report(r: dict) -> None:
        returns.extend(r["returns"])
        if not last:
            last.update(r)
            return
        if r["wall_s"] - last["wall_s"] < every_s:
            return
        fps = (r["frames"] - last["frames"]) / (r["wall_s"] - last["wall_s"])
        last.update(r)
        mean = format_return(sum(returns) / len(returns) if returns else None)
        echo(
            f"agent-{rank}: {r['frames']:,} frames, {fps:,.0f} frames/s, return {mean}, "
            f"gossip {100 * r['gossip_s'] / max(r['wall_s'], 1e-9):.0f}%"
        )

    return report
