"""The command line every study shares, and what it writes when its cells are done.

    python -m experiments.<study> [--quick] [--seeds 1,2,3,4,5] [--frames N] [--env ID] [--out DIR]

``--quick`` is CartPole with a tiny budget and two seeds (a smoke test of the whole pipeline,
not a result); without it the study runs on MinAtar Breakout. Into ``--out`` go ``cells/``
(one JSON row per finished cell), ``curves/``, ``results.csv`` (every cell, raw per seed),
``summary.csv`` (per setting: mean and 95 % half-width over seeds), ``study.json`` (what was
asked: budget, seeds, settings, commands) and ``figure.png``.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from experiments.common import (
    QUICK_ENV,
    REAL_ENV,
    Cell,
    aggregate,
    cell_key,
    cell_plan,
    fresh_out,
    in_run_order,
    load_rows,
    parse_seeds,
    read_curves,
    run_study,
    score_bounds,
    shown_rows,
    swarm_curve,
    write_csv,
)
from gossiprl.cli import interrupted_status, stop_on_sigterm
from gossiprl.rl.envs import env_spec

RESULTS = Path(__file__).resolve().parent / "results"
METRICS = (
    "agents_mean",
    "agents_min",
    "agents_eval_mean",
    "consensus_eval",
    "score_at_equal_wall",
    "wall_s",
    "fps",
    "gossip_share",
)


@dataclass
class Study:
    name: str
    title: str
    question: str
    build: Callable[[bool, int, list[int]], tuple[list[Cell], list[str]]]
    """(quick, --frames, seeds) -> (cells, settings in legend order); --frames is each cell's for the
    whole swarm, or each agent's where ``frames_per_agent``."""
    real_frames: int
    quick_frames: int = 16_000
    time_split: bool = False
    quick_settings: int | None = None
    """In --quick, keep only the first this many settings (the suite runs every study's --quick)."""
    frames_per_agent: bool = False
    """--frames is each agent's budget (a swarm of n trains n times as many), not the whole swarm's."""
    real_seeds: str = "1,2,3,4,5"
    """The seeds a real run plans by default: a confirmation study's are ones no other study ran."""


