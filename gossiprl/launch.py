"""Start a swarm on this host (the GALA layout): a broker and one process per agent.

``run`` owns a ``Swarm``: a broker and one process per agent, named by role (``agent-3``), each
running the one agent entry point (``agent_process.run_agent``) that `gossiprl agent` runs on
hosts of their own. Agent processes report to the launcher over a pipe each, ``reports``, with
("progress" | "done" | "failed", rank, payload) tuples; the launcher decides when the swarm
stops (total frames, the solve threshold over the last 100 episodes of all agents together,
Ctrl-C or SIGTERM, a crashed agent under ``fail_fast``) and tells agents through one pipe,
``stop``. A crashed agent is named, with its traceback, and the broker rewires the survivors
around it. Children are joined in ``finally``: no orphans.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.reduction
import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import zmq

import topologies

from .agent_process import NO_EPISODE, format_return, run_agent
from .comms import keys
from .comms.broker import Broker
from .comms.settings import PEER_TIMEOUT_S, ClientConfig
from .hosts import (
    LOCAL_BROKER_GRACE_S,
    LOCAL_HEARTBEAT_S,
    LOCAL_SIZE_VARIABLES,
    MAX_HEARTBEAT_S,
    RANK_VARIABLES,
    HostLoad,
    RunError,
    agents_per_host_from_environment,
    local_size_from_environment,
    rank_from_environment,
)
from .rl.settings import host_cores, with_unset_from
from .settings import RECORDS_LEARNER, TRANSPORTS, SwarmConfig, learned_with, return_target

__all__ = [  # the swarm's own names, and the roles' that callers of gossiprl.launch have always found here
    "LOCAL_HEARTBEAT_S",
    "LOCAL_SIZE_VARIABLES",
    "MAX_HEARTBEAT_S",
    "NO_EPISODE",
    "PEER_TIMEOUT_S",
    "RANK_VARIABLES",
    "TRANSPORTS",
    "HostLoad",
    "Progress",
    "RunError",
    "Swarm",
    "SwarmConfig",
    "Timings",
    "agents_per_host_from_environment",
    "format_return",
    "local_size_from_environment",
    "make_topology",
    "prepare_run_dir",
    "private_endpoint",
    "rank_from_environment",
    "return_target",
    "run",
    "run_agent",
]

LAUNCHER_JOIN_S = 30
"""How long the launcher waits for an agent told to stop (it finishes its update and
checkpoints) before it terminates the process."""
BYE_WAIT_S = 5.0
"""How long the launcher waits, after its agents exited, for the broker to have read the BYE of
each that finished (an agent whose BYE was lost costs the run this much at its end)."""


def make_topology(swarm: SwarmConfig):
    """The swarm's topology (``SwarmConfig.make_topology``), or a RunError that says what is valid."""
    try:
        return swarm.make_topology()
    except topologies.TopologyError as err:
        raise RunError(str(err)) from None


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


def prepare_run_dir(run_dir: Path, resume: bool, config: dict) -> None:
    """Refuse to mix two runs in one directory; write config.json atomically.

    On resume config.json is rewritten too: it records what the run is now, e.g. a budget the
    resume extended (the flags that may change on resume are ``gossiprl.config``'s business)."""
    config_path = run_dir / "config.json"
    if resume:
        if not config_path.exists():
            raise RunError(f"cannot resume: {run_dir} holds no run (no config.json)")
        try:
            earlier = json.loads(config_path.read_text())["agent"]
            trained_on, trained_by = earlier["env_id"], earlier.get("algo") or "a2c"
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as err:
            raise RunError(f"cannot resume: {config_path} is unreadable ({type(err).__name__}: {err})") from None
        asked = config["agent"]["env_id"]
        if trained_on != asked:
            raise RunError(
                f"cannot resume: {run_dir} was trained on {trained_on}, this run asks for {asked}; "
                f"resume with --env {trained_on} or choose another --run-dir"
            )
        if trained_by != config["agent"]["algo"]:
            raise RunError(
                f"cannot resume: {run_dir} was trained by {trained_by}, this run asks for {config['agent']['algo']}; "
                f"resume with --algo {trained_by} or choose another --run-dir"
            )
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise RunError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = config_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2, default=str))
    os.replace(tmp, config_path)


