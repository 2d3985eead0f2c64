"""What every study shares: cells run through the real launcher, resumably, and judged one way.

A *cell* is one (setting, seed) of a study: one ``launch.run``. When it finishes, its row goes to
``<out>/cells/<setting>__seed<k>.json`` and its learning curves to ``<out>/curves/``; a cell
whose row exists is never run again, so a study killed half-way continues where it stopped, and
the cell it was running goes on from its agents' last checkpoint (``run_cell``). Run dirs
(checkpoints, TensorBoard) stay under ``<out>/runs/``, which is not committed.

How cells are judged, the same way in every study:

* budget: every setting gets the same total frames for the whole swarm (split evenly over
  its agents) on the same cores, so "equal frames" is exact; "equal wall-clock" is read off
  the curves at the time the fastest setting of the study finished.
* score: each agent's own mean return over its last 100 training episodes (``agents_mean``:
  their mean, ``agents_min``: the worst agent); ``solved`` (only where the env has a
  threshold) means every agent's own last-100 mean reached it, never a pool of all agents.
* consensus: the policy with the agents' averaged final parameters, played for
  ``eval_episodes`` fresh episodes (``gossiprl.rl.consensus``), beside each agent's own final
  policy played the same way.
* over seeds: mean and a 95 % Student-t interval in the tables; the IQM with a stratified
  bootstrap (experiments/stats.py) in the figures and in every comparison RESULTS.md draws.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import click
import numpy as np

from gossiprl import launch
from gossiprl.rl.a2c import ATARI_LR, A2CConfig, resolve_defaults
from gossiprl.rl.agent import AgentConfig, CheckpointError, load_checkpoint
from gossiprl.rl.consensus import evaluate_consensus
from gossiprl.rl.envs import is_minatar
from gossiprl.rl.learners import LEARNERS

QUICK_ENV = "CartPole-v1"
REAL_ENV = "MinAtar/Breakout-v1"
CURVE_ROWS = 40
"""Rows of metrics.csv per agent: enough points for a curve, few enough to keep results small."""
CHECKPOINTS = 10
"""Checkpoints each agent of a cell writes over its budget: what a study stopped mid-cell goes on from."""

STUDY_MINATAR_LR = 2 * ATARI_LR
"""The A2C rate a study's cell runs at on MinAtar when it names none: 1.4e-3, MinAtar's default when
the studies' plans were made (2026-11-27), and the rate of every cell those plans hold. A study
compares its arms at one rate, so the default's move to 2.8e-3 (where lr_confirm found a ring of 4
ahead of one agent) leaves their cells as they are; lr_sweep and lr_confirm name their rates."""

LOOP_VERSION = 4
"""The agent loop's defaults cells were run under: 2 since the MinAtar entropy bonus, the shared
initial network and overlapped gossip, 3 since overlapped gossip publishes the parameters before
its mix, 4 since each agent's random stream comes from (seed, rank) rather than seed + rank, so
swarm seeds no longer share agents' episodes, and overlapped gossip scales the learning rate by
2 - p_ii (a cell of an earlier version is not reused for a later one)."""

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Two-sided 95 % Student-t quantiles by degrees of freedom (1.96 beyond)."""


RETURN_BOUNDS = {"CartPole-v1": (0.0, 500.0)}
"""Episode returns an env's rules allow, where both ends are known (CartPole-v1: +1 a step, 500 steps)."""


def score_bounds(env_id: str) -> tuple[tuple[float, float], str]:
    """The range a score can take, to clip intervals to, and where each end comes from: only what the
    env's rules fix (CartPole's 0 and 500; no MinAtar reward is negative, so 0 below). An end the rules
    leave open stays open: the highest score a run reached is no bound on what a mean can be, and a
    t-interval cut there read narrower than the data is."""
    low, high = RETURN_BOUNDS.get(env_id, (0.0 if is_minatar(env_id) else -math.inf, math.inf))
    if math.isfinite(low) and math.isfinite(high):
        return (low, high), f"[{low:g}, {high:g}], {env_id}'s return range"
    if math.isfinite(low):
        return (low, high), f"[{low:g}, no upper end]: 0 below, no MinAtar reward being negative; no upper end is known"
    return (low, high), "no end known (intervals are not cut)"


