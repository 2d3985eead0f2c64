"""One PALA/GALA agent: a learner that hands its parameters to gossip after each update.

``train`` is the whole agent in one loop: take a filled rollout from the learner's source (its
own envs stepped n_steps, or IMPALA's actors), one update by the learner ``--algo`` names
(``learners``: A2C, PPO, IMPALA), then (every ``gossip_every`` updates)
``gossip.exchange(flat_params)``, which mixes the peers' parameters into ours in place. The loop
knows nothing about sockets or topologies; any object with that one method will do, and
``gossip=None`` is plain single-agent training.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from gossiprl.rl.learners import LEARNERS, resolved
from gossiprl.rl.models import flatten_parameters, make_model
from gossiprl.rl.settings import AgentConfig, meant_then, thread_plan, with_unset_from

log = logging.getLogger("gossiprl.rl.agent")


class GossipHook(Protocol):
    def exchange(self, flat_params: torch.Tensor) -> Mapping[str, float]:
        """Publish flat_params, mix the in-peers' parameters into it in place, return stats
        such as 'gossip/wait_s', 'gossip/mix_s', 'gossip/round', 'gossip/consensus_distance'."""

    def adopt(self, flat_params: torch.Tensor) -> int:
        """Overwrite flat_params with the in-peers' mean (an agent rejoining with no checkpoint);
        return how many peers it came from."""

    @property
    def self_weight(self) -> float:
        """This agent's own weight in the mixing matrix (read with gossip_overlap, to scale the
        learning rate by 2 - p_ii)."""

    # Optional: flush(flat_params), called once after the last update if the hook has it, mixes
    # what is still in flight (Gossip with overlap=True); a Protocol cannot mark a method optional.


METRIC_COLUMNS = [
    "frames",
    "wall_s",
    "updates",
    "episodic_return",
    "mean_return_100",
    "fps",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "gossip/wait_s",
    "gossip/mix_s",
    "gossip/consensus_distance",
]
"""metrics.csv columns; any other keys gossip.exchange returns are appended (sorted) after them."""


WARMUP_UPDATES = 20
"""Updates left out of the steady-state figures (summary's ``steady_*``): the first ones pay for
torch's first calls, and a swarm's first exchanges wait for the slowest agent to start."""

PROGRESS_EVERY_S = 1.0
"""Seconds between progress reports to the launcher (also sent once at the end)."""


def train(
    cfg: AgentConfig,
    run_dir: str | os.PathLike,
    rank: int = 0,
    gossip: GossipHook | None = None,
    resume: bool = False,
    stop=None,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Train one agent into ``run_dir/agent-<rank>/`` and return a summary.

    ``stop`` is any Event-like object (threading or multiprocessing); setting it ends the
    loop after the current update, with a final log row and checkpoint, or while the rollout
    source waits for others (IMPALA's learner for its actors: they may never come) with those
    of the last update, if this session made one. ``progress`` gets,
    about once a second and at the end, ``{"frames", "wall_s", "gossip_s", "returns",
    "consensus_distance"}``: this agent's frames so far, its seconds of training and of gossip
    in this session, the returns of the episodes finished since the previous report, so a
    launcher can judge the whole swarm (the solve threshold over all agents' last 100
    episodes), and its last gossip's consensus distance (None before its first gossip).
    The summary's ``frames`` and ``run_wall_seconds`` count every session of the run (from the
    checkpoint's counters), ``wall_seconds`` and ``fps`` only this one; the rollout source's stats
    (IMPALA's 'impala/policy_lag_mean' ...) are averaged over this session's updates.
    """
    agent_dir = Path(run_dir) / f"agent-{rank}"
    agent_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_path = agent_dir / "checkpoint.pt"
    checkpoint = None
    if resume and (checkpoint_path.exists() or gossip is None):
        checkpoint, cfg = resume_checkpoint(checkpoint_path, cfg)
    cfg = resolved(cfg)  # its config.json and checkpoints record the rate it learns at, not "the default"
    tally = Tally.resumed(checkpoint)
    (agent_dir / "config.json").write_text(json.dumps({"rank": rank, **asdict(cfg)}, indent=2, default=str))
    a = _Agent.build(cfg, rank, gossip, checkpoint, tally.updates)
    # Closed however training ends: an error (an actor failed, a diverged learner, gossip) left IMPALA's
    # actor processes, its channel's thread and bound endpoint behind, and a caller's retry could not bind.
    try:
        if resume and not checkpoint:  # rejoining a running swarm with no checkpoint: start from the neighbours'
            _adopt(gossip, a.flat_params, rank, agent_dir, stop)
        a.start_rollout(stop)
        log = MetricsLog(agent_dir, resumed_at=tally.frames if resume else None)
        try:
            tally.start()
            _loop(a, cfg, rank, tally, gossip, log, checkpoint_path, stop, progress)
            return tally.summary()  # before the source closes: waiting for actors to leave is not training
        finally:
            log.close()
    finally:
        a.source.close()


def _loop(
    a: _Agent, cfg: AgentConfig, rank: int, tally: Tally, gossip, log: MetricsLog, checkpoint_path: Path, stop, progress
) -> None:
    """``train``'s updates, until the budget is spent, the return reached or ``stop`` set, with a
    row, a checkpoint and a report on the way and once more at the end."""
    losses: dict = {}
    gossip_stats: dict[str, float] = {}
    # The update counts the last row and checkpoint hold: a stop found while the source waited ends the
    # loop after the pass that logged the last update, and its final row would be a second at that step.
    logged = saved = tally.updates
    # One flag, computed once per update, both ends the loop and triggers the final log row and
    # checkpoint: a stop that arrived between two separate checks used to end the loop unsaved.
    finished = tally.frames >= cfg.total_frames or (stop is not None and stop.is_set())
    while not finished:
        t0 = time.perf_counter()
        stats = a.source.next(tally.updates)
        if stats is None:  # stopped while the source waited (IMPALA's actors): the last update was the final one
            if tally.updates == tally.start_updates:
                break  # none in this session: nothing learned to log or save, as after a stop before the loop
            finished = True
        else:
            losses, gossip_stats = _update(a, cfg, tally, gossip, stats, t0, gossip_stats)
            finished = (
                tally.solved(cfg.stop_at_return)
                or tally.frames >= cfg.total_frames
                or (stop is not None and stop.is_set())
            )
        if finished and (flushed := _flush(gossip, a.flat_params)) is not None:
            gossip_stats, saved = flushed, None  # the letters moved the parameters: the final checkpoint holds them
        if (tally.updates % cfg.log_every == 0 or finished) and tally.updates != logged:
            a.check_finite(rank, tally.updates)
            log.write(tally.log_row(losses, gossip_stats), {f"timing/{k}_s": v for k, v in tally.timing.items()})
            logged = tally.updates
        if (tally.updates % cfg.checkpoint_every == 0 or finished) and tally.updates != saved:
            save_checkpoint(checkpoint_path, a.state(tally, cfg))
            saved = tally.updates
        if progress is not None and (finished or time.perf_counter() - tally.last_report >= PROGRESS_EVERY_S):
            progress(tally.report(gossip_stats))


def _flush(gossip, flat_params: torch.Tensor) -> dict[str, float] | None:
    """Mix in the letters still in flight (Gossip with overlap=True), so the final row and checkpoint
    hold them; their stats, or None when no round was in flight (or the hook has no flush)."""
    flushed = gossip.flush(flat_params) if gossip is not None and hasattr(gossip, "flush") else None
    return {k: float(v) for k, v in flushed.items()} if flushed else None


def _update(
    a: _Agent, cfg: AgentConfig, tally: Tally, gossip, stats: dict, t0: float, gossip_stats: dict
) -> tuple[dict, dict]:
    """One update on the rollout the source filled since ``t0`` (``stats``, its stats), then gossip
    if due; returns the update's losses and the latest gossip stats (``gossip_stats`` if none was due)."""
    tally.add_source_stats(stats)
    t1 = time.perf_counter()
    losses = a.learner.update(a.model, a.optimizer, a.rollout, a.hp, progress=tally.frames / cfg.total_frames)
    tally.updates += 1
    tally.frames += a.frames_per_update
    t2 = time.perf_counter()
    if gossip is not None and tally.updates % cfg.gossip_every == 0:
        gossip_stats = {k: float(v) for k, v in gossip.exchange(a.flat_params).items()}
        tally.timing["gossip_wait"] += gossip_stats.get("gossip/wait_s", 0.0)
        tally.timing["mix"] += gossip_stats.get("gossip/mix_s", 0.0)
    tally.timed(t0, t1, t2, time.perf_counter())
    tally.add_episodes(a.source.pop_episodes())
    return losses, gossip_stats


def _adopt(gossip: GossipHook, flat_params: torch.Tensor, rank: int, agent_dir: Path, stop=None) -> None:
    """Start from the mean of the neighbours' parameters, and say so, or that the agent's stop came
    first (adopt then takes nothing, and training ends as after any stop before the loop)."""
    adopted = gossip.adopt(flat_params)
    if adopted:
        outcome = f"starting from the mean of {adopted} neighbour(s)' parameters"
    elif stop is not None and stop.is_set():
        outcome = "stopped before its neighbours' parameters came"
    else:
        outcome = "no neighbour's parameters came either, starting fresh"
    print(f"agent-{rank}: no checkpoint in {agent_dir}; {outcome}", flush=True)


def resume_checkpoint(checkpoint_path: Path, cfg: AgentConfig) -> tuple[dict, AgentConfig]:
    """The checkpoint a resumed agent goes on from, refused if it learned on another env, with
    another learner, or with settings a resume must keep; and ``cfg`` with the learner settings it
    leaves to the env's default (None) as the checkpoint learned with them, which a default that
    moved since does not change (a lone `gossiprl agent --resume` has no config.json to say)."""
    checkpoint = load_checkpoint(checkpoint_path)
    if checkpoint["config"].get("env_id") != cfg.env_id:
        raise CheckpointError(
            f"{checkpoint_path} was trained on {checkpoint['config'].get('env_id')}, "
            f"this run asks for {cfg.env_id}: resume with that --env or use another --run-dir"
        )
    if checkpoint["config"].get("algo", "a2c") != cfg.algo:  # before --algo, every run was A2C
        raise CheckpointError(
            f"{checkpoint_path} was trained by {checkpoint['config'].get('algo', 'a2c')}, this run asks "
            f"for {cfg.algo}: resume with that --algo or use another --run-dir"
        )
    learned = _checkpoint_learned(checkpoint["config"])
    if isinstance(learned.get(cfg.algo), Mapping):
        cfg = replace(cfg, **{cfg.algo: with_unset_from(getattr(cfg, cfg.algo), learned[cfg.algo])})
    changed = changed_on_resume(learned, cfg)
    if changed:
        raise CheckpointError(
            f"{checkpoint_path} was trained with {', '.join(changed)}: a resumed run keeps what it "
            "learns with; resume with those settings (given as flags; is config.json edited?) or use another --run-dir"
        )
    return checkpoint, cfg


@dataclass
class _Agent:
    """What one agent learns with: its rollout source (its envs, or IMPALA's actors), network,
    optimizer and rollout, and its learner."""

    learner: Any
    hp: Any
    source: Any
    model: torch.nn.Module
    flat_params: torch.Tensor
    optimizer: torch.optim.Optimizer
    device: torch.device
    rollout: Any = None
    frames_per_update: int = 0

    @classmethod
    def build(cls, cfg: AgentConfig, rank: int, gossip, checkpoint: dict | None, updates: int) -> _Agent:
        # Seeding: the update count is mixed in so a resumed run draws new episodes and actions
        # instead of replaying the ones it started with. Seed and rank are separate words of the
        # entropy: with seed + rank, agent 1 of seed 1 and agent 0 of seed 2 drew the same episodes,
        # so the "independent" seeds of a swarm shared most of their runs.
        rng = np.random.default_rng([cfg.seed, rank, updates])
        threads = thread_plan(cfg)
        torch.set_num_threads(threads["torch"])
        device = pick_device(cfg.device, rank)
        learner = LEARNERS[cfg.algo]
        hp = learner.resolve_defaults(getattr(cfg, cfg.algo), cfg.env_id)
        if gossip is not None and cfg.gossip_overlap and cfg.overlap_lr_scale:
            # an overlapped round moves the swarm's mean by u / (2 - p_ii): scale u back up (docs/algorithm.md)
            hp = replace(hp, lr=hp.lr * (2.0 - gossip.self_weight))

        source = learner.make_rollouts(cfg, hp, int(rng.integers(2**30)), threads["env"])
        # The network's initial weights: one draw for the whole swarm (GALA starts every agent from the
        # same parameters, so the first mixes average networks that agree instead of unrelated ones),
        # or the agent's own with shared_init off. Its actions always come from its own stream.
        torch.manual_seed(cfg.seed if cfg.shared_init else int(rng.integers(2**31)))
        model = make_model(source.observation_space, source.action_space).to(device)
        torch.manual_seed(int(rng.integers(2**31)))
        flat_params = flatten_parameters(model)
        optimizer = learner.make_optimizer(model, hp)
        if checkpoint:
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
        return cls(learner, hp, source, model, flat_params, optimizer, device)

    def start_rollout(self, stop=None) -> None:
        """Start the rollout source, once the parameters are what training starts from."""
        self.rollout = self.source.start(self.model, self.flat_params, self.device, stop)
        self.frames_per_update = self.source.frames_per_update

    def check_finite(self, rank: int, updates: int) -> None:
        if not bool(torch.isfinite(self.flat_params).all()):
            raise FloatingPointError(
                f"agent-{rank}: parameters became NaN or infinite by update {updates}; the learner "
                "diverged: lower --lr or --max-grad-norm, or resume from an earlier checkpoint"
            )

    def state(self, tally: Tally, cfg: AgentConfig) -> dict:
        """What a checkpoint holds: the network, the optimizer, the counters and the config."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "counters": tally.counters(),
            "recent_returns": list(tally.recent_returns),
            "config": asdict(cfg),
        }


@dataclass
class Tally:
    """What the loop counts, over every session of the run (updates, frames, episodes, the last
    100 returns, earlier sessions' seconds) and in this one (seconds per phase, the rows and
    reports since the last, the steady state after the warm-up)."""

    updates: int = 0
    frames: int = 0
    episodes: int = 0
    wall_before: float = 0.0
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=100))
    timing: dict = field(
        default_factory=lambda: dict.fromkeys(("rollout", "learn", "gossip", "gossip_wait", "mix"), 0.0)
    )
    returns_since_log: list = field(default_factory=list)
    returns_since_report: list = field(default_factory=list)
    source_stats: dict = field(default_factory=dict)
    """The rollout source's stats of the last update (IMPALA's policy lag, queue depth ...)."""
    source_totals: dict = field(default_factory=dict)
    """Each source stat summed over this session's updates, for the summary's mean; a stat named
    ``*_total`` is a running count already, and the summary keeps its last value instead."""
    steady: tuple | None = None
    """(clock, frames, timing) once WARMUP_UPDATES are done: start-up and the peers' arrival left out."""
    start_time: float = 0.0
    start_updates: int = 0
    start_frames: int = 0
    last_update_end: float = 0.0
    last_log_time: float = 0.0
    last_log_frames: int = 0
    last_report: float = 0.0

    @classmethod
    def resumed(cls, checkpoint: dict | None) -> Tally:
        if not checkpoint:
            return cls()
        c = checkpoint["counters"]
        return cls(
            c["updates"], c["frames"], c["episodes"], c["wall_s"], deque(checkpoint["recent_returns"], maxlen=100)
        )

    def start(self) -> None:
        """This session starts now."""
        self.start_time = self.last_update_end = self.last_log_time = self.last_report = time.perf_counter()
        self.start_frames = self.last_log_frames = self.frames
        self.start_updates = self.updates

    def timed(self, t0: float, t1: float, t2: float, t3: float) -> None:
        """One update's rollout (t0-t1), learning (t1-t2) and gossip (t2-t3)."""
        self.timing["rollout"] += t1 - t0
        self.timing["learn"] += t2 - t1
        self.timing["gossip"] += t3 - t2
        if self.updates - self.start_updates == WARMUP_UPDATES:
            self.steady = (t3, self.frames, dict(self.timing))
        self.last_update_end = t3

    def add_source_stats(self, stats: dict) -> None:
        self.source_stats = stats
        for key, value in stats.items():
            self.source_totals[key] = self.source_totals.get(key, 0.0) + value

    def add_episodes(self, finished) -> None:
        for episode_return, _ in finished:
            self.recent_returns.append(episode_return)
            self.returns_since_log.append(episode_return)
            self.returns_since_report.append(episode_return)
            self.episodes += 1

    def solved(self, target: float | None) -> bool:
        """The last 100 episodes average ``target`` (None: never)."""
        return (
            target is not None
            and len(self.recent_returns) == self.recent_returns.maxlen
            and float(np.mean(self.recent_returns)) >= target
        )

    def log_row(self, losses: dict, gossip_stats: dict) -> dict:
        """A row of metrics.csv, and the start of the next row's window."""
        now = time.perf_counter()
        row = {
            "frames": self.frames,
            "wall_s": self.wall_before + now - self.start_time,
            "updates": self.updates,
            "episodic_return": float(np.mean(self.returns_since_log)) if self.returns_since_log else None,
            "mean_return_100": float(np.mean(self.recent_returns)) if self.recent_returns else None,
            "fps": (self.frames - self.last_log_frames) / max(now - self.last_log_time, 1e-9),
            **{k: float(v) for k, v in losses.items()},
            **self.source_stats,
            **gossip_stats,
        }
        self.last_log_time, self.last_log_frames = now, self.frames
        self.returns_since_log = []
        return row

    def counters(self) -> dict:
        return {
            "updates": self.updates,
            "frames": self.frames,
            "episodes": self.episodes,
            "wall_s": self.wall_before + time.perf_counter() - self.start_time,
        }

    def report(self, gossip_stats: dict) -> dict:
        """A progress report for the launcher, and the start of the next one's window."""
        self.last_report = time.perf_counter()
        report = {
            "frames": self.frames,
            "wall_s": self.last_report - self.start_time,
            "gossip_s": self.timing["gossip"],
            "returns": self.returns_since_report,
            "consensus_distance": gossip_stats.get("gossip/consensus_distance"),
        }
        self.returns_since_report = []
        return report

    def summary(self) -> dict:
        wall = time.perf_counter() - self.start_time
        return {
            "frames": self.frames,
            "wall_seconds": wall,
            "run_wall_seconds": self.wall_before + wall,
            "fps": (self.frames - self.start_frames) / max(wall, 1e-9),
            "mean_return": float(np.mean(self.recent_returns)) if self.recent_returns else float("nan"),
            "episodes": self.episodes,
            "updates": self.updates,
            **{f"{k}_share": v / max(wall, 1e-9) for k, v in self.timing.items()},
            **{f"{k}_s": v for k, v in self.timing.items()},
            **steady_figures(self.steady, self.last_update_end, self.frames, self.timing),
            **{key: total / max(self.updates - self.start_updates, 1) for key, total in self.source_totals.items()},
            **{key: value for key, value in self.source_stats.items() if key.endswith("_total")},
        }


