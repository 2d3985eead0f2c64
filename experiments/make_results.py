"""Write experiments/RESULTS.md from the studies' cells: every number in it comes from a CSV/JSON
under experiments/results/, so it is regenerated, never edited by hand.

For each study it rebuilds results.csv, summary.csv and figure.png from whatever cells exist
(a study cut short is reported with the cells it is missing), then writes the question, the
setup, the untrained policy's score, the table, the figure and what the data says: each paper's
claim judged on its own axis by the interval estimates of experiments/stats.py, as
experiments/claims.py says. PALA's Table 1 (experiments/table1) gets one table of every arm beside
Stable-Baselines3 and the published figure, its cells read from the shared cell cache where
another study ran them, so the arms that study shares show before the table is run; and P(X > Y)
for each gossiping A2C against one agent and for GALA's ordering against PALA's.

    python -m experiments.make_results [--results experiments/results] [--output experiments/RESULTS.md]
"""

from __future__ import annotations

import csv
import importlib
import json
import math
import platform
from dataclasses import replace
from pathlib import Path

import click
import numpy as np

from experiments import claims, learners, stats, swarm_vs_one, table1
from experiments.common import (
    REAL_ENV,
    STUDY_MINATAR_LR,
    aggregate,
    cell_fingerprint,
    cell_key,
    ci95,
    load_rows,
    read_curves,
    read_record,
    score_bounds,
    shared_row,
    shown_rows,
    todays_rows,
)
from experiments.figures import load_windows, reference_figure
from experiments.study import METRICS, RESULTS, default_eval_episodes, finish, planned_cells
from experiments.untrained import untrained_score, untrained_text
from gossiprl.rl.settings import MINATAR_LR

SECOND_GAME = "MinAtar/SpaceInvaders-v1"
"""The game a study's ``<study>_spaceinvaders`` dir holds (experiments/run_all.sh runs it)."""

STUDIES = [
    "swarm_learning",
    "swarm_vs_one",
    "swarm_vs_one_spaceinvaders",
    "lr_sweep",
    "lr_sweep_spaceinvaders",
    "lr_confirm",
    "lr_confirm_spaceinvaders",
    "learners",
    "ordering_ablation",
    "ordering_ablation_spaceinvaders",
    "topology_ablation",
    "topology_ablation_spaceinvaders",
    "scaling",
    "scaling_spaceinvaders",
    "batch_period",
    "layout",
]
"""The studies' dirs under the results, in report order (a study run on a second game has its own dir)."""

LR_SWEEP_NOTE = (
    "**Per-second comparisons here are void.** One agent's 2.8e-3 cells and SpaceInvaders' ring at 1.4e-3 ran "
    "on 2026-11-27 two studies at a time, beside test runs, on 2 cores; the 7e-4 and 1.4e-3 cells are "
    "swarm_vs_one's runs, read from the shared cache, made in other windows of load; the ring's 2.8e-3 cells "
    "ran on 2026-11-28 in a window of their own, with the machine mostly to themselves (14,000-21,000 frames/s "
    "a cell on Breakout against 2,700-8,000 for the older rings). Per frame every cell stands."
)

ORDERING_NOTE = (
    "Async agents gossip without turn locks; max-staleness k makes an agent wait once it has gone k rounds "
    "without a letter from an in-peer. Overlapped sync keeps the turn locks and mixes each round's letters one "
    "update late, its learning rate scaled by 2 - p_ii (1.5 on this ring), as `gossiprl run --gossip-overlap` "
    "does; it joined the study after the other arms had run, so its cells ran in later windows."
)

NOTES = {
    "learners": "**Per-second comparisons here are void.** These cells ran at nice 19 beside another study, "
    "and the study was held stopped (SIGSTOP) for whole cells of that one: a cell's wall-clock, and its "
    "frames/s, include those pauses (PPO's seed 2: 2,161 s for 1M frames). The per-frame columns stand.",
    "scaling": "**Per-second comparisons between sizes are void.** The 1-, 2- and 4-agent cells ran on "
    "2026-11-27 and 2026-11-28 in other windows of load (the 1- and 4-agent cells are swarm_vs_one's, read "
    "from the shared cache, run beside other studies); the rings of 8 ran in one window of their own on 2026-11-28, "
    "the rings of 16 in two on 2026-11-29 with the machine otherwise mostly idle, save seed 2 beside a full "
    "test run (13,297 frames/s against 15,999-19,365). A ring of 16 has 16 processes on the 2 cores, so its "
    "frames/s measure the sharing, not what each agent would train on its own hardware. Per frame every cell stands.",
    "scaling_spaceinvaders": "**Per-second comparisons between sizes are void.** The 1-, 2- and 4-agent cells "
    "ran on the old, unbatched SpaceInvaders (2026-11-27 and 2026-11-28, in other windows of load); the rings of 8 "
    "ran seed 1 on it (9,833 frames/s) and seeds 2-5 on the batched game (9,996-17,214), and the rings of 16 on "
    "2026-11-29 on the batched game: seed 1 beside Table 1's PPO and IMPALA cells (8,571 frames/s), seed 2 "
    "beside them for its first minutes (15,066), seeds 3-5 with the machine otherwise mostly idle. The batched game "
    "steps the same rules in one array (per frame it is the same game: tests/unit/rl/test_space_invaders.py). "
    "Per frame every cell stands.",
    "swarm_learning": "Every cell ran in one call of the study on 2026-11-28 (one window of machine load), "
    "all settings seed by seed, under loop version 4 ((seed, rank) streams), on the shared 2-core VM beside "
    "edits and short tests; a 1-agent cell uses one of the two cores, a ring both, so wall-clock is not the point "
    "of this study. No letter was dropped or skipped in any cell; in the old-defaults ring (each agent its own "
    "initial network) every agent had one letter clipped by the deviation bound, in the first round, where its "
    "neighbours' networks were still their own draws (`gossip/clipped` in their metrics).",
    "layout": "The spread layout runs the agents as `gossiprl agent` commands in network namespaces (as "
    "tests/integration/test_netns.py does): a broker host and two agent hosts with 2 agents each, every link "
    "shaped with tc to 1 Gbit/s; the same two cores serve all of them.",
    "topology_ablation": "The ring and independent 4-agent cells are runs other studies share (the shared cell "
    "cache: the same configuration and seeds run once): they ran in other windows of machine load, so their "
    "wall-clock and frames/s are not comparable with the other topologies' — compare those settings per frame.",
    "swarm_vs_one": "Cells ran under loop version 4: agent r of seed s draws from (seed, rank), so seeds share "
    "no agent's episodes (the first run, with seed + rank streams, is in docs/swarm-learning.md). In the "
    "ring's seed 1 each agent skipped 3-11 of its 12,500 gossip rounds while a benchmark starved the job for "
    "a few seconds (`gossip/skipped` in its metrics). They ran before robust mixing capped the cumulative "
    "drift of what mixing does to an agent; the cap changes a mix only when it cuts (`gossip/clipped`), which "
    "no honest run measured so far has done. The default arms (lr 1.4e-3, MinAtar's default from 2026-11-27 "
    "until lr_confirm's result moved it to 2.8e-3; the studies keep it) ran "
    "that day, with the cap, as lr x2 arms of this study and of experiments.lr_sweep, while other studies ran "
    "beside them at the same nice level: their wall-clock and frames/s are not comparable with the 7e-4 arms'; "
    "per frame they are.",
    "lr_sweep": LR_SWEEP_NOTE,
    "lr_sweep_spaceinvaders": LR_SWEEP_NOTE,
    "ordering_ablation": ORDERING_NOTE,
    "ordering_ablation_spaceinvaders": f"{ORDERING_NOTE} **Per-second comparisons with sync are "
    "void.** The sync cells are swarm_vs_one's ring of 4 (the shared cell cache), run on 2026-11-27 under "
    "another window's load, before the other arms ran (seeds 1-4 on 2026-11-28's first window, seed 5 in a "
    "later one): a sync agent's rollout, the same work in every arm, took 61 ms an update against the other "
    "arms' 11-31 ms. The other arms ran interleaved seed by seed; per frame every cell stands.",
}