PLANE = "shm" if sys.platform == "linux" else "broker"
"""The data plane sync cells run on (Cell.plane). On one host shared memory spares the broker two
copies of every letter: a sync ring of 4 on MinAtar Breakout trained 1.2x the frames/s it did through
the broker on this 2-core VM (4,298 and 4,254 against 3,524 and 3,666 in interleaved runs), and in sync
mode the plane changes nothing a swarm learns: the turn locks fix every round's letters, and the
parameters come out bitwise the same (a test in tests/integration/comms/test_dataplane.py). So the
plane is not in a cell's fingerprint, and a sync cell run through the broker is reused. Async cells
stay on the broker: there a shared-memory reader mixes its writer's newest letter where the broker
hands it the oldest unread one, a different staleness, which the ordering study measures."""


@dataclass
class Cell:
    setting: str
    """Name of the setting as the legend and the table show it, e.g. 'ring, 4 agents'."""
    seed: int
    agents: int
    total_frames: int
    """For the whole swarm; each agent gets total_frames // agents."""
    swarm: launch.SwarmConfig
    """Topology 'none' (``NO_GOSSIP``) for independent agents, the no-gossip control: one broker-less
    swarm, whose agent r draws from (seed, rank r) and starts from the swarm's initial network, as a
    gossiping swarm's agent r does. (They were lone runs seeded seed + r, so the control's seeds
    shared most of their agents' episodes: 3 of 4 at 4 agents.)"""
    a2c: A2CConfig = field(default_factory=A2CConfig)
    gossip_every: int = 1
    agent: dict = field(default_factory=dict)
    """AgentConfig fields set for this cell (e.g. gossip_overlap, shared_init), beside a2c's."""
    labels: dict = field(default_factory=dict)
    """Extra columns for the table (topology, mode, staleness, ...)."""
    runner: Callable[[Cell, AgentConfig, Path], tuple[list[dict], float]] | None = None
    """Runs the swarm some other way than ``launch.run`` (agents in network namespaces): gets the
    cell, the agents' config and the run dir, returns (each agent's summary, wall-clock seconds)."""
    plane: str | None = PLANE
    """The data plane a sync gossiping swarm runs on where its SwarmConfig leaves the broker's
    default (``ran_swarm``); None runs the SwarmConfig's (the layout study's one-host arm relays
    through the broker, as PALA's cluster did)."""

    @property
    def key(self) -> str:
        return cell_key(self.setting, self.seed)


def fresh_out(name: str, quick: bool, create: bool = True) -> Path:
    """A new directory for a run that named none, so the committed results are never written by
    accident: runs/<name>-<time>/ (git ignores runs/), or for --quick one inside a new temporary
    directory, which then also holds the shared cell cache (``<out>/../_shared``). ``create=False``
    (--plan, which writes nothing): a quick run's is named, not made."""
    if quick:
        if not create:
            return Path(tempfile.gettempdir()) / time.strftime(f"{name}-quick-%Y%m%d-%H%M%S") / name
        return Path(tempfile.mkdtemp(prefix=f"{name}-quick-")) / name
    return Path(__file__).resolve().parent.parent / "runs" / time.strftime(f"{name}-%Y%m%d-%H%M%S")


def parse_seeds(given: str | None, default: str = "1,2,3,4,5") -> list[int]:
    """--seeds as a list (``default`` when not given: None), or a one-line error that says what is
    valid (an empty --seeds too: it is not the default)."""
    try:
        seeds = [int(s) for s in (default if given is None else given).split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{given!r}: give comma-separated whole numbers, e.g. 1,2,3", param_hint="--seeds"
        ) from None
    if not seeds:
        raise click.BadParameter(f"{given!r}: give at least one seed, e.g. 1,2,3", param_hint="--seeds")
    return seeds