def command(study: Study) -> click.Command:
    @click.command(help=f"{study.title}: {study.question}")
    @click.option("--quick", is_flag=True, help=f"{QUICK_ENV}, tiny budget, 2 seeds: checks the pipeline in ~1 min.")
    @click.option(
        "--seeds",
        default=None,
        help=f"Comma-separated seeds [default: {study.real_seeds}; --quick: 1,2; in an existing --out, the seeds it "
        "plans]. Given for an existing --out, they run now and join its plan, which only grows.",
    )
    @click.option(
        "--frames",
        type=click.IntRange(min=1),
        default=None,
        help=f"Frames per cell {'for each agent' if study.frames_per_agent else 'for the whole swarm'} "
        f"[default: {study.real_frames:,}; --quick: {study.quick_frames:,}].",
    )
    @click.option("--env", "env_id", default=None, help=f"[default: {REAL_ENV}; --quick: {QUICK_ENV}]")
    @click.option(
        "--eval-episodes",
        type=click.IntRange(min=1),
        default=None,
        help="Episodes for each final-policy evaluation [default: 10; --quick: 3].",
    )
    @click.option(
        "--max-agents",
        type=click.IntRange(min=1),
        default=None,
        help="Run only the cells of at most this many agents now (the others stay planned, "
        "and RESULTS.md lists them as missing until run).",
    )
    @click.option(
        "--max-frames-per-agent",
        type=click.IntRange(min=1),
        default=None,
        help="Run only the cells that give each agent at most this many frames now (the longer ones stay "
        "planned, and RESULTS.md lists them as missing until run).",
    )
    @click.option(
        "--only",
        "only",
        multiple=True,
        help="Run only the cells of this setting now (repeat for several; the others stay planned, and "
        "RESULTS.md lists them as missing until run): e.g. arms another study's cache already holds.",
    )
    @click.option(
        "--plan",
        is_flag=True,
        help="Run nothing and write nothing: say what each planned cell needs now (done, in the shared cache, "
        "cut with checkpoints, to run) and the frames and hours left, in this window and in all.",
    )
    @click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=f"Results dir; give an existing one to resume it, experiments/results/{study.name} to update the "
        f"committed results [default: a fresh runs/{study.name}-<time>/, or a temporary dir with --quick].",
    )
    def main(quick, seeds, frames, env_id, eval_episodes, max_agents, max_frames_per_agent, only, plan, out):
        given_env, given_frames, given_out = env_id, frames, out
        env_id = env_id or (QUICK_ENV if quick else REAL_ENV)
        try:
            threshold = env_spec(env_id)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--env") from None
        asked = parse_seeds(seeds, "1,2" if quick else study.real_seeds)
        frames = frames or (study.quick_frames if quick else study.real_frames)
        out = out or fresh_out(study.name, quick, create=not plan)
        planned, seed_list = window_seeds(out, study.name, env_id, frames, quick, asked, given=seeds is not None)
        if planned != asked:
            seeds = ",".join(map(str, planned))
        again = rerun_command(study.name, quick, given_env, given_frames, seeds, eval_episodes, given_out)
        cells, settings = planned_cells(study, quick, frames, planned)
        if not cells:
            raise click.UsageError(f"{study.name}: nothing to run here ({settings or 'no settings'})")
        unknown = [s for s in only if s not in settings]
        if unknown:
            raise click.BadParameter(
                f"{study.name} has no setting {unknown[0]!r}; its settings: {'; '.join(settings)}", param_hint="--only"
            )
        now = run_now([c for c in cells if c.seed in seed_list], max_agents, max_frames_per_agent, only)
        eval_episodes = eval_episodes or default_eval_episodes(quick)
        if plan:
            for line in plan_lines(study, cells, now, out, env_id, eval_episodes):
                click.echo(line)
            return
        out.mkdir(parents=True, exist_ok=True)
        (out / "study.json").write_text(
            json.dumps(
                {
                    "study": study.name,
                    "title": study.title,
                    "question": study.question,
                    "env": env_id,
                    "threshold": threshold,
                    "frames_per_cell": frames,
                    "frames_per_agent": study.frames_per_agent,
                    "seeds": planned,
                    "settings": settings,
                    "quick": quick,
                    "command": again,
                },
                indent=2,
            )
        )
        click.echo(
            f"{study.title}: {len(cells)} cells ({len(settings)} settings x {len(planned)} seeds), "
            f"{frames:,} frames each on {env_id} -> {out}"
            + (f"; seeds {', '.join(map(str, seed_list))} now" if planned != seed_list else "")
        )
        stop_on_sigterm()  # a scheduler's kill: the cell in progress checkpoints, as on Ctrl-C
        try:
            run_study(now, out, env_id, threshold, eval_episodes, echo=click.echo)
            # every planned cell finished so far, this run's or an earlier one's: a window that ran some
            # settings must not trim the tables and the figure to them
            rows, older, _ = shown_rows(out, cells, env_id)
            finish(study, out, rows, settings, env_id, threshold, older)
        except KeyboardInterrupt:
            click.echo(
                f"{study.name} stopped: the same command with --out {shlex.quote(str(out))} goes on, "
                "from the cell it cut",
                err=True,
            )
            sys.exit(interrupted_status())

    return main


def window_seeds(
    out: Path, name: str, env_id: str, frames: int, quick: bool, asked: list[int], given: bool
) -> tuple[list[int], list[int]]:
    """(the seeds the study in ``out`` plans, the seeds to run now) for the seeds ``asked``: seeds
    ``given`` with --seeds run now and join the plan; without --seeds, every planned seed runs (an
    existing study goes on with all it plans)."""
    planned = plan_seeds(out, name, env_id, frames, quick, asked)
    return planned, (asked if given else planned)