def steady_figures(steady, until: float, frames: int, timing: dict[str, float]) -> dict[str, float]:
    """Frames/s and time shares from the end of the warm-up to ``until``, the end of the last
    update (``steady_fps``, ``steady_<part>_share``), and the window itself in ``time.perf_counter``
    readings (``steady_since``, ``steady_until``: on Linux the host's monotonic clock, which other
    processes read too, so a benchmark can measure the same window from outside); empty when
    training ended before the warm-up did."""
    if steady is None:
        return {}
    since, frames_then, timing_then = steady
    wall = max(until - since, 1e-9)
    return {
        "steady_since": since,
        "steady_until": until,
        "steady_fps": (frames - frames_then) / wall,
        **{f"steady_{k}_share": (v - timing_then[k]) / wall for k, v in timing.items()},
    }


def pick_device(device: str, rank: int) -> torch.device:
    """Spread agents over the GPUs round-robin; 'auto' falls back to the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' asked for, but no CUDA GPU is visible to torch; use 'cpu' or 'auto'")
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device(device)


def _keep_rows_through(path: Path, frames: int) -> list[str] | None:
    """Rewrite metrics.csv without its rows past ``frames``, or the row a kill cut short (a file
    ends with a newline after each whole row): temp file + rename, so a crash leaves the old file
    whole. Its header; None for a file with no header of ours, which the run then writes afresh."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not text.endswith("\n"):
        lines.pop()
    reader = csv.reader(lines)
    header = next(reader, None)
    if not header or "frames" not in header:
        return None
    at = header.index("frames")
    rows = [row for row in reader if len(row) == len(header) and row[at].isdigit() and int(row[at]) <= frames]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(tmp, path)
    return header