def cell_key(setting: str, seed: int) -> str:
    """File name of a cell: the setting with anything but letters, digits, - and _ made '-'."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in setting) + f"__seed{seed}"


def ci95(values) -> tuple[float, float]:
    """(mean, half-width of the 95 % t interval); the half-width is nan for one value."""
    values = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(values) == 0:
        return math.nan, math.nan
    if len(values) == 1:
        return float(values[0]), math.nan
    t = T_975.get(len(values) - 1, 1.96)
    return float(values.mean()), float(t * values.std(ddof=1) / math.sqrt(len(values)))


def run_study(
    cells: list[Cell],
    out: Path,
    env_id: str,
    threshold: float | None,
    eval_episodes: int,
    echo=print,
    shared: Path | None = None,
) -> list[dict]:
    """Run every cell not yet finished, one after the other; return all rows (old and new).

    ``shared`` (default: ``<out>/../_shared``) holds every finished cell under a fingerprint of
    what was run, so a cell two studies share (a 4-agent sync ring with default batch is in
    four of them) runs once and is reused, renamed to each study's setting."""
    out = Path(out)
    shared = Path(shared) if shared is not None else out.parent / "_shared"
    for folder in (out / "cells", out / "curves", shared):
        folder.mkdir(parents=True, exist_ok=True)
    cells = in_run_order(cells)
    # the cells this call runs share one window of machine load: only theirs compare in wall-clock
    window = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for k, cell in enumerate(cells, 1):
        row_path = out / "cells" / f"{cell.key}.json"
        fingerprint = cell_fingerprint(cell, env_id, eval_episodes)
        if row_path.exists():
            if read_record(row_path).get("fingerprint") == fingerprint:
                echo(f"[{k}/{len(cells)}] {cell.setting}, seed {cell.seed}: done before, kept")
                continue
            # a row from another loop version, env or settings is not this cell's result
            echo(f"[{k}/{len(cells)}] {cell.setting}, seed {cell.seed}: row from an older loop or other settings")
        row = shared_row(cell, shared, fingerprint)
        if row is not None:
            shutil.copyfile(shared / f"{fingerprint}.csv", out / "curves" / f"{cell.key}.csv")
            note = " (same run as in another study, reused)"
        else:
            row = {
                **run_cell(cell, out, env_id, threshold, eval_episodes, fingerprint, window),
                "fingerprint": fingerprint,
            }
            shutil.copyfile(out / "curves" / f"{cell.key}.csv", shared / f"{fingerprint}.csv")
            _write_json(shared / f"{fingerprint}.json", row)
            note = ""
        _write_json(row_path, row)
        echo(f"[{k}/{len(cells)}] {describe(row)}{note}")
    return load_rows(out, cells)


def in_run_order(cells: list[Cell]) -> list[Cell]:
    """Seed by seed, every setting once per round: the load other jobs put on the shared cores
    drifts over the hours a study runs, and this spreads it over the settings alike."""
    seeds = list(dict.fromkeys(c.seed for c in cells))
    return sorted(cells, key=lambda c: seeds.index(c.seed))


@dataclass(frozen=True)
class CellPlan:
    """What running a cell in a study's dir would do now, read without running or writing anything."""

    state: str
    """"done", "cached" (another study ran it: copied), "trained" (stopped while scoring: scored
    only), "cut" (goes on from its checkpoints) or "to run"."""
    frames_left: int
    """Frames its agents would still train, in all."""
    note: str = ""


def cell_plan(cell: Cell, out: Path, env_id: str, eval_episodes: int, shared: Path | None = None) -> CellPlan:
    """What ``run_study`` would do with ``cell`` in ``out``, decided as it decides (its row, the
    shared cache, ``kept_sessions``); a cut cell's frames left are its budget less what its agents'
    checkpoints hold."""
    out = Path(out)
    shared = Path(shared) if shared is not None else out.parent / "_shared"
    fingerprint = cell_fingerprint(cell, env_id, eval_episodes)
    row_path = out / "cells" / f"{cell.key}.json"
    older = row_path.exists() and read_record(row_path).get("fingerprint") != fingerprint
    if row_path.exists() and not older:
        return CellPlan("done", 0)
    if shared_row(cell, shared, fingerprint) is not None:
        return CellPlan("cached", 0)
    run_dir = out / "runs" / cell.key
    sessions, trained = kept_sessions(run_dir, fingerprint) if cell.runner is None else (0, False)
    if trained:
        return CellPlan("trained", 0)
    notes = ["replaces a row from an older loop or other settings"] if older else []
    if not sessions:
        return CellPlan("to run", cell.total_frames, "; ".join(notes))
    kept = 0
    for path in (run_dir / f"agent-{rank}" / "checkpoint.pt" for rank in range(cell.agents)):
        try:
            kept += load_checkpoint(path)["counters"]["frames"] if path.exists() else 0
        except CheckpointError as err:  # that agent's resume fails on it, and says why
            notes.append(str(err))
    notes.insert(0, f"session {sessions + 1} goes on from {kept:,} frames in its checkpoints")
    return CellPlan("cut", max(0, cell.total_frames - kept), "; ".join(notes))