def plan_seeds(out: Path, name: str, env_id: str, frames: int, quick: bool, seeds: list[int]) -> list[int]:
    """The seeds the study in ``out`` plans: ``seeds``, after those its study.json planned already
    for the same study, env, budget and kind of run. --seeds on an existing study is a window, as
    --only is: it runs those seeds now; it does not trim the plan (a run with --seeds 1,2,3 rewrote
    a study of 5 seeds to 3, and RESULTS.md dropped the other two from every setting)."""
    return list(dict.fromkeys([*earlier_plan(out, name, env_id, frames, quick).get("seeds", []), *seeds]))


def earlier_plan(out: Path, name: str, env_id: str, frames: int, quick: bool) -> dict:
    """The study.json in ``out`` where it is of this study, env, budget and kind of run, else {}."""
    try:
        earlier = json.loads((Path(out) / "study.json").read_text())
    except (OSError, ValueError):
        return {}
    same = (earlier.get("study"), earlier.get("env"), earlier.get("frames_per_cell"), earlier.get("quick"))
    return earlier if same == (name, env_id, frames, quick) else {}


def rerun_command(name: str, quick: bool, env_id, frames, seeds, eval_episodes, out) -> str:
    """The command that runs or resumes this whole study as it was asked for, quoted for a shell. The
    window flags (--only, --max-agents, --max-frames-per-agent) are left out: the tables come from
    every planned cell, so the command RESULTS.md shows must plan them all (it recorded a window's
    own flags, unquoted, which a shell split and which ran one arm)."""
    args = ["python", "-m", f"experiments.{name}", *(["--quick"] if quick else [])]
    for flag, value in (
        ("--env", env_id),
        ("--frames", frames),
        ("--seeds", seeds),
        ("--eval-episodes", eval_episodes),
        ("--out", out),
    ):
        if value is not None:
            args += [flag, str(value)]
    return shlex.join(args)


def default_eval_episodes(quick: bool) -> int:
    """Episodes each final policy is played for when --eval-episodes is not given."""
    return 3 if quick else 10


def run_now(
    cells: list[Cell], max_agents: int | None, max_frames_per_agent: int | None, only: tuple[str, ...] = ()
) -> list[Cell]:
    """The planned cells to run in this invocation: the small and short ones first, when a window of
    machine time is too short for all, or only some settings (the rest stay planned, and resume later)."""
    return [
        c
        for c in cells
        if (max_agents is None or c.agents <= max_agents)
        and (max_frames_per_agent is None or c.total_frames // c.agents <= max_frames_per_agent)
        and (not only or c.setting in only)
    ]


PLAN_STATES = {
    "done": "done",
    "cached": "in the shared cache (another study ran it): copied, not run",
    "trained": "trained, stopped while its policies were scored: scored only",
    "cut": "cut",
    "to run": "to run",
}


def plan_lines(
    study: Study, cells: list[Cell], now: list[Cell], out: Path, env_id: str, eval_episodes: int
) -> list[str]:
    """--plan: each planned cell in the order the study runs them, what it needs now, and the frames
    left in this window (``now``) and in the whole plan, with the hours they take at the pace of the
    study's finished cells (start-up and scoring included, as the machine's load was when they ran).
    Frames left are an upper bound where the env has a solve threshold: a solved cell stops early."""
    plans = {c.key: cell_plan(c, out, env_id, eval_episodes) for c in cells}
    window = {c.key for c in now if plans[c.key].state != "done"}
    lines = []
    for k, c in enumerate(in_run_order(cells), 1):
        plan = plans[c.key]
        what = PLAN_STATES[plan.state] + (f": {_frames_text(plan.frames_left)}" if plan.frames_left else "")
        notes = [plan.note] if plan.note else []
        if plan.state != "done" and c.key not in window:
            notes.append("not in this window")
        notes_text = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"[{k}/{len(cells)}] {c.setting}, seed {c.seed}: {what}{notes_text}")
    rows = load_rows(out, [c for c in cells if plans[c.key].state == "done"])  # not an older run's rows
    pace = sum(r["frames"] for r in rows) / sum(r["wall_s"] for r in rows) if rows else None

    def left(keys) -> str:
        frames = sum(plans[key].frames_left for key in keys)
        hours = f", about {frames / pace / 3600:.1f} h at {pace:,.0f} frames/s" if pace and frames else ""
        return f"{_frames_text(frames)}{hours}"

    counts = Counter(plan.state for plan in plans.values())
    states = ", ".join(f"{counts[state]} {state}" for state in PLAN_STATES if counts[state])
    lines.append(
        f"{study.name} on {env_id} in {out}: {len(cells)} cells planned ({states}). "
        f"Left in this window ({len(window)} cells): "
        f"{left(window)}; in the whole plan: {left(plans)}."
        + ("" if pace else " No finished cell of this study yet to time the rest by.")
    )
    return lines