def _resumed_learner(run_dir: Path, agent_cfg):
    """``agent_cfg`` with its learner's settings left to the env's default (None) as the run in
    ``run_dir`` asked for or learned them (its config.json: the ``agent`` section, then
    ``settings.learned_with``), as `gossiprl run --resume` passes them; a caller of the Python API
    may leave them unset. A run dir without a readable config.json is ``prepare_run_dir``'s to refuse."""
    try:
        data = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return agent_cfg
    if not isinstance(data, dict) or not isinstance(data.get("agent"), dict):
        return agent_cfg
    if (data["agent"].get("algo") or "a2c") != agent_cfg.algo:
        return agent_cfg
    try:
        learned = learned_with(data)
    except ValueError as err:
        raise RunError(f"cannot resume: {run_dir / 'config.json'}: {err}") from None
    return replace(agent_cfg, **{agent_cfg.algo: with_unset_from(getattr(agent_cfg, agent_cfg.algo), learned)})


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


AGENT_PRELOAD = ("gossiprl.rl.forkserver", "gossiprl.launch", "gossiprl.rl.agent", "torch._dynamo")
"""What the agents' forkserver imports once: torch and the agent loop, which each agent would
otherwise import again (about 3 s of CPU an agent on a 2-core VM: a ring of 4 started that much
slower, and the test suite, which starts a few hundred agents, minutes slower); and torch._dynamo,
which torch imports when the first optimizer is made (2-3 s of CPU more an agent, which four agents
starting together on 2 cores paid as some 10 s before their first update). ``gossiprl.rl.forkserver``
makes the server outlive a SIGTERM to the whole job, so the launcher can still see its agents' exits."""


def agent_context():
    """The multiprocessing context agents start from: on Linux a forkserver that has imported
    ``AGENT_PRELOAD``, elsewhere spawn (macOS's system libraries are not safe to fork once loaded,
    and torch loads them). Both start every agent from a process without the launcher's threads,
    sockets or broker (a plain fork would copy them); the forkserver only saves the imports."""
    if not sys.platform.startswith("linux"):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(AGENT_PRELOAD))
    return ctx


class LauncherStreams:
    """The launcher's stdout and stderr as they are when an agent starts, passed to the agent
    (multiprocessing sends the descriptors along) and made its own as it unpickles its arguments:
    a forkserver's children would otherwise write where the launcher's streams pointed when the
    server started (an earlier test's captured output, a redirect since undone)."""

    def __reduce__(self):
        return _adopt_streams, tuple(mp.reduction.DupFd(fd) if _is_open(fd) else None for fd in (1, 2))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _adopt_streams(*passed) -> None:
    for target, fd in zip((1, 2), passed):
        if fd is not None:
            got = fd.detach()
            os.dup2(got, target)
            os.close(got)