def shared_row(cell: Cell, shared: Path, fingerprint: str) -> dict | None:
    """The row the shared cache holds for the run ``fingerprint`` names, as ``cell``'s (its setting
    and labels: the same run is another setting in each study that has it); None where it holds none.

    The data plane is not in a fingerprint: a sync cell learns bitwise the same on any, so a run is
    reused across planes and its row says which it ran on. A cell that keeps its SwarmConfig's plane
    (``plane`` None: the layout study's, whose question is the time the bytes take) is not given a
    run made on another."""
    path = Path(shared) / f"{fingerprint}.json"
    if not path.exists():
        return None
    row = read_record(path)
    swarm = ran_swarm(cell)
    if cell.plane is None and swarm.gossips and (row.get("data_plane") or "broker") != swarm.data_plane:
        return None  # a row from before planes were recorded ran through the broker
    return {**row, "setting": cell.setting, **cell.labels}


def ran_swarm(cell: Cell) -> launch.SwarmConfig:
    """The swarm ``cell`` runs: its SwarmConfig with its budget, on ``cell.plane`` where that learns
    what the broker plane would (PLANE): a sync swarm that gossips and names no plane of its own."""
    swarm = replace(cell.swarm, total_frames=cell.total_frames)
    same_run = swarm.gossips and swarm.mode == "sync" and swarm.data_plane == "broker"
    return replace(swarm, data_plane=cell.plane) if cell.plane and same_run else swarm


def cell_fingerprint(cell: Cell, env_id: str, eval_episodes: int) -> str:
    # the swarm's own budget is left out: the cell's total_frames is the budget, and a cell keeps
    # the fingerprint it had before SwarmConfig held one
    swarm = {k: v for k, v in asdict(cell.swarm).items() if k != "total_frames"}
    what = {
        "env": env_id,
        "eval_episodes": eval_episodes,
        "seed": cell.seed,
        "agents": cell.agents,
        "total_frames": cell.total_frames,
        "swarm": swarm,
        "a2c": {**asdict(cell.a2c), "lr": a2c_rate(cell, env_id)},
        "gossip_every": cell.gossip_every,
        "runner": cell.runner.__name__ if cell.runner else None,
    }
    what.update(agent=cell.agent, loop=LOOP_VERSION)  # a cell of an older loop is never reused for a newer one
    if cell.agent.get("algo", "a2c") != "a2c":
        # PPO's or IMPALA's settings as they resolve for the env: a cell run under another default
        # (IMPALA's control-task unrolls went from 20 x 2 to 5 x 4) is not this one. A2C's cells keep
        # the fingerprints they had: A2C's settings above, with its rate resolved but not its other
        # env-dependent defaults (entropy, reward clipping), whose changes LOOP_VERSION marks.
        what["learner"] = asdict(learner_settings(cell, env_id))
    return hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def cell_a2c(cell: Cell, env_id: str) -> A2CConfig:
    """The A2C settings a cell runs with: its own, at ``STUDY_MINATAR_LR`` on MinAtar where it names
    no rate."""
    if cell.a2c.lr is None and is_minatar(env_id) and cell.agent.get("algo", "a2c") == "a2c":
        return replace(cell.a2c, lr=STUDY_MINATAR_LR)
    return cell.a2c


def learner_settings(cell: Cell, env_id: str):
    """The settings the cell's learner trains with on ``env_id``, its env-dependent defaults filled in."""
    cfg = AgentConfig(env_id=env_id, a2c=cell_a2c(cell, env_id), **cell.agent)
    return LEARNERS[cfg.algo].resolve_defaults(getattr(cfg, cfg.algo), env_id)