def _frames_text(frames: int) -> str:
    return f"{frames / 1e6:,.1f} M frames" if frames >= 1_000_000 else f"{frames:,} frames"


def planned_cells(study: Study, quick: bool, frames: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    cells, settings = study.build(quick, frames, seeds)
    if quick and study.quick_settings:
        settings = settings[: study.quick_settings]
        cells = [c for c in cells if c.setting in settings]
    return cells, settings


def finish(
    study: Study,
    out: Path,
    rows: list[dict],
    settings: list[str],
    env_id: str,
    threshold: float | None,
    older: set = frozenset(),
) -> None:
    """Tables and the figure from whatever cells exist (resumed or partial studies included); ``older``,
    the keys of cells that are older runs."""
    from experiments.figures import study_figure
    from experiments.untrained import untrained_score

    add_equal_wall_score(out, rows, older)
    write_csv(out / "results.csv", rows)
    table = aggregate(rows, settings, METRICS)
    write_csv(out / "summary.csv", table)
    study_figure(
        out,
        rows,
        settings,
        out / "figure.png",
        study.title,
        env_id,
        time_split=study.time_split,
        threshold=threshold,
        frames_per_agent=study.frames_per_agent,
        bounds=score_bounds(env_id)[0],
        untrained=(untrained_score(env_id) or {}).get("mean"),
    )
    for entry in table:
        click.echo(
            f"  {entry['setting']:28s} seeds {entry['seeds']}  agents' last-100 "
            f"{entry['agents_mean']:8.2f} +- {_fmt(entry['agents_mean_ci'])}  consensus eval "
            f"{entry['consensus_eval']:8.2f} +- {_fmt(entry['consensus_eval_ci'])}  at equal wall-clock "
            f"{entry['score_at_equal_wall']:8.2f}"
        )
    click.echo(f"tables in {out / 'summary.csv'} and {out / 'results.csv'}, figure {out / 'figure.png'}")


def add_equal_wall_score(out: Path, rows: list[dict], older: set = frozenset()) -> None:
    """Each cell's score (mean of its agents' last-100 means) after T seconds of training, T being
    the shortest of the settings' median training times: the equal-time comparison. A cell that
    finished its frames before T keeps its final score (the budget was spent). The median over
    seeds, not the single fastest cell, because other jobs on the shared cores make a lone cell
    fast or slow. Cells that are older runs (keys in ``older``) set T only where no cell is today's:
    a study part-way through a 10x budget had T = 11 s from its older cells, before a 1M-frame cell
    logged its first point."""
    if not rows:
        return
    curves = {cell_key(r["setting"], r["seed"]): read_curves(out, cell_key(r["setting"], r["seed"])) for r in rows}
    ends: dict[str, list[float]] = {}
    today = [r for r in rows if cell_key(r["setting"], r["seed"]) not in older] or rows
    for r in today:
        points = curves[cell_key(r["setting"], r["seed"])]
        if points:
            ends.setdefault(r["setting"], []).append(max(c["wall_s"] for c in points))
    t = min(float(np.median(v)) for v in ends.values()) if ends else 0.0
    for r in rows:
        r["equal_wall_s"] = t
        value = swarm_curve(
            curves[cell_key(r["setting"], r["seed"])], "wall_s", np.array([t]), r["agents"], hold_last=True
        )[0]
        r["score_at_equal_wall"] = None if np.isnan(value) else float(value)


def _fmt(value: float) -> str:
    return "  n/a" if value != value else f"{value:5.2f}"