def _agent_process(
    rank, address, swarm, agent_cfg, run_dir, resume, load, curve, stop_pipe, report_pipe, private_dir, environ, _std
):
    """Body of the process ``agent-<rank>``: ``run_agent``, gossiping through the broker at ``address``.

    ``environ`` is the launcher's environment when it started this agent: a forkserver's children
    inherit the server's, which is the launcher's when the server started (multiprocessing already
    carries over sys.path and the working directory, as spawn does; ``LauncherStreams`` the
    launcher's stdout and stderr, as it unpickles).

    The launcher talks to it over two plain pipes rather than a multiprocessing Event and Queue:
    those are named POSIX semaphores, which a launcher killed with -9 can never unlink (the
    resource tracker then cleans them up and warns of leaked semaphores). ``stop_pipe`` turns
    readable when the launcher says stop, and at EOF when the launcher is gone; an agent left
    behind that way also removes the launcher's ``private_dir``, which no one else will."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; Ctrl-C reaches it
    stop = threading.Event()
    # A scheduler's SIGTERM reaches every process of the job (scancel, systemd, docker stop): stop as the
    # launcher would have us, with a final checkpoint, as a standalone `gossiprl agent` does.
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
        tempfile.tempdir = None  # read TMPDIR again
    threading.Thread(target=_watch_launcher, args=(stop_pipe, stop), name="launcher-watch", daemon=True).start()
    reports = _Reporter(report_pipe)
    client = ClientConfig(heartbeat=load.heartbeat, connect_timeout=None)  # the launcher started the broker first
    try:
        summary = run_agent(
            address,
            rank,
            agent_cfg,
            run_dir,
            resume=resume,
            gossip_timeout=load.gossip_timeout(swarm.gossip_timeout),
            codec=swarm.codec,
            stop=stop,
            connect_timeout=client.connect_timeout,
            progress=lambda report: reports.put(("progress", rank, report)),
            n=swarm.agents,
            heartbeat=client.heartbeat,
            broker_grace=LOCAL_BROKER_GRACE_S,  # the broker is a thread of the launcher, and pauses with it
            curve=curve,
        )
        reports.put(("done", rank, summary))
    except BaseException:
        reports.put(("failed", rank, traceback.format_exc(limit=8)))
        raise SystemExit(1) from None
    finally:
        _deliver_what_is_sent()
        if not mp.parent_process().is_alive():
            shutil.rmtree(private_dir, ignore_errors=True)


def _deliver_what_is_sent(timeout: float = BYE_WAIT_S) -> None:
    """Let ZeroMQ deliver what the agent's closed sockets still hold (its BYE) before the process
    ends. A forkserver's child ends with os._exit, which takes ZeroMQ's I/O thread with it: the
    BYE was lost, and the broker counted a cleanly finished agent as not having left. ``term``
    waits out each closed socket's linger; a socket left open would make it wait forever, hence
    the thread and the bound."""
    ctx = zmq.Context.instance()
    done = threading.Thread(target=ctx.term, name="zmq-term", daemon=True)
    done.start()
    done.join(timeout)


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
        self._readers: dict = {}
        """rank -> the read end of its pipe."""

    def add(self, rank: int, reader) -> None:
        self._readers[rank] = reader

    def get(self, timeout: float) -> tuple:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._readers:
                time.sleep(max(left, 0))
                raise queue.Empty
            for reader in mp.connection.wait(list(self._readers.values()), left):
                try:
                    return reader.recv()
                except (EOFError, OSError):  # OSError: a message cut off by its sender's death (kill -9)
                    self._close(reader)

    def left_by(self, rank: int) -> list[tuple]:
        """What an agent that has exited sent and ``get`` has not yet returned: all of it is in its
        pipe by now. Its final report may wait there behind another agent's that ``get`` took first."""
        reader, left = self._readers.get(rank), []
        while reader is not None and reader.poll():
            try:
                left.append(reader.recv())
            except (EOFError, OSError):
                self._close(reader)
                break
        return left

    def _close(self, reader) -> None:
        self._readers = {rank: r for rank, r in self._readers.items() if r is not reader}
        reader.close()


@dataclass
class Timings:
    """The run's clock: the sessions before this one (from the last summary.json, or the agents'
    checkpoints) and this session's, which starts when the launcher starts its broker."""

    earlier: float = 0.0
    """Wall seconds of the run's earlier sessions."""
    start: float = field(default_factory=time.perf_counter)

    def session(self) -> float:
        """Seconds since this session started."""
        return time.perf_counter() - self.start

    def before(self, summaries: dict[int, dict]) -> float:
        """The earlier sessions' seconds: the last summary.json's, or where a launcher killed outright
        wrote none since, the longest any agent had trained (its checkpoint's wall_s, which leaves
        out only the seconds each session spends starting its agents)."""
        return max([self.earlier, *(s["run_wall_seconds"] - s["wall_seconds"] for s in summaries.values())])