def a2c_rate(cell: Cell, env_id: str) -> float:
    """The A2C rate a cell's fingerprint holds: the rate it runs at, not "the default", since
    MinAtar's default moved from 7e-4 to 1.4e-3 and a run keeps its name whichever way a study asks
    for its rate. Another learner's cell ignores A2C's settings and keeps the 7e-4 it was named with."""
    if cell.agent.get("algo", "a2c") != "a2c":
        return ATARI_LR if cell.a2c.lr is None else cell.a2c.lr
    return resolve_defaults(cell_a2c(cell, env_id), env_id).lr


def read_record(path: Path) -> dict:
    """A cell's row, a shared cell or a run's marker (all written whole, by ``_write_json``); one that
    is not a JSON object (edited by hand, a failing disk) stops the study with one line naming it."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        value = err
    if not isinstance(value, dict):
        why = f"{type(value).__name__}: {value}" if isinstance(value, Exception) else "not a JSON object"
        raise click.ClickException(f"{path}: not a readable cell record ({why}); delete it and that cell runs afresh")
    return value


def _write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def describe(row: dict) -> str:
    solved = "" if row["solved"] is None else f"  solved(all agents) {'yes' if row['solved'] else 'no'}"
    return (
        f"{row['setting']}, seed {row['seed']}: {row['frames'] / 1e6:.3f}M frames in {row['wall_s']:.0f}s "
        f"({row['fps']:.0f} frames/s)  agents' last-100 mean {row['agents_mean']:.2f} (worst {row['agents_min']:.2f})"
        f"  consensus eval {row['consensus_eval']:.2f}  gossip {100 * row['gossip_share']:.0f}%{solved}"
    )


def load_rows(out: Path, cells: list[Cell] | None = None) -> list[dict]:
    """The finished rows, in the order of ``cells`` when given (missing cells are left out). A study
    cell's ``fps`` is read from its curve (``training_fps``): cells that run_cell wrote before it read
    the curve recorded all agents' frames over the launcher's seconds, start-up included."""
    rows = {p.stem: read_record(p) for p in sorted((Path(out) / "cells").glob("*.json"))}
    for key, row in rows.items():
        curve = Path(out) / "curves" / f"{key}.csv"
        if "gossip_share" in row and curve.exists():  # run_cell's rows; a library's (baselines) keep their own
            row["fps"] = training_fps(read_curves(out, key), row["fps"])
    if cells is None:
        return list(rows.values())
    return [rows[c.key] for c in cells if c.key in rows]


def older_keys(out: Path, cells: list[Cell], env_id: str) -> set[str]:
    """The finished cells whose fingerprint is not the one their planned cell has now."""
    older = set()
    for c in cells:
        path = Path(out) / "cells" / f"{c.key}.json"
        if path.exists():
            row = read_record(path)
            if row.get("fingerprint") != cell_fingerprint(c, env_id, row.get("eval_episodes", 10)):
                older.add(c.key)
    return older


def todays_rows(out: Path, cells: list[Cell], env_id: str) -> list[dict]:
    """The finished rows of today's plan only: an older run (another budget, loop or rate) answers
    another question, so a summary that pools cells leaves it out."""
    older = older_keys(out, cells, env_id)
    return load_rows(out, [c for c in cells if c.key not in older])


def shown_rows(out: Path, cells: list[Cell], env_id: str, all_older: bool = False) -> tuple[list[dict], set, list]:
    """(the rows a study's tables and figure show, the keys of its older cells, the older cells left
    out). A setting with cells of today's plan shows only those: a rerun replaces older cells seed by
    seed, and a mean of both would mix two budgets or loops. A setting with none shows its older
    ones, as they ran. ``all_older``: every cell is older (the study's --frames changed meaning)."""
    older = {c.key for c in cells} if all_older else older_keys(out, cells, env_id)
    current = {c.setting for c in cells if c.key not in older and (Path(out) / "cells" / f"{c.key}.json").exists()}
    hidden = [c for c in cells if c.key in older and c.setting in current]
    return load_rows(out, [c for c in cells if c.key not in older or c.setting not in current]), older, hidden


def steps_per_update(hp) -> int:
    """Env steps between two updates of a learner of settings ``hp`` (its envs x steps, times
    IMPALA's unrolls per batch): sets how often a run logs, so every curve has about ``CURVE_ROWS`` points."""
    return hp.num_envs * hp.n_steps * getattr(hp, "batch_size", 1)


def start_session(run_dir: Path, fingerprint: str, resumable: bool) -> tuple[int, bool]:
    """(which session of the cell's run this is, whether its training is already done).

    1 for a fresh run; k + 1 to go on from the checkpoints a run of the same cell left after k
    sessions (the study stopped mid-cell, e.g. when its machine's session ended); k and True when
    the run finished training and the study stopped while it scored the policies, whose summary.json
    then stands for the training. The record lives beside the run dir, in ``<key>.cell.json``, since
    launch refuses a run dir it did not make; anything else there, a run of other settings, or one
    stopped before any agent's first checkpoint, is cleared."""
    sessions, trained = kept_sessions(run_dir, fingerprint) if resumable else (0, False)
    if trained:
        return sessions, True
    if not sessions and run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    _write_json(_marker(run_dir), {"fingerprint": fingerprint, "sessions": sessions + 1})
    return sessions + 1, False


def kept_sessions(run_dir: Path, fingerprint: str) -> tuple[int, bool]:
    """(the sessions a stopped study's run of this cell had, whether it finished training), or
    (0, False) where ``run_dir`` holds nothing of this cell to go on from."""
    marker = _marker(run_dir)
    kept = read_record(marker) if marker.exists() else {}
    if kept.get("fingerprint") != fingerprint:
        return 0, False
    if kept.get("trained") and (run_dir / "summary.json").exists():
        return kept["sessions"], True
    if (run_dir / "config.json").exists() and any(run_dir.glob("agent-*/checkpoint.pt")):
        return kept["sessions"], False
    return 0, False


def _marker(run_dir: Path) -> Path:
    return run_dir.with_name(f"{run_dir.name}.cell.json")


def run_cell(
    cell: Cell,
    out: Path,
    env_id: str,
    threshold: float | None,
    eval_episodes: int,
    fingerprint: str,
    window: str | None = None,
) -> dict:
    """Run one cell, or go on with the run a stopped study left of it (``start_session``); its row.

    Each agent checkpoints ``CHECKPOINTS`` times over its budget, so a stop costs at most a tenth
    of a cell. A resumed run learns as an unbroken one would in distribution, not step for step:
    the episodes in progress at the stop restart, the random streams are drawn anew from (seed,
    rank, updates), and letters in flight or IMPALA's queued unrolls are dropped. Its wall-clock adds
    sessions under different machine load, so its row says how many (``sessions``) and RESULTS.md
    names it; its time split is its last session's, over the frames that session trained
    (``timed_frames``). Cells a ``runner`` runs (agents in network namespaces) start afresh."""
    run_dir = out / "runs" / cell.key
    sessions, trained = start_session(run_dir, fingerprint, resumable=cell.runner is None)
    swarm = cell.swarm if cell.runner else ran_swarm(cell)
    per_agent = cell.total_frames // cell.agents
    agent_cfg = AgentConfig(
        env_id=env_id,
        seed=cell.seed,
        total_frames=per_agent,
        a2c=cell_a2c(cell, env_id),
        gossip_every=cell.gossip_every,
        checkpoint_every=10**9,  # set below, from the updates the budget allows
        agents_per_host=cell.agents,
        device="cpu",
        **cell.agent,
    )
    hp = learner_settings(cell, env_id)
    updates = max(1, per_agent // steps_per_update(hp))
    agent_cfg = replace(
        agent_cfg, log_every=max(1, updates // CURVE_ROWS), checkpoint_every=max(1, updates // CHECKPOINTS)
    )
    if cell.runner is not None:
        summaries, wall = cell.runner(cell, agent_cfg, run_dir)
        agent_dirs = [run_dir / f"agent-{r}" for r in range(cell.agents)]
        gossip_share = sum(s["gossip_s"] for s in summaries) / sum(s["wall_seconds"] for s in summaries)
    else:
        if trained:
            summary = json.loads((run_dir / "summary.json").read_text())
        else:
            summary = launch.run(
                swarm,
                agent_cfg,
                run_dir,
                resume=sessions > 1,
                show_progress=False,
                echo=lambda *a: None,
            )
            if summary["stopped_by"] == "interrupted":  # Ctrl-C: launch returns what the agents checkpointed
                raise KeyboardInterrupt
        if summary["failed"]:
            raise RuntimeError(f"{cell.setting} seed {cell.seed}: agents failed: {summary['failed']}")
        if not trained:
            _write_json(_marker(run_dir), {"fingerprint": fingerprint, "sessions": sessions, "trained": True})
        wall = summary["wall_seconds"]
        summaries = [summary["per_agent"][r] for r in sorted(summary["per_agent"])]
        agent_dirs = [run_dir / f"agent-{r}" for r in range(cell.agents)]
        gossip_share = summary["gossip_share"]
    checkpoints = [d / "checkpoint.pt" for d in agent_dirs]
    agent_evals = [evaluate_consensus([c], episodes=eval_episodes)["mean"] for c in checkpoints]  # one agent alone
    consensus = evaluate_consensus(checkpoints, episodes=eval_episodes)
    means = [s["mean_return"] for s in summaries]
    curves = _write_curves(agent_dirs, out / "curves" / f"{cell.key}.csv")
    split = _time_split(summaries, curves)
    return {
        "setting": cell.setting,
        "seed": cell.seed,
        "agents": cell.agents,
        **cell.labels,
        "n_steps": hp.n_steps,  # the cell's learner's: PPO's 128-step rollouts, IMPALA's 20-step unrolls
        "num_envs": hp.num_envs,
        "gossip_every": cell.gossip_every,
        "data_plane": swarm.data_plane if swarm.gossips else None,
        "frames": int(sum(s["frames"] for s in summaries)),
        "steps_per_update": steps_per_update(hp),
        "timed_frames": float(np.mean([s["fps"] * s["wall_seconds"] for s in summaries])),
        "wall_s": wall,
        "fps": training_fps(curves, sum(s["frames"] for s in summaries) / wall),
        "agents_mean": float(np.mean(means)),
        "agents_min": float(np.min(means)),
        "agents_max": float(np.max(means)),
        "per_agent_last100": means,
        "per_agent_eval": agent_evals,
        "agents_eval_mean": float(np.mean(agent_evals)),
        "consensus_eval": consensus["mean"],
        "consensus_eval_std": consensus["std"],
        "eval_episodes": eval_episodes,
        "solved": None if threshold is None else bool(min(means) >= threshold),
        "consensus_solved": None if threshold is None else bool(consensus["mean"] >= threshold),
        "gossip_share": gossip_share,
        "sessions": sessions,
        # the window of machine load its training ran in: this call's, unknown for a run that an earlier
        # call trained and only left to be scored (its wall-clock is that call's)
        "window": None if trained else window,
        **split,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_curves(agent_dirs: list[Path], path: Path) -> list[dict]:
    rows = []
    for rank, agent_dir in enumerate(agent_dirs):
        with open(agent_dir / "metrics.csv", newline="") as f:
            for r in csv.DictReader(f):
                if r["mean_return_100"]:
                    rows.append(
                        {
                            "agent": rank,
                            "frames": int(r["frames"]),
                            "wall_s": float(r["wall_s"]),
                            "mean_return_100": float(r["mean_return_100"]),
                            "wait_s": float(r.get("gossip/wait_s") or 0.0),
                            "mix_s": float(r.get("gossip/mix_s") or 0.0),
                        }
                    )
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, ["agent", "frames", "wall_s", "mean_return_100", "wait_s", "mix_s"])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    return rows


def _time_split(summaries: list[dict], curves: list[dict]) -> dict:
    """Seconds per agent (averaged over agents) in rollout, learn, gossip wait and mix.

    The agent times rollout, learn and the whole gossip exchange; the exchange is split into
    waiting (send, the turn lock and the transfer, which the client does not tell apart) and
    mixing by the ratio of the per-exchange samples in metrics.csv."""
    wait = sum(r["wait_s"] for r in curves)
    mix = sum(r["mix_s"] for r in curves)
    mix_fraction = mix / (wait + mix) if wait + mix > 0 else 0.0
    gossip = float(np.mean([s.get("gossip_s", 0.0) for s in summaries]))
    return {
        "rollout_s": float(np.mean([s["rollout_s"] for s in summaries])),
        "learn_s": float(np.mean([s["learn_s"] for s in summaries])),
        "gossip_wait_s": gossip * (1 - mix_fraction),
        "mix_s": gossip * mix_fraction,
    }


def training_fps(curve: list[dict], default: float) -> float:
    """The swarm's frames per second of training: every agent's frames over the longest any agent's
    own training clock ran (each agent logs a last row when its budget is spent). That clock starts
    when the agent's training does and adds a resumed run's sessions, so process start-up and the
    final scoring are left out; a sync agent's wait for its peers' first letters is in. Agents that
    wait for no peer (independent or async) may start their clocks apart, by the spread of their
    start-ups (seconds, in cells of minutes): there it reads a little high. ``default`` where the
    curve has no rows."""
    last = {row["agent"]: row for row in curve}
    seconds = max((row["wall_s"] for row in last.values()), default=0.0)
    return sum(row["frames"] for row in last.values()) / seconds if seconds > 0 else default


def read_curves(out: Path, key: str) -> list[dict]:
    """A cell's curve, each agent's rows in the order it logged them. Where a run was resumed after a
    kill (OOM, a machine's session end), the rows its killed session logged past the checkpoint it
    went on from are left out: the resumed session logged those frames again, and metrics.csv kept
    both until gossiprl.rl.agent.MetricsLog dropped them on resume (some committed curves have both)."""
    with open(Path(out) / "curves" / f"{key}.csv", newline="") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    kept: dict[float, list[dict]] = {}
    for row in rows:
        mine = kept.setdefault(row["agent"], [])
        while mine and mine[-1]["frames"] >= row["frames"]:
            mine.pop()
        mine.append(row)
    return [row for mine in kept.values() for row in mine]


def swarm_curve(rows: list[dict], x: str, grid: np.ndarray, agents: int, hold_last: bool = False) -> np.ndarray:
    """Mean over agents of each agent's last-100 mean, interpolated on ``grid`` (``agent_curves``)."""
    per_agent = agent_curves(rows, x, grid, agents, hold_last)
    with warnings.catch_warnings():  # grid points no agent reached stay nan, as intended
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(per_agent, axis=0)


def agent_curves(rows: list[dict], x: str, grid: np.ndarray, agents: int, hold_last: bool = False) -> np.ndarray:
    """Each agent's last-100 mean interpolated on ``grid``: an (agents, points) array.

    x = 'frames': grid is in swarm frames (agent frames x agents); x = 'wall_s': seconds.
    Past an agent's last row the curve holds its last value only up to the grid point where
    it finished; beyond the end of the run it is nan (no extrapolation), unless ``hold_last``:
    then an agent that had spent its budget keeps its final value (it had nothing left to do)."""
    per_agent = []
    for a in sorted({int(r["agent"]) for r in rows}):
        pts = sorted(
            (r[x] * (agents if x == "frames" else 1), r["mean_return_100"]) for r in rows if int(r["agent"]) == a
        )
        xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        curve = np.interp(grid, xs, ys, left=np.nan, right=ys[-1] if hold_last else np.nan)
        curve[(grid > xs[-1]) & (grid <= xs[-1] * 1.001)] = ys[-1]
        per_agent.append(curve)
    return np.vstack(per_agent) if per_agent else np.full((1, len(grid)), np.nan)


def aggregate(rows: list[dict], settings: list[str], metrics: tuple[str, ...]) -> list[dict]:
    """One row per setting: seeds, and mean +- 95 % half-width of each metric."""
    table = []
    for setting in settings:
        mine = [r for r in rows if r["setting"] == setting]
        if not mine:
            continue
        entry = {"setting": setting, "seeds": len(mine)}
        for m in metrics:
            entry[m], entry[f"{m}_ci"] = ci95([r[m] for r in mine if r.get(m) is not None])
        if mine[0]["solved"] is not None:
            entry["solved"] = f"{sum(r['solved'] for r in mine)}/{len(mine)}"
        table.append(entry)
    return table


def write_csv(path: Path, rows: list[dict]) -> None:
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    tmp = Path(path).with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
    os.replace(tmp, path)