class MetricsLog:
    """metrics.csv plus TensorBoard under the same names, both keyed by frames.

    The CSV header is fixed when the first row is written (or read back on resume), so
    every row lines up even if gossip later reports a key it did not report at first.

    ``resumed_at``: the frames a resumed run goes on from (its checkpoint's; 0 for an agent that
    starts over), None for a fresh run. What a killed session (OOM, kill -9, a machine's session end)
    logged past that point is dropped from both, since this session logs those frames again: the CSV
    kept both, and a study's curve went back in frames where the run was resumed.
    """

    def __init__(self, agent_dir: Path, resumed_at: int | None):
        path = agent_dir / "metrics.csv"
        self.columns: list[str] | None = None
        if resumed_at is not None and path.exists() and path.stat().st_size > 0:
            self.columns = _keep_rows_through(path, resumed_at)
        self.file = open(path, "a" if self.columns else "w", newline="")
        self.csv: csv.DictWriter | None = None
        if self.columns:
            self.csv = csv.DictWriter(self.file, self.columns, extrasaction="ignore")
        # TensorBoard purges the steps from purge_step on: the row at the checkpoint itself stays, as in the CSV
        self.tb = SummaryWriter(str(agent_dir), purge_step=None if resumed_at is None else resumed_at + 1)

    def write(self, row: dict, extra_scalars: dict[str, float]) -> None:
        if self.csv is None:
            extras = sorted(k for k in row if k not in METRIC_COLUMNS)
            self.columns = METRIC_COLUMNS + extras
            self.csv = csv.DictWriter(self.file, self.columns, extrasaction="ignore")
            self.csv.writeheader()
        self.csv.writerow({k: ("" if v is None else v) for k, v in row.items()})
        self.file.flush()
        step = row["frames"]
        names = {
            "episodic_return": "charts/episodic_return",
            "mean_return_100": "charts/mean_return_100",
            "fps": "charts/fps",
        }
        for key, value in row.items():
            if value is not None and (key in names or "/" in key):
                self.tb.add_scalar(names.get(key, key), value, step)
        for key, value in extra_scalars.items():
            self.tb.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        self.tb.close()