class Swarm:
    """A broker and one process per agent on this host, and what they reported.

    ``start`` starts them, ``watch`` follows the reports until every agent is done or failed,
    stopping the swarm when a stop rule says so, and ``close`` (always, in ``finally``) tells the
    agents to stop, joins them and closes the broker."""

    _ctrl_c_handler = None
    """SIGINT's handler before ``_hold_ctrl_c`` held Ctrl-C; ``release_ctrl_c`` puts it back."""

    def __init__(self, cfg: SwarmConfig, agent_cfg, run_dir: Path, resume: bool, load: HostLoad, echo):
        self.cfg, self.agent_cfg, self.load = cfg, agent_cfg, load
        self.run_dir, self.resume, self.echo = run_dir, resume, echo
        self._ctx = agent_context()
        self.stop, self.reports = _LauncherStop(self._ctx), _Reports()
        self.progress = Progress(cfg.agents)
        self.procs: dict[int, mp.Process] = {}
        self.broker: Broker | None = None
        self.stats_server = None
        self.summaries: dict[int, dict] = {}
        self.failures: dict[int, str] = {}
        self._reported: set[int] = set()
        self.stopped_by = "total frames"
        self.solved_at: dict | None = None
        self.join_s = LAUNCHER_JOIN_S
        """How long ``close`` waits for each agent to leave before it kills it: none after a Ctrl-C during the stop."""
        self._followers: tuple | None = None
        """(timings, swarm log, progress bar) once ``watch`` began: every progress report goes to them."""

    @property
    def finished(self) -> bool:
        return len(self.summaries) + len(self.failures) >= self.cfg.agents

    def start(self, topo, private_dir: str, listener) -> None:
        """The broker (with ``topo``; none for a swarm that does not gossip) and, once it serves, the agents."""
        agent_curve = None
        if topo is not None:
            bind, broker_curve, agent_curve = private_endpoint(Path(private_dir), self.cfg.transport)
            self.broker = Broker(
                topo,
                bind=bind,
                mode=self.cfg.mode,
                max_staleness=self.cfg.max_staleness,
                peer_timeout=self.load.peer_timeout,
                curve=broker_curve,
                data_plane=self.cfg.data_plane,
            ).start()
        if listener is not None:
            from .monitor import StatsServer

            self.stats_server = StatsServer(self.broker.stats, listener)
            address = self.stats_server.address
            self.echo(f"broker stats on {address}/metrics; watch with `gossiprl top {address}`")
        for rank in range(self.cfg.agents):
            self._start_agent(rank, agent_curve, private_dir)

    def _start_agent(self, rank: int, curve, private_dir: str) -> None:
        reader, writer = self._ctx.Pipe(duplex=False)
        self.reports.add(rank, reader)
        address = self.broker.address if self.broker else None
        # An agent that gossips and has no checkpoint rejoins from its neighbours' parameters; one that
        # does not gossip (--topology none) has none to take, and starts afresh beside those that go on:
        # agents that never wait for each other need not have checkpointed before the same stop.
        resume = self.resume and (
            self.broker is not None or (self.run_dir / f"agent-{rank}" / "checkpoint.pt").exists()
        )
        self.procs[rank] = self._ctx.Process(
            target=_agent_process,
            name=f"agent-{rank}",
            args=(rank, address, self.cfg, self.agent_cfg, str(self.run_dir), resume, self.load, curve)
            + (self.stop.reader, writer, private_dir, dict(os.environ), LauncherStreams()),
        )
        self.procs[rank].start()
        writer.close()  # the agent holds the only write end: its pipe reads EOF once it is gone

    def watch(self, timings: Timings, swarm_log, bar) -> None:
        """Follow the agents' reports until every agent is done or failed."""
        self._followers = (timings, swarm_log, bar)
        while not self.finished:
            if self.cfg.max_seconds is not None and timings.session() > self.cfg.max_seconds:
                self._stop(f"time limit of {self.cfg.max_seconds:g}s")
            self._take_report()
            self._notice_failures()

    def _stop(self, why: str) -> None:
        """Tell every agent to stop, for the first reason that comes."""
        if not self.stop.is_set():
            self.stopped_by = why
            self.stop.set()

    def _check_solved(self, timings: Timings) -> None:
        target, progress = self.cfg.stop_at_return, self.progress
        if target is None or len(progress.returns) < 100 or progress.mean_return < target or self.stop.is_set():
            return
        self.solved_at = {
            "frames": progress.total_frames,
            "session_wall_seconds": timings.session(),
            "mean_return": progress.mean_return,
        }
        self._stop(f"solved: mean return {progress.mean_return:.1f} >= {target}")

    def _take_report(self, timeout: float = 0.5) -> None:
        """Record the next report, if one comes within ``timeout``. A Ctrl-C or SIGTERM meanwhile is held
        until it is recorded (at most the timeout and the record): raised between the take and the
        record, it lost the report, and an agent that had finished was named failed."""
        with _signals_held():
            try:
                report = self.reports.get(timeout=timeout)
            except queue.Empty:
                return
            self._record(*report)

    def _record(self, kind: str, rank: int, payload) -> None:
        """One report, whichever way it was read (``watch``, a dead agent's pipe drained, the wait after
        Ctrl-C): a progress report also goes to the swarm log, the bar and the stop-at-return check."""
        if kind == "progress":
            self.progress.add(rank, payload)
            if self._followers is not None:
                timings, swarm_log, bar = self._followers
                swarm_log.add(rank, payload)
                swarm_log.write(self.broker_stats())
                bar(self.progress)
                self._check_solved(timings)
        elif kind == "done":
            self.summaries[rank] = payload
        else:
            self.failures[rank] = payload

    def _notice_failures(self) -> None:
        """Name each failed agent once; the broker rewires around it, or --fail-fast stops the swarm."""
        self._find_the_dead()
        for rank in sorted(self.failures.keys() - self._reported):
            self._reported.add(rank)
            self.echo(f"agent-{rank} failed: {self.failures[rank].strip()}")
            if self.broker is not None:  # release at once the locks that wait on it, whether or not we stop
                self.broker.declare_gone(rank)
            if self.cfg.fail_fast:
                self.stopped_by = f"agent-{rank} failed (--fail-fast)"
                self.stop.set()
            elif self.broker is not None and not self.finished:
                self.echo(f"carrying on with the other agents; the topology is rewired around agent-{rank}")

    def _find_the_dead(self) -> None:
        """Record as failed each agent whose process ended without a final report (killed outright: OOM,
        kill -9, a signal to the whole process group). What it sent before it died is read first: its
        final report may wait in its pipe behind another agent's."""
        for rank, p in self.procs.items():
            if p.is_alive() or rank in self.summaries or rank in self.failures:
                continue
            for report in self.reports.left_by(rank):  # read after the death was seen, so it is all there
                self._record(*report)
            if rank not in self.summaries and rank not in self.failures:
                self.failures[rank] = f"process exited with code {p.exitcode} without a report"

    def interrupted(self, timeout: float = 60) -> None:
        """Ctrl-C or SIGTERM: stop the agents and wait for their final reports (they checkpoint first),
        but not for agents the same signal ended (a scheduler signals the whole process group). A second
        Ctrl-C ends the wait: ``close`` then kills the agents still running, and the run still ends with
        its summary (it used to escape as click's "Aborted!", exit 1, with no summary.json)."""
        self.stopped_by = "interrupted"
        self.echo("\ninterrupted: stopping agents (they write a final checkpoint; Ctrl-C again stops them at once)")
        self.stop.set()
        deadline = time.monotonic() + timeout
        try:
            while not self.finished and time.monotonic() < deadline:
                self._take_report()
                self._find_the_dead()
        except KeyboardInterrupt:
            self._at_once()

    def _at_once(self) -> None:
        """A Ctrl-C while the agents stop: ``close`` kills those still running rather than wait for them."""
        if self.join_s:
            self.join_s = 0
            if not self.finished:
                self.stopped_by = "interrupted"
            self.echo("stopping at once: the agents still running are killed and keep their last periodic checkpoint")
            self._hold_ctrl_c()

    def _hold_ctrl_c(self) -> None:
        """From here the stop is bounded (a kill and a 5 s join per agent, the pipes' drain, the broker's
        close, summary.json): a Ctrl-C is only noted. Raised, it cut the stop short with no summary.json.
        ``release_ctrl_c`` puts the handler back."""
        if self._ctrl_c_handler is None and threading.current_thread() is threading.main_thread():
            self._ctrl_c_handler = signal.signal(signal.SIGINT, self._already_stopping)

    def release_ctrl_c(self) -> None:
        """SIGINT's own handler back: before the consensus scoring, which a Ctrl-C stops, and when the run ends."""
        if self._ctrl_c_handler is not None:
            signal.signal(signal.SIGINT, self._ctrl_c_handler)
            self._ctrl_c_handler = None

    def _already_stopping(self, signum, frame) -> None:
        self.echo("already stopping: the agents' summary is being written")

    def broker_stats(self) -> dict | None:
        return self.broker.stats() if self.broker else None

    def _await_byes(self, timeout: float = BYE_WAIT_S) -> None:
        """Give the broker's thread time to read the BYE of every agent that finished: an agent
        sends it as it exits, and on a loaded host the launcher can join the process first, so the
        final swarm log counted a cleanly finished agent as not having left."""
        deadline = time.monotonic() + timeout
        while self.broker is not None and time.monotonic() < deadline:
            agents = self.broker.stats()["agents"]
            if all(agents[rank]["said_bye"] for rank in self.summaries if rank in agents):
                return
            time.sleep(0.05)

    def close(self, swarm_log) -> None:
        """Stop and join every agent, killing those that do not leave (SIGTERM only stops them again),
        then close the broker. An agent killed here, or gone without a final report, is named failed
        (summary.json's "failed"), not left out unsaid. From the last join on a Ctrl-C is only noted,
        until ``release_ctrl_c``."""
        self._join_all()
        self._hold_ctrl_c()
        self._find_the_dead()
        self._await_byes()
        swarm_log.write(self.broker_stats(), force=True)
        if self.stats_server is not None:
            self.stats_server.close()
        if self.broker is not None:
            self.broker.close()

    def _join_all(self) -> None:
        """Join each agent, waiting ``join_s`` for it (none after a second Ctrl-C), then kill it."""
        self.stop.set()
        for p in self.procs.values():
            if p.pid is None:  # start() itself failed; its error is already on its way up
                continue
            try:
                p.join(timeout=self.join_s)
                _kill_if_alive(p)
            except KeyboardInterrupt:
                self._at_once()  # holds later Ctrl-Cs: this kill cannot be cut short again
                _kill_if_alive(p)