SCORES = ("agents_mean", "agents_min", "agents_eval_mean", "consensus_eval", "score_at_equal_wall")
"""The table's columns that are episode returns: their intervals are cut to the score's range."""


def fmt(mean, half, bounds: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """mean ± half, or mean [low, high] where the interval is cut to ``bounds``."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    if half is None or math.isnan(half):
        return f"{mean:.2f}"
    low, high = max(mean - half, bounds[0]), min(mean + half, bounds[1])
    if (low, high) != (mean - half, mean + half):
        return f"{mean:.2f} [{low:.2f}, {high:.2f}]"
    return f"{mean:.2f} ± {half:.2f}"


def cell(entry: dict, metric: str, bounds: tuple[float, float]) -> str:
    """One table cell: a score's interval cut to the score's range, a wall-clock's to >= 0."""
    return fmt(entry[metric], entry[f"{metric}_ci"], bounds if metric in SCORES else (0.0, math.inf))


def study_section(folder: str, results: Path) -> list[str]:
    """One study's section from the dir ``results / folder`` (its study.json names the study, so a
    second game's run of a study has a dir of its own)."""
    out = results / folder
    if not (out / "study.json").exists():
        name = folder.removesuffix("_spaceinvaders")
        study = importlib.import_module(f"experiments.{name}").STUDY
        game = f" --env {SECOND_GAME}" if name != folder else ""
        command = f"python -m experiments.{name}{game} --out experiments/results/{folder}"
        title = f"## {study.title}" + (f": {SECOND_GAME}" if name != folder else "")
        return [title, "", f"**Not run** yet: `{command}` (experiments/run_all.sh).", ""]
    meta = json.loads((out / "study.json").read_text())
    name = meta.get("study", folder)
    module = importlib.import_module(f"experiments.{name}")
    cells, settings = planned_cells(module.STUDY, meta["quick"], meta["frames_per_cell"], meta["seeds"])
    # a study whose --frames changed meaning (the whole swarm's then, each agent's now) plans other cells
    # than its study.json's command ran: every cell it has is an older run, and its figure keeps their axis
    as_run = replace(module.STUDY, frames_per_agent=bool(meta.get("frames_per_agent")))
    replanned = as_run.frames_per_agent != module.STUDY.frames_per_agent
    rows, older, hidden_cells = shown_rows(out, cells, meta["env"], replanned)
    hidden = [f"{c.setting} seed {c.seed}" for c in hidden_cells]
    stale = list(dict.fromkeys(r["setting"] for r in rows if cell_key(r["setting"], r["seed"]) in older))
    todays_settings = [s for s in settings if s not in stale]  # a study all of whose cells are older has none
    done = cells_done(out, cells, older)
    missing = [f"{c.setting} seed {c.seed}" for c in cells if c.key not in done]
    title = meta["title"] if folder == name else f"{meta['title']}: {meta['env']}"
    question = module.STUDY.question  # the study's as it is now (its plan is), not as its study.json last ran
    lines = [f"## {title}", "", f"**Question.** {question[0].upper()}{question[1:]}", ""]
    budget = (
        "frames for each agent (a ring of 4 trains 4x as many in all)"
        if meta.get("frames_per_agent")
        else "frames per cell for the whole swarm (split evenly over its agents)"
    )
    lines += [
        f"**Setup.** `{meta['command'].strip()}` — {meta['env']}, {meta['frames_per_cell']:,} {budget}, "
        f"seeds {', '.join(map(str, meta['seeds']))}; {len(done)} of {len(cells)} cells finished."
        + (f" Final policies evaluated over {rows[0]['eval_episodes']} episodes each." if rows else "")
    ]
    if missing:
        lines += [
            "",
            f"**Missing cells** (no result of today's plan when this file was generated; an older run may "
            f"stand in, below): {', '.join(missing)}.",
        ]
    if stale:
        lines += [
            "",
            f"**Older runs.** The cells of {'; '.join(stale)} ran under an older agent loop or other settings than "
            "the study plans today (A2C's MinAtar rate was 7e-4 before 2026-11-27; "
            "experiments.common.LOOP_VERSION says what else changed"
            + ("; and this study's --frames was the whole swarm's then, each agent's now" if replanned else "")
            + "): the table shows them as they ran; no verdict is read off them"
            + (" and the IQM lists leave them out" if todays_settings else "")
            + "; running the study's command again replaces them.",
        ]
    if hidden:
        lines += ["", f"**Left out** beside today's cells of the same setting, as older runs: {', '.join(hidden)}."]
    resumed = [f"{r['setting']} seed {r['seed']} ({r['sessions']} sessions)" for r in rows if r.get("sessions", 1) > 1]
    if resumed:
        lines += [
            "",
            f"**Resumed cells.** {'; '.join(resumed)} went on from their agents' checkpoints after the study was "
            "stopped: per frame they stand (only the episodes in progress at the stop restarted), but their "
            "wall-clock and frames/s add sessions under different machine load.",
        ]
    lines += plane_lines(rows)
    lines += game_loop_lines(rows, meta["env"])
    lines += shared_lines(rows, settings, studies_that_ran(results, exclude=folder))
    if not rows:
        return lines + [""]
    finish(as_run, out, rows, settings, meta["env"], meta["threshold"], older)
    table = {e["setting"]: e for e in aggregate(rows, settings, METRICS)}
    bounds, bounds_said = score_bounds(meta["env"])
    arms = claims.Arms(out, rows)
    lines += [
        "",
        f"**Untrained policy** on {meta['env']}: {untrained_text(meta['env'])}; the dashed line in the figure.",
        "",
        "| setting | seeds | agents' own last-100 mean | worst agent | agents' final policies (eval) | "
        f"consensus policy (eval) | score at {arms.t_equal:.0f} s of training | wall-clock per cell (s) | "
        "frames/s | gossip share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting in settings:
        if setting not in table:
            continue
        e = table[setting]
        columns = " | ".join(cell(e, m, bounds) for m in METRICS if m not in ("fps", "gossip_share"))
        lines.append(f"| {setting} | {e['seeds']} | {columns} | {e['fps']:.0f} | {100 * e['gossip_share']:.0f} % |")
    lines += [
        "",
        f"Mean ± 95 % t-interval over seeds, for reference (the comparisons below use the bootstrap); an interval "
        f"that would leave the score's range, {bounds_said}, is cut to it and shown as [low, high]. frames/s: all "
        "agents' frames over the training clock (the longest any agent trained; start-up and scoring left out), "
        "mean over seeds. Raw per-seed "
        f"rows: [results/{folder}/results.csv](results/{folder}/results.csv); per setting: "
        f"[summary.csv](results/{folder}/summary.csv).",
        "",
        f"![{title}](results/{folder}/figure.png)",
        "",
    ]
    if folder in NOTES:
        lines += [f"**Note.** {NOTES[folder]}", ""]
    frames_per_agent = bool(meta.get("frames_per_agent"))
    so_far = f" (so far: {len(done)} of {len(cells)} cells; a verdict may change as the rest come in)"
    lines += [f"**What the data says{so_far if missing else ''}.**", ""]
    lines += claims.claim_lines(name, arms, bounds, frames_per_agent, tuple(stale))
    lines += claims.equal_total_lines(name, arms, bounds, tuple(stale))
    lines += iqm_lines(arms, todays_settings or settings, bounds, frames_per_agent)
    lines += claims.comparison_lines(name, arms, settings, frames_per_agent, tuple(stale))
    today = [e for e in table.values() if e["setting"] not in stale] or list(table.values())
    lines += [
        f"- Fastest in frames/s: **{max(today, key=lambda e: e['fps'])['setting']}**"
        + (" (of the settings run today)" if len(today) < len(table) else "")
        + WINDOWS_SAID[load_windows(rows)]
        + "."
    ]
    return lines + time_split_lines(rows, settings) + [""]


def plane_lines(rows: list[dict]) -> list[str]:
    """Which data plane the gossiping cells ran on, where they did not all run on one: per frame a
    sync cell learns the same on either, its wall-clock and frames/s do not compare across them.
    Rows from before the plane was recorded ran through the broker where they gossiped at all, which
    their mixing time tells (their gossip share is not 0 without gossip: it times the empty hook)."""
    planes: dict[str, list[str]] = {}
    for r in rows:
        plane = r.get("data_plane") or ("broker" if r.get("mix_s") else None)
        if plane is not None:
            planes.setdefault(plane, []).append(f"{r['setting']} seed {r['seed']}")
    if len(planes) < 2:
        return []
    said = "; ".join(f"over {p}: {', '.join(cells)}" for p, cells in sorted(planes.items()))
    return [
        "",
        f"**Data planes.** The gossiping cells ran on more than one ({said}). Per frame a sync cell learns "
        "bitwise the same on either; their wall-clock, frames/s and time split do not compare across planes.",
    ]


BATCHED_SINCE = {"MinAtar/SpaceInvaders-v1": "2026-11-29T02:19:11Z"}
"""When the studies' runs of each batched MinAtar game (gossiprl.rl.envs.BATCHED_GAMES) began stepping
its envs as one batch: a cell whose study call started before stepped MinAtar's own loop. A cell with no
window (run before windows were recorded, or trained by an earlier call and only scored by a later one)
is counted as before: its frames/s compare with no other cell's anyway."""


def game_loop_lines(rows: list[dict], env: str) -> list[str]:
    """Which cells of a batched game stepped MinAtar's own loop, where some did: per frame they learn
    bitwise the same, but each frame cost more CPU, so their frames/s do not compare with the others'."""
    since = BATCHED_SINCE.get(env)
    before = [r for r in rows if since and (r.get("window") or "") < since]
    if not before:
        return []
    seeds: dict[str, list[str]] = {}
    for r in before:
        seeds.setdefault(r["setting"], []).append(str(r["seed"]))
    cells = "; ".join(f"{setting} (seed{'s' * (len(s) > 1)} {', '.join(s)})" for setting, s in seeds.items())
    share = "all its cells" if len(before) == len(rows) else cells
    return [
        "",
        f"**MinAtar's own loop.** {share[0].upper()}{share[1:]} stepped {env}'s games one by one in MinAtar's "
        f"code; later cells step them as one numpy batch (from {since}). Per frame the two learn bitwise the "
        "same; the loop spent about 1.3-1.7x the CPU per frame, so frames/s and wall-clock do not compare "
        "across the change.",
    ]


def by_seed(rows: list[dict], setting: str) -> np.ndarray:
    """A setting's scores as one task for experiments.stats: (seeds, agents), each agent's own last-100."""
    return np.array([r["per_agent_last100"] for r in rows if r["setting"] == setting], dtype=float)


def cells_done(out: Path, cells: list, older: set) -> set[str]:
    """The keys of the planned cells that hold today's plan's result: an older run standing in for one
    (another budget, loop or rate) is shown, but the cell is still to run."""
    return {c.key for c in cells if (out / "cells" / f"{c.key}.json").exists() and c.key not in older}


def iqm_lines(arms: claims.Arms, settings: list[str], bounds: tuple[float, float], frames_per_agent: bool) -> list[str]:
    """IQM of every agent's own last-100 score per setting, at the end of its frames and at equal
    wall-clock, with its stratified-bootstrap interval (whole seeds resampled, so the agents of one
    swarm, which are not independent, stay together). ``settings`` leaves out older runs where a study
    has cells of today's plan: at another budget they would read as today's swarms at the untrained score."""
    lines = []
    for axis in ("frames", "wall_s"):
        parts = []
        for setting in settings:
            estimate = arms.iqm(setting, axis, bounds)
            if estimate is None:
                continue
            seeds = len(arms.scores(setting, axis))
            few = "; too few seeds for an interval" if estimate.low is None else ""
            parts.append(f"{setting} {claims.interval_text(estimate)} ({seeds} seed(s){few})")
        lines.append(
            f"- IQM of every agent's own last-100 score {claims.axis_text(axis, arms, frames_per_agent)}, "
            f"95 % stratified-bootstrap interval over seeds: {'; '.join(parts)}"
            + (WINDOWS_SAID[load_windows(arms.rows)] if axis == "wall_s" else "")
            + "."
        )
    return lines


WINDOWS_SAID = {
    "unrecorded": " (these cells record no window of machine load: a description, no comparison)",
    "several": " (the cells ran under different machine loads: settings compare in time only where a comparison "
    "reads them)",
    "one": "",
}
"""What a study's per-second figures can be read as, by ``figures.load_windows``."""


def across_games_pairs() -> dict[str, list[tuple[str, str]]]:
    """The studies read across games, and their comparisons: a ring of 4 against one agent at the
    studies' rate (with the Atari rate and the equal-total arms), and at MinAtar's default since lr_confirm."""
    claim, equal = claims.CLAIMS["swarm_vs_one"], claims.EQUAL_TOTAL["swarm_vs_one"]
    return {
        "swarm_vs_one": claim.pairs + claims.EXTRA["swarm_vs_one"] + [(equal.swarm, equal.total)],
        "lr_confirm": claims.CLAIMS["lr_confirm"].pairs,
    }


def across_games_lines(results: Path) -> list[str]:
    """P(X > Y) for each of ``across_games_pairs``' comparisons over every game its study ran on (a dir
    per game), averaged over games with each game's seeds resampled on their own: the scale-free summary
    across games (an IQM across games would need their scores normalised first)."""
    parts = []
    for name, pairs in across_games_pairs().items():
        study = importlib.import_module(f"experiments.{name}").STUDY
        games = {}
        for out in sorted(results.glob(f"{name}*")):
            if not (out / "study.json").exists():
                continue
            meta = json.loads((out / "study.json").read_text())
            if meta.get("study", out.name) == name:
                cells, _ = planned_cells(study, meta["quick"], meta["frames_per_cell"], meta["seeds"])
                games[meta["env"]] = todays_rows(out, cells, meta["env"])
        for reference, other in pairs:
            played = {
                env: rows for env, rows in games.items() if len(by_seed(rows, reference)) and len(by_seed(rows, other))
            }
            if len(played) < 2:
                continue
            estimate = stats.improvement_interval(
                [by_seed(rows, reference) for rows in played.values()],
                [by_seed(rows, other) for rows in played.values()],
            )
            parts.append(f"P({reference} > {other}) over {', '.join(played)} = {claims.interval_text(estimate)}")
    if not parts:
        return []
    return [
        "## A ring of 4 against one agent, across games",
        "",
        "Probability of improvement averaged over games, 95 % bootstrap interval with each game's seeds resampled "
        f"within that game: {'; '.join(parts)}.",
        "",
    ]


def time_split_lines(rows: list[dict], settings: list[str]) -> list[str]:
    """Where an agent's update goes, per setting (mean over seeds), from the cells' timers."""
    from experiments.figures import updates_per_agent

    parts = []
    for setting in settings:
        mine = [r for r in rows if r["setting"] == setting]
        if not mine:
            continue
        ms = {
            k: sum(1e3 * r[k] / updates_per_agent(r) for r in mine) / len(mine)
            for k in ("rollout_s", "learn_s", "gossip_wait_s", "mix_s")
        }
        parts.append(
            f"{setting} {sum(ms.values()):.0f} ms (rollout {ms['rollout_s']:.0f}, learn {ms['learn_s']:.0f}, "
            f"gossip wait + transfer {ms['gossip_wait_s']:.0f}, mix {ms['mix_s']:.1f})"
        )
    return [f"- One agent's update, mean over seeds: {'; '.join(parts)}."]


MINATAR_PAPER = (
    "Young & Tian 2019, *MinAtar: An Atari-inspired testbed for thorough and reproducible reinforcement "
    "learning experiments*, arXiv:1903.03176"
)
PUBLISHED = {
    "MinAtar/Breakout-v1": [("AC(λ)", 1_000_000, 9, 10), ("AC(λ)", 5_000_000, 17, 18), ("DQN", 1_000_000, 10, 10)],
    "MinAtar/SpaceInvaders-v1": [
        ("AC(λ)", 1_000_000, 50, 55),
        ("AC(λ)", 5_000_000, 180, 190),
        ("DQN", 1_000_000, 30, 35),
    ],
}
"""The MinAtar paper's scores per env as (agent, frames, low, high), read off its learning curves
(approximate; the curves' figure is also img/learning_curves.gif in kenjyoung/MinAtar), AC(λ) at
λ = 0.8, its better trace; its AC(λ) is an online actor-critic with eligibility traces, not A2C."""


def published_text(env: str) -> str:
    return "; ".join(
        f"{name} about {low:g}{f'-{high:g}' if high != low else ''} at {frames / 1e6:g}M frames"
        for name, frames, low, high in PUBLISHED[env]
    )


def episode_curve(out: Path, key: str) -> list[dict]:
    """A baselines run's episodes (experiments/baselines.py's curve CSV) as the last-100 mean
    after each one, in the rows ``agent_curves`` reads (as ``read_curves`` gives a study's)."""
    with open(out / "curves" / f"{key}.csv", newline="") as f:
        episodes = [(int(r["frames"]), float(r["return"])) for r in csv.DictReader(f)]
    sums = np.concatenate([[0.0], np.cumsum([ret for _, ret in episodes])])
    return [
        {"agent": 0, "frames": frames, "mean_return_100": (sums[k + 1] - sums[max(0, k - 99)]) / min(k + 1, 100)}
        for k, (frames, _) in enumerate(episodes)
    ]


def baselines_sections(results: Path) -> list[str]:
    """One section per ``baselines*`` dir (one env each): experiments/baselines.py's SB3 runs."""
    lines = []
    for out in sorted(results.glob("baselines*")):
        if (out / "study.json").exists():
            lines += baselines_section(out, results)
    return lines or ["## Reference: Stable-Baselines3 A2C and PPO", "", "**Not run**: no results in this checkout.", ""]


def baselines_section(out: Path, results: Path) -> list[str]:
    meta = json.loads((out / "study.json").read_text())
    rows = load_rows(out)
    env, frames = meta["env"], meta["frames_per_cell"]
    lines = [
        f"## Reference: Stable-Baselines3 A2C and PPO on {env}",
        "",
        "**Question.** Where do gossiprl's agents stand against a well-known library's A2C and PPO, on the same "
        "env, frames, seeds and network?",
        "",
        f"**Setup.** `{meta['command'].strip()}` — {frames:,} frames per run, seeds "
        f"{', '.join(map(str, meta['seeds']))}; {len(rows)} of {len(meta['seeds']) * len(meta['settings'])} runs "
        "finished. What matches gossiprl's one agent (network, A2C hyperparameters) and where PPO's settings come "
        "from: experiments/baselines.py; each row carries its settings and the SB3 and torch versions.",
        "",
    ]
    # (setting, its rows, frames per agent, its dir, the reader of a cell's curve there)
    entries = [(s, [r for r in rows if r["setting"] == s], frames, out, episode_curve) for s in meta["settings"]]
    for swarm in sorted(results.glob("swarm_vs_one*")):  # the study on this env (a dir per env)
        swarm_meta = json.loads((swarm / "study.json").read_text()) if (swarm / "study.json").exists() else {}
        if swarm_meta.get("env") == env:
            swarm_rows = load_rows(swarm)
            for setting in ("1 agent", swarm_vs_one.ONE_ATARI, "ring of 4"):
                mine = [r for r in swarm_rows if r["setting"] == setting]
                entries.append(
                    (f"gossiprl, {setting} ({swarm.name})", mine, swarm_meta["frames_per_cell"], swarm, read_curves)
                )
            break
    folder = results / "learners"  # gossiprl's PPO, beside SB3's (CleanRL's settings in both)
    plan = json.loads((folder / "study.json").read_text()) if (folder / "study.json").exists() else {}
    if plan.get("env") == env:
        planned, _ = planned_cells(learners.STUDY, plan["quick"], plan["frames_per_cell"], plan["seeds"])
        mine = [r for r in shown_rows(folder, planned, env)[0] if r["setting"] == PPO_ONE]
        entries.append((GOSSIPRL_PPO, mine, plan["frames_per_cell"], folder, read_curves))
    lines += [
        "| setting | frames per agent | seeds | IQM of last-100 [95 % bootstrap] | mean ± 95 % t | frames/s |",
        "|---|---|---|---|---|---|",
    ]
    bounds, bounds_said = score_bounds(env)
    frames_of, curves, scores = {}, {}, {}
    for setting, mine, per_agent, folder, reader in entries:
        if not mine:
            continue
        curves[setting] = [reader(folder, cell_key(r["setting"], r["seed"])) for r in mine]
        scores[setting] = np.array([r["per_agent_last100"] for r in mine], dtype=float)
        estimate = stats.iqm_interval([scores[setting]]).clipped(bounds)
        frames_of[setting] = per_agent
        mean, half = ci95([float(np.mean(r["per_agent_last100"])) for r in mine])
        fps = np.mean([r["fps"] for r in mine])
        lines.append(
            f"| {setting} | {per_agent:,} | {len(mine)} | {claims.interval_text(estimate)} | "
            f"{fmt(mean, half, bounds)} | {fps:.0f} |"
        )
    lines += [
        "",
        "Score: each agent's own mean return over its last 100 training episodes; IQM over all agents of all "
        "seeds, whole seeds resampled for the interval; intervals cut to the score's range, "
        f"{bounds_said}. Untrained policy: {untrained_text(env)}. frames/s: SB3's from its training clock alone (one "
        "process, one torch thread); gossiprl's are all agents' frames over their training clock, start-up "
        "left out, measured in another window of machine load, so compare them loosely. Raw rows: "
        f"[results/{out.name}/results.csv](results/{out.name}/results.csv); every episode: "
        f"results/{out.name}/curves/.",
        "",
    ]
    if env in PUBLISHED:
        lines += [
            f"**Published.** {MINATAR_PAPER}: {published_text(env)} (read off the paper's curves, approximate).",
            "",
        ]
    if curves:
        untrained = untrained_score(env)
        reference_figure(
            curves, PUBLISHED.get(env, []), out / "figure.png", env, bounds, untrained and untrained["mean"]
        )
        lines += [f"![SB3 reference on {env}](results/{out.name}/figure.png)", ""]
    lines += reference_lines(meta["settings"], scores, frames_of)
    return lines + same_algorithm_lines(scores, frames_of)


PPO_ONE = next(setting for setting, (algo, agents) in learners.SETTINGS.items() if algo == "ppo" and agents == 1)
GOSSIPRL_PPO = f"gossiprl, {PPO_ONE} (learners)"


def same_algorithm_lines(scores: dict[str, np.ndarray], frames: dict[str, int]) -> list[str]:
    """gossiprl's PPO against SB3's at the same frames, both with CleanRL's settings (but for the value
    clip, which SB3 lacks: experiments/baselines.py), by P(X > Y) with its own 95 % interval: whether
    one agent of gossiprl's PPO learns as a well-known implementation's does."""
    if GOSSIPRL_PPO not in scores or "SB3 PPO" not in scores:
        return []
    if frames[GOSSIPRL_PPO] != frames["SB3 PPO"]:
        return [
            f"- SB3 PPO ran {frames['SB3 PPO']:,} frames, gossiprl's PPO {frames[GOSSIPRL_PPO]:,}: not compared.",
            "",
        ]
    estimate = stats.improvement_interval([scores[GOSSIPRL_PPO]], [scores["SB3 PPO"]])
    seeds = f"gossiprl's PPO has {len(scores[GOSSIPRL_PPO])}, SB3 PPO {len(scores['SB3 PPO'])}"
    return [
        f"- The same algorithm in both: P(gossiprl's PPO > SB3 PPO) = {claims.interval_text(estimate)}, IQM "
        f"{claims.interval_text(stats.iqm_interval([scores[GOSSIPRL_PPO]]))} against "
        f"{claims.interval_text(stats.iqm_interval([scores['SB3 PPO']]))} (95 % intervals where the seeds allow "
        f"one, this comparison's own, outside the Bonferroni set above): {reading(estimate, PPO_SUBJECT, seeds)}.",
        "",
    ]


ONE_SUBJECT, PPO_SUBJECT = "gossiprl's one agent", "gossiprl's PPO"


def reading(estimate, subject: str, seeds: str) -> str:
    """What P(``subject`` > a reference) and its interval say; ``seeds`` names each arm's seeds."""
    return {
        "higher": f"{subject} ends higher",
        "lower": f"{subject} ends lower",
        "cannot tell apart": "this data cannot tell them apart, which does not show them equal",
    }.get(claims.judge(estimate), f"too few seeds for an interval ({seeds}; {stats.MIN_RUNS} needed)")


def reference_lines(references: list[str], scores: dict[str, np.ndarray], frames: dict[str, int]) -> list[str]:
    """gossiprl's one agent at SB3's A2C rate (7e-4) against each reference run at the same frames,
    by P(X > Y) and its interval, Bonferroni-corrected over the references compared, as
    experiments/claims.py judges."""
    one = next((s for s in scores if s.startswith(f"gossiprl, {swarm_vs_one.ONE_ATARI} (")), None)
    present = [s for s in references if s in scores]
    if one is None or not present:
        return []
    same = [s for s in present if frames[s] == frames[one]]
    size, compared = improvements([(one, s) for s in same], scores, {one: ONE_SUBJECT})
    findings = [
        f"{s} ran {frames[s]:,} frames, gossiprl's one agent {frames[one]:,}: not compared"
        for s in present
        if s not in same
    ] + compared
    if not same:
        return ["**What the data says.**", ""] + [f"- {f}." for f in findings] + [""]
    return (
        [
            f"**What the data says.** Each row against gossiprl's one agent at the same frames and SB3 A2C's rate "
            f"({one}), by the probability "
            f"of improvement with {claims.size_text(size, len(same))}; whether two intervals of the table overlap "
            "is not read.",
            "",
        ]
        + [f"- {f}." for f in findings]
        + [""]
    )


def table1_section(results: Path, env: str = REAL_ENV) -> list[str]:
    """PALA's Table 1 shape on ``env``: one row per experiments/table1 arm at its frames per agent,
    beside SB3's A2C and PPO at the same frames, the MinAtar paper's figure and the untrained policy.

    A planned cell is read from the study's dir, else from the shared cache, which holds it when
    another study ran the same configuration (the study itself would reuse that run)."""
    out, planned = results / table1.GAMES[env], table1.command_for(env)
    meta = json.loads((out / "study.json").read_text()) if (out / "study.json").exists() else {}
    env, frames, quick = meta.get("env", env), meta.get("frames_per_cell", table1.FRAMES), meta.get("quick", False)
    command = meta.get("command", planned).strip()  # a --quick run's dir holds another env than its game
    cells, settings = planned_cells(table1.STUDY, quick, frames, meta.get("seeds", table1.SEEDS))
    finished = {cell_key(r["setting"], r["seed"]): r for r in todays_rows(out, cells, env)}
    cached = set()
    for c in cells:
        if c.key not in finished:
            row = shared_row(c, results / "_shared", cell_fingerprint(c, env, default_eval_episodes(quick)))
            if row is not None:
                finished[c.key] = row
                cached.add(c.key)
    rows = list(finished.values())
    references = reference_rows(results, env, frames)
    lines = [
        f"## {table1.STUDY.title}" + ("" if out.name == "table1" else f": {env}"),
        "",
        f"**Question.** {table1.STUDY.question[0].upper()}{table1.STUDY.question[1:]}",
        "",
    ]
    if not rows:
        return lines + [
            f"**Not run**: no cell of it in this checkout or its shared cell cache; `{command}` runs it.",
            "",
        ]
    bounds, bounds_said = score_bounds(env)
    elsewhere = studies_that_ran(results, exclude=out.name)
    reused = [r for k, r in finished.items() if k in cached or r.get("fingerprint") in elsewhere]
    by = sorted({study for r in reused for study in elsewhere.get(r.get("fingerprint"), ())})
    by += ["the shared cell cache"] if any(r.get("fingerprint") not in elsewhere for r in reused) else []
    lines += [
        f"**Setup.** `{command}` — {env}, {frames:,} frames for each agent (a ring of 4 trains 4x as many in all); "
        f"{len(rows)} of {len(cells)} cells finished; {len(reused)} of them are runs other studies hold too "
        f"({', '.join(by) or 'none'}: the same configuration and seed, run once, by whichever study came first; "
        f"{len(cached)} read from the shared cell cache, not yet copied into the study's directory). "
        "PALA-A2C is `gossiprl run`'s ring (turn locks, blocking gossip); GALA-A2C is the same ring in async mode "
        "(GALA's gossip buffer: skip an unread slot, mix what is there, unbounded staleness); why: "
        "experiments/table1.py.",
        "",
        "| method | agents | frames per agent | seeds | IQM of each agent's last-100 [95 % bootstrap] |",
        "|---|---|---|---|---|",
    ]
    missing = []
    for setting in settings:
        mine = [c for c in cells if c.setting == setting]
        done = [r for r in rows if r["setting"] == setting]
        gone = [c.seed for c in mine if c.key not in finished]
        if gone:
            missing.append(f"{setting} seed(s) {', '.join(map(str, gone))}")
        lines.append(f"| {setting} | {mine[0].agents} | {frames:,} | {len(done)} | {iqm_text(done, bounds)} |")
    for setting, mine in references:
        lines.append(
            f"| {setting} (experiments/baselines.py) | 1 | {frames:,} | {len(mine)} | {iqm_text(mine, bounds)} |"
        )
    for name, at, low, high in PUBLISHED.get(env, []):
        if at == frames:
            lines.append(
                f"| {name}, published (Young & Tian 2019, read off its curves) | 1 | {at:,} | n/a | "
                f"about {low:g}{f'-{high:g}' if high != low else ''} |"
            )
    untrained = untrained_score(env)
    if untrained:
        lines.append(
            f"| untrained policy | 1 | 0 | {untrained['seeds']} | {untrained['mean']:.2f} (seeds' means "
            f"{untrained['low']:.2f}-{untrained['high']:.2f}) |"
        )
    lines += [
        "",
        "Score: each agent's own mean return over its last 100 training episodes; IQM over every agent of every "
        "seed, whole seeds resampled for the interval (none with fewer than "
        f"{stats.MIN_RUNS} seeds), cut to the score's range, {bounds_said}. The untrained row is the initial "
        "network played as final policies are (experiments/untrained.py). These intervals are each arm's own; "
        "whether two overlap is not a comparison (below, and the swarm_vs_one and learners sections, compare arms by "
        "P(X > Y)). "
        "Rates: gossiprl's A2C rows run at the studies' rate (1.4e-3 on MinAtar, its default when they ran; 7e-4 "
        "elsewhere), SB3's A2C "
        "at 7e-4; the reference section compares SB3's A2C with gossiprl's one agent at 7e-4.",
        "",
    ]
    if any(at == frames for _, at, _, _ in PUBLISHED.get(env, [])):
        lines += [f"**Published.** {MINATAR_PAPER}; its AC(λ) is an online actor-critic, not A2C.", ""]
    lines += table1_comparisons(rows)
    if missing:
        lines += [f"**Missing cells**: {'; '.join(missing)}. They run with `{command}` (finished cells are kept).", ""]
    return lines


def shared_lines(rows: list[dict], settings: list[str], elsewhere: dict[str, set[str]]) -> list[str]:
    """The settings whose every cell is a run other study dirs hold too (``studies_that_ran``): the
    same runs under another name there, so a comparison read in both is one finding, not two."""
    parts = []
    for setting in settings:
        mine = [r.get("fingerprint") for r in rows if r["setting"] == setting]
        if mine and all(fingerprint in elsewhere for fingerprint in mine):
            dirs = sorted(set.intersection(*(elsewhere[fingerprint] for fingerprint in mine)))
            if dirs:
                parts.append(f"{setting} ({', '.join(dirs)})")
    if not parts:
        return []
    return [
        "",
        f"**Shared cells.** Every cell of these settings is a run the named studies hold too: {'; '.join(parts)}. "
        "A comparison between them read here and there is one finding, not two.",
    ]


def studies_that_ran(results: Path, exclude: str) -> dict[str, set[str]]:
    """Each cell fingerprint in a study dir of ``results`` other than ``exclude``: the dirs that hold it."""
    found: dict[str, set[str]] = {}
    for path in sorted(results.glob("*/cells/*.json")):
        folder = path.parent.parent.name
        fingerprint = read_record(path).get("fingerprint")
        if folder != exclude and not folder.startswith("_") and fingerprint is not None:
            found.setdefault(fingerprint, set()).add(folder)
    return found


TABLE1_PAIRS = (
    (table1.PALA, table1.ONE),
    (table1.GALA, table1.ONE),
    (table1.GALA, table1.PALA),
)
"""(X, Y) for P(X > Y) in Table 1's section: each gossiping A2C against one agent, the papers' claim
at equal frames per agent, and GALA's ordering against PALA's (the ordering study's async, unbounded
against its sync: the same cells, read here beside Table 1's other rows, not a second result)."""


def table1_comparisons(rows: list[dict]) -> list[str]:
    """P(X > Y) at equal frames per agent for ``TABLE1_PAIRS`` whose arms both have cells, with
    Bonferroni's intervals over the pairs read together, as experiments/claims.py reads them."""
    scores = {}
    for setting in {s for pair in TABLE1_PAIRS for s in pair}:
        mine = [r["per_agent_last100"] for r in rows if r["setting"] == setting]
        if mine:
            scores[setting] = np.array(mine, dtype=float)
    pairs = [(x, y) for x, y in TABLE1_PAIRS if x in scores and y in scores]
    if not pairs:
        return []
    size, findings = improvements(pairs, scores)
    return [
        "**What the data says.** At equal frames per agent, by the probability of improvement (the chance an "
        f"agent of X ends above one of Y) with {claims.size_text(size, len(pairs))}:",
        "",
        *(f"- {f}." for f in findings),
        "",
    ]


def improvements(
    pairs: list[tuple[str, str]], scores: dict[str, np.ndarray], names: dict[str, str] | None = None
) -> tuple[float, list[str]]:
    """P(X > Y) for each pair, read together: its intervals' size, Bonferroni-corrected over the
    pairs (as experiments/claims.py judges), and for each pair what its interval says. ``names``
    renames an X in the text."""
    size = stats.bonferroni(max(len(pairs), 1))
    findings = []
    for x, y in pairs:
        estimate = stats.improvement_interval([scores[x]], [scores[y]], size=size)
        subject = (names or {}).get(x, x)
        seeds = f"{subject} has {len(scores[x])}, {y} {len(scores[y])}"
        findings.append(f"P({subject} > {y}) = {claims.interval_text(estimate)}: {reading(estimate, subject, seeds)}")
    return size, findings


def reference_rows(results: Path, env: str, frames: int) -> list[tuple[str, list[dict]]]:
    """(setting, its rows) of every experiments/baselines.py run on ``env`` at ``frames`` frames."""
    references = []
    for folder in sorted(results.glob("baselines*")):
        meta = json.loads((folder / "study.json").read_text()) if (folder / "study.json").exists() else {}
        if meta.get("env") == env and meta.get("frames_per_cell") == frames:
            rows = load_rows(folder)
            references += [(s, [r for r in rows if r["setting"] == s]) for s in meta["settings"]]
    return references


def iqm_text(rows: list[dict], bounds: tuple[float, float]) -> str:
    """IQM of every agent's own last-100 score over ``rows`` (one seed each) with its interval, or 'not run'."""
    if not rows:
        return "not run"
    scores = np.array([r["per_agent_last100"] for r in rows], dtype=float)
    return claims.interval_text(stats.iqm_interval([scores]).clipped(bounds))


def and_list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def budget_lines(results: Path) -> list[str]:
    """The budget actually spent, from the shared cells (each real run counted once), and each
    study's budget per cell, read from its study.json."""
    rows = [json.loads(p.read_text()) for p in sorted((results / "_shared").glob("*.json"))]
    if not rows:
        return []
    frames = sum(r["frames"] for r in rows)
    seconds = sum(r["wall_s"] for r in rows)
    budgets: dict[tuple[int, bool], list[str]] = {}
    for folder in STUDIES:
        meta_path = results / folder / "study.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            budgets.setdefault((meta["frames_per_cell"], bool(meta.get("frames_per_agent"))), []).append(folder)
    per_study = "; ".join(
        f"{frames_per_cell:,} {'for each agent' if per_agent else 'for the whole swarm'} in {and_list(folders)}"
        for (frames_per_cell, per_agent), folders in sorted(budgets.items(), key=lambda kv: (not kv[0][1], -kv[0][0]))
    )
    small = [folder for (frames_per_cell, per_agent), folders in budgets.items() if not per_agent for folder in folders]
    caveat = (
        f" The whole-swarm budgets of {and_list(small)} were chosen from a short probe of a 4-agent ring on MinAtar "
        "Breakout so that they fit the two hours the machine was first available; that is far below what MinAtar "
        "agents need to learn well, so their scores are early-training scores."
        if small
        else ""
    )
    return [
        "**Budget.** The studies' distinct runs (a run shared by two studies counted once): "
        f"{len(rows)} runs, {frames / 1e6:.1f} M frames in {seconds / 60:.0f} min of wall-clock, "
        f"{frames / seconds:.0f} frames/s on average including process start-up and evaluation. "
        f"Frames per cell: {per_study}.{caveat} Each study's setup gives its budget and "
        "`experiments/run_all.sh` runs them all.",
        "",
    ]


def _rate(lr: float) -> str:
    """A learning rate as the rest of the text writes it (1.4e-3), not as Python's e-format (1.4e-03)."""
    mantissa, exponent = f"{lr:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def readme_seeds_section(results: Path) -> list[str]:
    path = results / "readme_seeds" / "results.csv"
    cells = sorted((results / "readme_seeds" / "cells").glob("seed*.json"))
    lines = [
        "## The README's default command, seed by seed",
        "",
        "**Question.** Does `gossiprl run --topology ring --seed S` (CartPole-v1, 4 agents, "
        "2M frames for the whole swarm, stop when the pooled last-100 mean reaches 475) solve for every seed, "
        "by every definition?",
        "",
    ]
    if not cells:
        return lines + ["**Not run** in this checkout.", ""]
    lines += [
        "**Setup.** `python -m experiments.readme_seeds --seeds 1,2,3,4,5,6`, run through the CLI as a user "
        "would, on the shared 2-core VM.",
        "",
        "| seed | stopped by | frames (M) | wall-clock (s) | pooled last-100 | each agent's own last-100 | "
        "every agent solved | consensus eval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in cells:
        r = json.loads(p.read_text())
        lines.append(
            f"| {r['seed']} | {r['stopped_by']} | {r['frames'] / 1e6:.2f} | {r['wall_s']:.0f} | "
            f"{r['pooled_last100']:.1f} | {', '.join(f'{v:.0f}' for v in r['per_agent_last100'])} | "
            f"{'yes' if r['solved_every_agent'] else 'no'} | {r['consensus_eval']:.1f} |"
        )
    pooled = [json.loads(p.read_text())["solved_pooled"] for p in cells]
    every = [json.loads(p.read_text())["solved_every_agent"] for p in cells]
    lines += [
        "",
        f"Solved by the launcher's pooled rule: {sum(pooled)} of {len(cells)} seeds; by every agent's own "
        f"last-100 mean: {sum(every)} of {len(cells)}."
        + (" Raw: [results.csv](results/readme_seeds/results.csv)." if path.exists() else ""),
        "",
    ]
    return lines


@click.command()
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=RESULTS, show_default=True)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=RESULTS.parent / "RESULTS.md",
    show_default=True,
)
def main(results, output):
    lines = [
        "# gossiprl experiments: results",
        "",
        "Generated by `python -m experiments.make_results` from the CSV/JSON files under `experiments/results/`; "
        "do not edit by hand.",
        "",
        "**Machine.** A 2-core VM, no GPU "
        f"({platform.machine()}, Python {platform.python_version()}), shared with other jobs while these ran: "
        "every study ran under `nice -n 19` beside other CPU work, so wall-clock and frames/s figures are "
        "noisy and low. Process start-up is not counted in the wall-clock curves or in frames/s (they use each "
        "agent's own training clock); it is in 'wall-clock per cell'.",
        "",
        "**GPU.** Every study here ran on the CPU. A GPU (one H200) was lent once, for 15 minutes: it checked the "
        "CUDA paths ([docs/gpu-h200-2026-11-28.md](../docs/gpu-h200-2026-11-28.md)) and ran no study, so the "
        "Pong/Breakout GPU runs (8-16 agents against A2C and independent agents, at fixed wall-clock) were not done.",
        "",
        f"**Learning rate.** An A2C cell that names no rate runs at {_rate(STUDY_MINATAR_LR)} on MinAtar "
        "(experiments.common.STUDY_MINATAR_LR), MinAtar's default when the studies were planned, so each study "
        f"compares its arms at one rate; `gossiprl run`'s MinAtar default is {_rate(MINATAR_LR)} since lr_confirm "
        "(below) found a ring of 4 ahead of one agent there. The rate studies name theirs.",
        "",
        "**How cells are judged.** Equal frames per cell, for the whole swarm or, where a study says so, for each "
        "agent; equal wall-clock is read "
        "off the curves after T seconds of training, T the shortest of the settings' median training times "
        "(a cell done before T keeps its final score). Two arms' wall-clock is compared only on the seeds whose "
        "cells of both ran in one window of machine load (one call of a study, which runs its arms seed by seed), "
        "each in one session: a resumed cell compares per frame only, and a cell another study ran (the shared "
        "cell cache) keeps the window it ran in. Cells run before windows were recorded (2026-11-28) have their "
        "wall-clock comparisons shown but not read as higher or lower, and decide no claim about time; their "
        "study's note says what is known of their load. Score = each agent's "
        "own mean return over its last 100 training episodes, averaged over agents (never pooled over agents); "
        "'worst agent' is the lowest of them. Each agent's final policy and the consensus policy (the plain "
        "average of all agents' final parameters) are played for fresh episodes (how many: each study's setup) "
        "with sampled actions. "
        "Over seeds, as rliable (Agarwal et al. 2021) reports (experiments/stats.py, checked against rliable 1.2.0 "
        "in tests/unit/experiments/test_stats.py): the interquartile mean (IQM) of every agent's own score, and the "
        "probability of improvement P(X > Y), the chance that an agent of X ends above one of Y (ties 1/2), each "
        "with a 95 % percentile interval of a bootstrap that resamples whole seeds (a seed's agents share its "
        "gossip and are not independent); the figures draw the IQM at every point of the curves with the same "
        "bootstrap's band. Each paper's claim is judged on the axis it is about (experiments/claims.py). A claim "
        "that X does at least as well as Y is judged by P(X > Y): a comparison is higher where its interval lies "
        "above 0.5 and lower where it lies below. A claim that X costs little against Y is about the size of a "
        "difference, which P(X > Y) does not measure: it states a margin m, and why, and is judged by the ratio "
        "IQM(X) / IQM(Y), higher where its interval lies above 1 - m and lower where it lies below. A claim "
        "that a change helps X beyond what it does for a control (the learning-rate rule: the ring against one "
        "agent) is judged by the gain ratio (IQM(X) / IQM(Y)) / (IQM(CX) / IQM(CY)), higher where its interval "
        "lies above 1 and lower where it lies below. A claim "
        "against several arms is **contradicted** if any comparison is lower, **supported** only if every one is "
        "higher, and the data **cannot decide** it otherwise (an interval that holds the line, too few seeds for "
        "an interval, or an arm not run), with the reason. Read together, k comparisons take Bonferroni's "
        "1 - 0.05 / k intervals (98.75 % for four), so that 'contradicts', which any one of them can show, "
        "errs at most 5 % of the time ('supports', which needs all of them, is conservative for it); the "
        "comparisons listed beside a claim, on every axis, and the across-games summary are 95 % intervals each, "
        "uncorrected, and no verdict is read off them. The tables also give the mean ± 95 % Student-t "
        "interval, for reference; no verdict is read off it. Every interval is cut to the ends of the score's range "
        "that the env's rules fix (0 below on MinAtar, whose rewards are never negative); an end they leave open "
        "stays open (each study says which). The untrained policy's score (`python -m experiments.untrained`) "
        "is stated with each study and drawn as a dashed line in its figure.",
        "",
    ]
    lines += budget_lines(results)
    for name in STUDIES:
        lines += study_section(name, results)
    lines += across_games_lines(results)
    for env in table1.GAMES:
        lines += table1_section(results, env)
    lines += baselines_sections(results)
    lines += readme_seeds_section(results)
    output.write_text("\n".join(lines))
    click.echo(f"wrote {output}")


if __name__ == "__main__":
    main()