def _checkpoint_learned(saved: Mapping) -> Mapping:
    """A checkpoint's config with its learner's unset settings (None) read as what they stood for when
    it was written: the env's defaults then (``meant_then`` where they have moved since, today's
    elsewhere). Checkpoints record resolved settings since MinAtar's A2C rate moved, so an unset one
    is always older."""
    algo, env_id = saved.get("algo", "a2c"), str(saved.get("env_id", ""))
    section = saved.get(algo)
    if algo not in LEARNERS or not isinstance(section, Mapping):
        return saved
    section = {**section, **meant_then(algo, env_id, section)}
    cls = type(getattr(AgentConfig(), algo))
    known = {f.name for f in fields(cls)}
    try:
        then = asdict(LEARNERS[algo].resolve_defaults(cls(**{k: v for k, v in section.items() if k in known}), env_id))
    except (TypeError, ValueError):  # values no config takes: compared as they are, and refused there
        return {**saved, algo: section}
    return {**saved, algo: {k: then.get(k) if v is None else v for k, v in section.items()}}


def changed_on_resume(saved: Mapping, cfg, path: str = "", resolved_cfg=None) -> list[str]:
    """'name=saved (now now)' for each setting a resume must keep that ``cfg`` changes.

    The command line refuses such a flag (gossiprl.config.resume_values), but config.json is
    data: a resumed run whose config.json had ``deviation_bound: null`` turned the bound off
    silently. The checkpoint records what the agent learned with, so that is what is checked;
    a field the checkpoint lacks (written by an older gossiprl) is taken as it comes, and so is the
    section of a learner the run does not use (a PPO run's a2c.lr went from 7e-4 to None when
    MinAtar got its own A2C rate, and never decided anything the run did). A value the checkpoint
    spelt out is kept by today's default where that resolves to it on this env (IMPALA's unroll
    length was 20 before its default became None, which is still 20 on MinAtar)."""
    resolved_cfg = resolved(cfg) if resolved_cfg is None and not path else resolved_cfg
    out = []
    for f in fields(cfg):
        value, name = getattr(cfg, f.name), f"{path}{f.name}"
        if f.metadata.get("may_change_on_resume") or f.name not in saved:
            continue
        if not path and f.name in LEARNERS and f.name != cfg.algo:
            continue
        now = getattr(resolved_cfg, f.name, value)
        if is_dataclass(value) and isinstance(saved[f.name], Mapping):
            out += changed_on_resume(saved[f.name], value, f"{name}.", now)
        elif saved[f.name] != value and saved[f.name] != now:
            here = f", which is {now!r} here" if now != value else ""
            out.append(f"{name}={saved[f.name]!r} (now {value!r}{here})")
    return out


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted; the message names the file and what is wrong with it."""


def checkpoint_digest(state: dict) -> str:
    """SHA-256 over everything a checkpoint holds (tensor bytes, dtypes, shapes, numbers, names).

    It is computed from the values, not the file's bytes, and stored inside the file: a flipped
    byte either breaks the file's structure (torch cannot read it) or changes a value (the
    digest no longer matches), so no corruption loads silently with changed weights. It is
    unkeyed, so it says nothing against tampering: whoever can write the file can recompute it.
    """
    h = hashlib.sha256()

    def feed(value) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            h.update(b"{")
            for key, item in value.items():
                feed(key)
                feed(item)
            h.update(b"}")
        elif isinstance(value, (list, tuple)):
            h.update(b"[")
            for item in value:
                feed(item)
            h.update(b"]")
        else:
            h.update(repr((type(value).__name__, value)).encode())

    feed({k: v for k, v in state.items() if k != "sha256"})
    return h.hexdigest()


def save_checkpoint(path: Path, state: dict) -> bool:
    """Write to a temp file beside ``path``, fsync, then rename over it, so a crash mid-write
    leaves the previous checkpoint intact rather than a truncated one.

    A failed write (disk full, a read-only run dir) must not end hours of training: it is
    skipped with a warning, the temp file removed and the previous checkpoint kept; returns
    whether the checkpoint was written.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({**state, "sha256": checkpoint_digest(state)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return True
    except OSError as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        log.warning(
            "checkpoint not written to %s (%s); training goes on, the previous checkpoint is kept",
            path,
            err.strerror or err,
        )
        return False


def load_checkpoint(path: Path) -> dict:
    """Read a checkpoint (weights_only: nothing in it is executed) and refuse one that cannot be trusted."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"cannot resume: no checkpoint at {path}")
    fix = "delete it (a rejoining agent then starts from its neighbours' parameters) or restore a copy"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, empty or scrambled files raise many different types
        reason = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint, truncated or corrupt ({reason}); {fix}") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "counters", "config"} <= state.keys():
        raise CheckpointError(f"{path}: not a gossiprl checkpoint (no model/optimizer/counters/config); {fix}")
    if "sha256" not in state:
        log.warning("%s has no checksum (written by an older gossiprl): corruption cannot be detected", path)
    elif state["sha256"] != checkpoint_digest(state):
        raise CheckpointError(f"{path}: checksum mismatch, the file changed after it was written (corrupt); {fix}")
    for name, value in state["model"].items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{path}: weight {name!r} holds NaN or infinity; {fix}")
    counters = state["counters"]
    for key in ("updates", "frames", "episodes"):
        if type(counters.get(key)) is not int or counters[key] < 0:
            raise CheckpointError(f"{path}: counter {key!r} is {counters.get(key)!r}, not a whole number >= 0; {fix}")
    if not (isinstance(counters.get("wall_s"), float) and 0 <= counters["wall_s"] < math.inf):
        raise CheckpointError(f"{path}: counter 'wall_s' is {counters.get('wall_s')!r}, not seconds >= 0; {fix}")
    return state