@contextlib.contextmanager
def _signals_held(signums=(signal.SIGINT, signal.SIGTERM)):
    """Note SIGINT and SIGTERM rather than act on them, then raise the noted ones again, in order, to
    the handler each would have reached (Ctrl-C's KeyboardInterrupt, ``cli.stop_on_sigterm``'s, or
    the default's exit). The first that raises ends it: two Ctrl-Cs within one hold are one, as are a
    SIGTERM and a Ctrl-C, and an error of the held code gives way to the stop. Signals reach Python's
    main thread only; a handler set outside Python is left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    held = {sig: signal.getsignal(sig) for sig in signums}
    held = {sig: handler for sig, handler in held.items() if handler is not None}
    for sig in held:
        signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        for sig in noted:
            signal.raise_signal(sig)


def _kill_if_alive(p: mp.Process) -> None:
    if p.is_alive():
        p.kill()
        p.join(5)


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
    or a socket ``monitor.listen`` bound already. Actor settings no IMPALA learner could start with
    raise ValueError before anything starts, as `gossiprl run` refuses them: each agent would
    otherwise fail on its own, once the run dir and the broker were made."""
    from .rl.learners import resolved
    from .rl.swarmlog import SwarmLog

    agent_cfg.check_actors(last_rank=swarm.agents - 1)
    topo = make_topology(swarm)
    agent_cfg = replace(
        agent_cfg, agents_per_host=swarm.agents, total_frames=max(1, swarm.total_frames // swarm.agents)
    )
    load = HostLoad(swarm.agents, host_cores())
    if load.warning():
        echo(load.warning())
    run_dir = Path(run_dir)
    listener = _listen(metrics_port) if topo is not None and metrics_port is not None else None
    earlier = _earlier_summary(run_dir) if resume else {}
    asked, agent_cfg = agent_cfg, _resumed_learner(run_dir, agent_cfg) if resume else agent_cfg
    prepare_run_dir(
        run_dir,
        resume,
        {
            "swarm": asdict(swarm),
            "agent": asdict(asked),
            "topology": topo.to_dict() if topo else None,
            RECORDS_LEARNER: {agent_cfg.algo: asdict(getattr(resolved(agent_cfg), agent_cfg.algo))},
        },
    )
    if resume and not any((run_dir / f"agent-{r}" / "checkpoint.pt").exists() for r in range(swarm.agents)):
        # Each agent would wait to adopt its neighbours' parameters, and none has any: a deadlock.
        echo(f"no agent of {run_dir} wrote a checkpoint before it stopped: its agents start afresh")
        resume = False
    swarm_log = SwarmLog(run_dir, {"swarm": asdict(swarm), "agent": asdict(resolved(agent_cfg))}, track)
    members = Swarm(swarm, agent_cfg, run_dir, resume, load, echo)
    timings = Timings(earlier=_number(earlier.get("wall_seconds"), 0.0))
    bar = None
    try:
        with tempfile.TemporaryDirectory(prefix="gossiprl-") as tmp:
            try:
                members.start(topo, tmp, listener)
                bar = _progress_bar(swarm.agents * agent_cfg.total_frames, show_progress)
                members.watch(timings, swarm_log, bar)
            except KeyboardInterrupt:
                members.interrupted()
            finally:
                members.close(swarm_log)
                if bar is not None:
                    bar(None)
        summary = _summary(members, timings, _number(earlier.get("mean_return"), math.nan))
        tmp_path = run_dir / "summary.json.tmp"
        tmp_path.write_text(json.dumps(_finite(summary), indent=2, default=str, allow_nan=False))
        os.replace(tmp_path, run_dir / "summary.json")
    finally:
        members.release_ctrl_c()
    swarm_log.close(summary)
    return summary


def _listen(metrics_port: int | socket.socket) -> socket.socket:
    """The stats server's socket, bound before the run dir is made: a port in use leaves nothing behind
    (the CLI binds it earlier still, before the run's header, and hands the socket in)."""
    from .monitor import listen

    if isinstance(metrics_port, socket.socket):
        return metrics_port
    try:
        return listen(metrics_port)
    except OSError as err:
        raise RunError(f"cannot serve stats on 127.0.0.1:{metrics_port}: {err.strerror}") from None


def _number(value, default: float) -> float:
    """A figure read back from an earlier summary.json, or ``default`` where it holds none."""
    return value if type(value) in (int, float) else default


def _summary(members: Swarm, timings: Timings, earlier_return: float) -> dict:
    """summary.json's contents: the whole run's frames and time, this session's rate, and the returns."""
    summaries, failures, progress = members.summaries, members.failures, members.progress
    wall = timings.session()  # the training's, before the scoring
    before = timings.before(summaries)
    consensus = None if members.stopped_by == "interrupted" else _consensus_return(members)
    if members.solved_at is not None:
        members.solved_at["wall_seconds"] = before + members.solved_at["session_wall_seconds"]
    return {
        "frames": sum(s["frames"] for s in summaries.values()),
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
        "consensus_return": consensus,
        "episodes": progress.episodes,
        "agents": members.cfg.agents,
        "stopped_by": members.stopped_by,
        "solved_at": members.solved_at,
        "gossip_share": progress.gossip_share,
        "per_agent": {rank: summaries[rank] for rank in sorted(summaries)},
        "failed": {rank: failures[rank].strip().splitlines()[-1] for rank in sorted(failures)},
    }


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


def _consensus_return(members: Swarm) -> float | None:
    """The consensus policy's mean return, for summary.json beside the agents' own; None where no agent
    left a checkpoint or Ctrl-C or SIGTERM cut the scoring short (a run that was interrupted is not
    scored). A stop during the scoring stops the run: its summary is still written, and it says
    "interrupted", so a study stops too (one SIGTERM is all a process gets: later ones are only noted)."""
    from .rl.consensus import evaluate_consensus

    members.release_ctrl_c()
    echo = members.echo
    echo(f"scoring the consensus policy (the mean of the agents' parameters) over {CONSENSUS_EPISODES} episodes")
    try:
        return evaluate_consensus(members.run_dir, episodes=CONSENSUS_EPISODES)["mean"]
    except KeyboardInterrupt:
        members.stopped_by = "interrupted"
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
