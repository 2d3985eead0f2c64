"""Write experiments/RESULTS.md from the studies' cells: every number in it comes from a CSV/JSON
under experiments/results/, so it is regenerated, never edited by hand.

For each study it rebuilds results.csv, summary.csv and figure.png from whatever cells exist
(a study cut short is reported with the cells it is missing), then writes the question, the
setup, the untrained policy's score, the table, the figure and what the data says, judged by
whether 95 % intervals overlap, with the IQM and probability of improvement of experiments/stats.py.

    python -m experiments.make_results [--results experiments/results] [--output experiments/RESULTS.md]
"""

from __future__ import annotations

import csv
import importlib
import json
import math
import platform
from pathlib import Path

import click
import numpy as np

from experiments import stats, swarm_learning, swarm_vs_one
from experiments.common import aggregate, cell_key, ci95, load_rows, read_curves, score_bounds
from experiments.figures import reference_figure
from experiments.study import METRICS, RESULTS, finish, planned_cells
from experiments.untrained import untrained_score, untrained_text

STUDIES = [
    "swarm_learning",
    "swarm_vs_one",
    "ordering_ablation",
    "topology_ablation",
    "scaling",
    "batch_period",
    "layout",
]

NOTES = {
    "scaling": "**Per-second comparisons here are void.** These cells ran when every agent got cores // agents "
    "torch threads, so the single A2C agent ran 2 intra-op threads on cores other jobs also loaded, and "
    "such an agent collapses (`gossiprl bench train`'s row 'one agent, one core busy, old threads': 0.28x "
    "the minimal loop under the same load, against 1.15x with one thread): its 556 frames/s, and every "
    "'swarm beats one agent per second' reading, come from that. Agents now take one torch thread; the "
    "per-frame columns stand.",
    "swarm_learning": "The cells of each setting ran one seed after another, all settings per seed, on the "
    "shared 2-core VM; wall-clock figures are confounded by that and are not the point of this study. "
    "Every cell here ran under loop version 3, when agent r of seed s drew from seed s + r (so seeds shared "
    "agents' episode streams); the study's next run re-runs them under today's (seed, rank) streams. In the "
    "lr-rule cell of seed 3 the background jobs were starved for a few seconds by a "
    "benchmark, and each agent skipped 5-9 of its 3,125 gossip rounds (`gossip/skipped` in their metrics).",
    "layout": "The spread layout runs the agents as `gossiprl agent` commands in network namespaces (as "
    "tests/integration/test_netns.py does): a broker host and two agent hosts with 2 agents each, every link "
    "shaped with tc to 1 Gbit/s; the same two cores serve all of them.",
    "topology_ablation": "The ring and independent 4-agent cells are the ordering study's runs, reused (same "
    "configuration and seeds); they ran earlier in the session, when other jobs loaded the "
    "cores more, so their wall-clock and frames/s are not comparable with the other "
    "topologies' — compare those settings per frame.",
    "swarm_vs_one": "Cells ran under loop version 4: agent r of seed s draws from (seed, rank), so seeds share "
    "no agent's episodes (the first run, with seed + rank streams, is in docs/swarm-learning.md). In the "
    "ring's seed 1 each agent skipped 3-11 of its 12,500 gossip rounds while a benchmark starved the job for "
    "a few seconds (`gossip/skipped` in its metrics). They ran before robust mixing capped the cumulative "
    "drift of what mixing does to an agent; the cap changes a mix only when it cuts (`gossip/clipped`), which "
    "no honest run measured so far has done.",
    "ordering_ablation": "Async agents gossip without turn locks; max-staleness k makes an agent wait once it "
    "has gone k rounds without a letter from an in-peer.",
}

PAPER = {
    "swarm_learning": (
        "GALA and PALA: gossiping A2C agents learn at least as much per agent step as one A2C agent "
        "(PALA Fig. 6, Table 1).",
        "ring of 4, entropy 0.01, shared init, blocking",
        [
            "1 agent, entropy 0.01",
            "ring of 4, old defaults (entropy 0, own inits, blocking)",
            "ring of 4, entropy 0.01, shared init, overlapped",
        ],
    ),
    "swarm_vs_one": (
        "GALA and PALA: gossiping A2C agents learn at least as much per agent step as one A2C agent.",
        "ring of 4",
        ["1 agent"],
    ),
    "ordering_ablation": (
        "PALA's claim: ordered (sync, turn-locked) gossip learns better than unordered async gossip "
        "and than independent agents at equal time.",
        "sync (turn locks)",
        ["async, max-staleness 1", "async, max-staleness 4", "async, unbounded", "none (independent)"],
    ),
    "topology_ablation": (
        "The papers' claim: gossiping agents learn better than independent ones, and the topology "
        "(spectral gap) sets how fast they agree.",
        "ring, 4 agents",
        ["none (independent), 4 agents"],
    ),
    "scaling": (
        "PALA Figs. 6-8: more agents reach a score sooner in wall-clock time (each agent on its own cores/GPU).",
        "4 agents, ring",
        ["1 agent (plain A2C)"],
    ),
    "batch_period": (
        "PALA Fig. 12: gossiping less often saves communication time at little cost in learning.",
        "5 steps x 16 envs, gossip every update",
        ["5 steps x 16 envs, gossip every 16"],
    ),
    "layout": (
        "PALA Fig. 5: spreading agents over hosts costs little, because parameter transfer is a small "
        "share of an iteration.",
        "one host (tcp loopback)",
        ["2 netns hosts, 1 Gbit/s links (tcp + CURVE)"],
    ),
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


def compare(table: dict[str, dict], a: str, b: str, metric: str) -> str:
    """'higher' / 'lower' when the 95 % intervals do not overlap, else 'indistinguishable'."""
    if a not in table or b not in table:
        return "not measured"
    ma, ha, mb, hb = table[a][metric], table[a][f"{metric}_ci"], table[b][metric], table[b][f"{metric}_ci"]
    if any(v is None or math.isnan(v) for v in (ma, mb)):
        return "not measured"
    if math.isnan(ha) or math.isnan(hb):
        return "untestable (one seed, no interval)"
    if ma - ha > mb + hb:
        return "higher"
    if ma + ha < mb - hb:
        return "lower"
    return "indistinguishable (95 % intervals overlap)"


def study_section(name: str, results: Path) -> list[str]:
    out = results / name
    if not (out / "study.json").exists():
        return [f"## {name}", "", "**Not run**: no results in this checkout.", ""]
    meta = json.loads((out / "study.json").read_text())
    module = importlib.import_module(f"experiments.{name}")
    cells, settings = planned_cells(module.STUDY, meta["quick"], meta["frames_per_cell"], meta["seeds"])
    rows = load_rows(out, cells)
    missing = [
        f"{c.setting} seed {c.seed}"
        for c in cells
        if not (out / "cells" / f"{cell_key(c.setting, c.seed)}.json").exists()
    ]
    lines = [f"## {meta['title']}", "", f"**Question.** {meta['question'][0].upper()}{meta['question'][1:]}", ""]
    budget = (
        "frames for each agent (a ring of 4 trains 4x as many in all)"
        if meta.get("frames_per_agent")
        else "frames per cell for the whole swarm (split evenly over its agents)"
    )
    lines += [
        f"**Setup.** `{meta['command'].strip()}` — {meta['env']}, {meta['frames_per_cell']:,} {budget}, "
        f"seeds {', '.join(map(str, meta['seeds']))}; {len(rows)} of {len(cells)} cells finished."
    ]
    if missing:
        lines += ["", f"**Missing cells** (not finished before the deadline): {', '.join(missing)}."]
    if not rows:
        return lines + [""]
    lines[-1 - bool(missing) * 2] += f" Final policies evaluated over {rows[0]['eval_episodes']} episodes each."
    finish(module.STUDY, out, rows, settings, meta["env"], meta["threshold"])
    table = {e["setting"]: e for e in aggregate(rows, settings, METRICS)}
    t_equal = rows[0]["equal_wall_s"]
    bounds, bounds_said = score_bounds(meta["env"], rows)
    lines += [
        "",
        f"**Untrained policy** on {meta['env']}: {untrained_text(meta['env'])}; the dashed line in the figure.",
        "",
        "| setting | seeds | agents' own last-100 mean | worst agent | agents' final policies (eval) | "
        f"consensus policy (eval) | score at {t_equal:.0f} s of training | wall-clock per cell (s) | "
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
        f"Mean ± 95 % t-interval over seeds; an interval that would leave the score's range, {bounds_said}, is "
        "cut to it and shown as [low, high]. Raw per-seed rows: "
        f"[results/{name}/results.csv](results/{name}/results.csv); per setting: "
        f"[summary.csv](results/{name}/summary.csv).",
        "",
        f"![{meta['title']}](results/{name}/figure.png)",
        "",
    ]
    if name in NOTES:
        lines += [f"**Note.** {NOTES[name]}", ""]
    lines += ["**What the data says.**", ""] + findings(name, table, t_equal) + time_split_lines(rows, settings)
    lines += iqm_lines(rows, settings, bounds) + improvement_lines(name, rows, settings)
    return lines + [""]


def by_seed(rows: list[dict], setting: str) -> np.ndarray:
    """A setting's scores as one task for experiments.stats: (seeds, agents), each agent's own last-100."""
    return np.array([r["per_agent_last100"] for r in rows if r["setting"] == setting], dtype=float)


def interval_text(estimate: stats.Estimate) -> str:
    return f"{estimate.point:.2f}" + ("" if estimate.low is None else f" [{estimate.low:.2f}, {estimate.high:.2f}]")


def iqm_lines(rows: list[dict], settings: list[str], bounds: tuple[float, float]) -> list[str]:
    """IQM of every agent's own last-100 score per setting, with its stratified-bootstrap interval
    (whole seeds resampled, so the agents of one swarm, which are not independent, stay together)."""
    parts = []
    for setting in settings:
        scores = by_seed(rows, setting)
        if not len(scores):
            continue
        n = f"{len(scores)} seed(s), {scores.size} agents"
        estimate = stats.iqm_interval([scores]).clipped(bounds)
        if estimate.low is None:
            parts.append(f"{setting} {estimate.point:.2f} ({n}; too few seeds for an interval)")
            continue
        parts.append(f"{setting} {interval_text(estimate)} ({n})")
    return [
        f"- IQM of every agent's own last-100 score, 95 % stratified-bootstrap interval over seeds: {'; '.join(parts)}."
    ]


def comparisons(name: str, settings: list[str]) -> list[tuple[str, str]]:
    """(X, Y) pairs a study asks P(X > Y) of: the paper's reference arm against each other arm
    (and the equal-total-frames arm), and in swarm_learning every ring against its one-agent control."""
    claim, reference, others = PAPER[name]
    pairs = [(reference, other) for other in [*others, EQUAL_TOTAL.get(name)] if other]
    if name == "swarm_learning":
        pairs += list(swarm_learning.CONTROL.items())
    return [p for p in dict.fromkeys(pairs) if p[0] in settings and p[1] in settings]


def improvement_lines(name: str, rows: list[dict], settings: list[str]) -> list[str]:
    """Probability of improvement of each comparison: the chance that an agent of X, drawn at random,
    ends with a higher last-100 score than one of Y (1/2 for a tie), with its bootstrap interval."""
    parts = []
    for x, y in comparisons(name, settings):
        xs, ys = by_seed(rows, x), by_seed(rows, y)
        if len(xs) and len(ys):
            estimate = stats.improvement_interval([xs], [ys])
            few = "" if estimate.low is not None else " (too few seeds for an interval)"
            parts.append(f"P({x} > {y}) = {interval_text(estimate)}{few}")
    if not parts:
        return []
    return [
        "- Probability of improvement (an agent of the first arm beats one of the second; 0.5: neither), "
        f"95 % stratified-bootstrap interval over seeds: {'; '.join(parts)}."
    ]


def across_games_lines(results: Path) -> list[str]:
    """P(ring of 4 > each other arm) over every game the swarm_vs_one study ran on (a dir per game),
    averaged over games with each game's seeds resampled on their own: the scale-free summary of
    the study across games (an IQM across games would need their scores normalised first)."""
    games = {}
    for out in sorted(results.glob("swarm_vs_one*")):
        if (out / "study.json").exists():
            games[json.loads((out / "study.json").read_text())["env"]] = load_rows(out)
    reference, others = PAPER["swarm_vs_one"][1], [*PAPER["swarm_vs_one"][2], swarm_vs_one.EQUAL_TOTAL]
    parts = []
    for other in others:
        played = {
            env: rows for env, rows in games.items() if len(by_seed(rows, reference)) and len(by_seed(rows, other))
        }
        if len(played) < 2:
            continue
        estimate = stats.improvement_interval(
            [by_seed(rows, reference) for rows in played.values()], [by_seed(rows, other) for rows in played.values()]
        )
        parts.append(f"P({reference} > {other}) over {', '.join(played)} = {interval_text(estimate)}")
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


EQUAL_TOTAL = {"swarm_vs_one": swarm_vs_one.EQUAL_TOTAL}
"""A study's arm trained as many frames as the whole swarm (not as each agent): it is compared with
the swarm at equal total frames, never counted among the equal-frames-per-agent settings."""


PER_AGENT_STEP = {"swarm_learning", "swarm_vs_one"}
"""Studies whose paper claim is per agent step (equal frames per agent): only that axis decides the
verdict there. The others' claims are about time (PALA's time efficiency, ordering at equal time),
so both axes count."""


def findings(name: str, table: dict[str, dict], t_equal: float) -> list[str]:
    claim, reference, others = PAPER[name]
    lines = []
    total_arm = table.get(EQUAL_TOTAL.get(name))
    if total_arm is not None:
        lines.append(
            f"- {reference} vs {total_arm['setting']}, at equal total frames: "
            f"{compare(table, reference, total_arm['setting'], 'agents_mean')}."
        )
        table = {k: v for k, v in table.items() if v is not total_arm}
    best_frames = max(table.values(), key=lambda e: e["agents_mean"])
    best_time = max(
        (
            e
            for e in table.values()
            if e["score_at_equal_wall"] is not None and not math.isnan(e["score_at_equal_wall"])
        ),
        key=lambda e: e["score_at_equal_wall"],
        default=None,
    )
    lines.append(
        f"- Highest final score at equal frames: **{best_frames['setting']}** "
        f"({fmt(best_frames['agents_mean'], best_frames['agents_mean_ci'])})."
    )
    if best_time:
        lines.append(
            f"- Highest score at equal wall-clock ({t_equal:.0f} s of training): **{best_time['setting']}** "
            f"({fmt(best_time['score_at_equal_wall'], best_time['score_at_equal_wall_ci'])})."
        )
    fastest = max(table.values(), key=lambda e: e["fps"])
    lines.append(f"- Fastest in frames/s: **{fastest['setting']}** ({fastest['fps']:.0f} frames/s).")
    verdicts = []
    for other in others:
        per_frames = compare(table, reference, other, "agents_mean")
        per_time = compare(table, reference, other, "score_at_equal_wall")
        consensus = compare(table, reference, other, "consensus_eval")
        lines.append(
            f"- {reference} vs {other}: at equal frames {per_frames}; at equal wall-clock {per_time}; "
            f"consensus policy {consensus}."
        )
        verdicts += [per_frames] if name in PER_AGENT_STEP else [per_frames, per_time]
    measured = [v for v in verdicts if v in ("higher", "lower") or v.startswith("indistinguishable")]
    if not measured:
        verdict = "not tested here (cells missing)"
    elif all(v == "higher" for v in measured):
        verdict = "**agrees** with it"
    elif any(v == "lower" for v in measured):
        verdict = "**contradicts** it in at least one comparison"
    else:
        verdict = "**neither confirms nor refutes** it: with 3 seeds and this budget the intervals overlap"
    lines.append(f"- Paper: {claim} This data {verdict}.")
    return lines


MINATAR_PAPER = (
    "Young & Tian 2019, *MinAtar: An Atari-inspired testbed for thorough and reproducible reinforcement "
    "learning experiments*, arXiv:1903.03176"
)
PUBLISHED = {
    "MinAtar/Breakout-v1": [("AC(λ)", 1_000_000, 9, 10), ("AC(λ)", 5_000_000, 17, 18), ("DQN", 1_000_000, 10, 10)],
}
"""The MinAtar paper's scores per env as (agent, frames, low, high), read off its learning curves
(approximate); its AC(λ) is an online actor-critic with eligibility traces, not A2C."""


def published_text(env: str) -> str:
    return "; ".join(
        f"{name} about {low:g}{f'-{high:g}' if high != low else ''} at {frames / 1e6:g}M frames"
        for name, frames, low, high in PUBLISHED[env]
    )


def episode_curve(out: Path, key: str) -> list[dict]:
    """A baselines run's episodes (experiments/baselines.py's curve CSV) as the last-100 mean
    after each one, in the rows ``swarm_curve`` reads (as ``read_curves`` gives a study's)."""
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
            for setting in ("1 agent", "ring of 4"):
                mine = [r for r in swarm_rows if r["setting"] == setting]
                entries.append(
                    (f"gossiprl, {setting} ({swarm.name})", mine, swarm_meta["frames_per_cell"], swarm, read_curves)
                )
            break
    lines += [
        "| setting | frames per agent | seeds | IQM of last-100 [95 % bootstrap] | mean ± 95 % t | frames/s |",
        "|---|---|---|---|---|---|",
    ]
    bounds, bounds_said = score_bounds(env, [r for entry in entries for r in entry[1]])
    iqms, curves, scores = {}, {}, {}
    for setting, mine, per_agent, folder, reader in entries:
        if not mine:
            continue
        curves[setting] = [reader(folder, cell_key(r["setting"], r["seed"])) for r in mine]
        scores[setting] = np.array([r["per_agent_last100"] for r in mine], dtype=float)
        estimate = stats.iqm_interval([scores[setting]]).clipped(bounds)
        iqms[setting] = (estimate.point, estimate.low, estimate.high, per_agent)
        mean, half = ci95([float(np.mean(r["per_agent_last100"])) for r in mine])
        fps = np.mean([r["fps"] for r in mine])
        lines.append(
            f"| {setting} | {per_agent:,} | {len(mine)} | {interval_text(estimate)} | {fmt(mean, half, bounds)} | "
            f"{fps:.0f} |"
        )
    lines += [
        "",
        "Score: each agent's own mean return over its last 100 training episodes; IQM over all agents of all "
        "seeds, whole seeds resampled for the interval; intervals cut to the score's range, "
        f"{bounds_said}. Untrained policy: {untrained_text(env)}. frames/s: SB3's from its training clock alone (one "
        "process, one torch thread); gossiprl's are all agents' frames over the cell's wall-clock, start-up "
        "included, measured in another window of machine load, so compare them loosely. Raw rows: "
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
    one_name = next((k for k in iqms if k.startswith("gossiprl, 1 agent")), None)
    one = iqms.get(one_name)
    findings = []
    for setting in meta["settings"]:
        if setting not in iqms or one is None:
            continue
        point, low, high, per_agent = iqms[setting]
        if per_agent != one[3]:
            findings.append(f"{setting} ran {per_agent:,} frames, gossiprl's one agent {one[3]:,}: not compared")
        elif low is None or one[1] is None:
            findings.append(f"{setting} against gossiprl's one agent: too few seeds for an interval")
        elif high < one[1] or low > one[2]:
            side = "below" if low > one[2] else "above"  # where gossiprl's one agent stands
            findings.append(f"gossiprl's one agent is {side} {setting} (the 95 % intervals do not overlap)")
        else:
            findings.append(f"gossiprl's one agent and {setting} are indistinguishable (the 95 % intervals overlap)")
        if per_agent == one[3]:
            estimate = stats.improvement_interval([scores[one_name]], [scores[setting]])
            findings.append(f"P(gossiprl's one agent > {setting}) = {interval_text(estimate)}")
    if findings:
        lines += ["**What the data says.**", ""] + [f"- {f}." for f in findings] + [""]
    return lines


def budget_lines(results: Path) -> list[str]:
    """The budget actually spent, from the shared cells (each real run counted once)."""
    rows = [json.loads(p.read_text()) for p in sorted((results / "_shared").glob("*.json"))]
    if not rows:
        return []
    frames = sum(r["frames"] for r in rows)
    seconds = sum(r["wall_s"] for r in rows)
    return [
        "**Budget.** The studies' distinct runs (a run shared by two studies counted once): "
        f"{len(rows)} runs, {frames / 1e6:.1f} M frames in {seconds / 60:.0f} min of wall-clock, "
        f"{frames / seconds:.0f} frames/s on average including process start-up and evaluation. The frames "
        "per cell were chosen from a short probe of a 4-agent ring on MinAtar Breakout so that the "
        "studies fit the two hours the machine was available, most important cells first "
        "(`experiments/run_all.sh`); that budget is far below what MinAtar agents need to learn well, so "
        "the scores are early-training scores.",
        "",
    ]


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
        "noisy and low. Process start-up is not counted in the wall-clock curves (they use each agent's own "
        "training clock); it is in 'wall-clock per cell'.",
        "",
        "**GPU.** No GPU machine was at hand in this session: the Pong/Breakout GPU runs of the issue "
        "(8-16 agents vs A2C vs independent, fixed wall-clock) were not done.",
        "",
        "**How cells are judged.** Equal total frames per cell for the whole swarm; equal wall-clock is read "
        "off the curves after T seconds of training, T the shortest of the settings' median training times "
        "(a cell done before T keeps its final score). Score = each agent's "
        "own mean return over its last 100 training episodes, averaged over agents (never pooled over agents); "
        "'worst agent' is the lowest of them. Each agent's final policy and the consensus policy (the plain "
        "average of all agents' final parameters) are played for fresh episodes (how many: each study's setup) "
        "with sampled actions. "
        "Over seeds: mean ± 95 % Student-t interval; two settings are called different only where the "
        "intervals do not overlap. Beside it, as rliable (Agarwal et al. 2021) reports (experiments/stats.py, "
        "checked against rliable 1.2.0 in tests/unit/experiments/test_stats.py): the interquartile mean (IQM) of every "
        "agent's own score, and the probability of improvement P(X > Y), the chance that an agent of X ends "
        "above one of Y (ties 1/2), each with a 95 % percentile interval of a bootstrap that resamples whole "
        "seeds (a seed's agents share its gossip and are not independent). Every interval is cut to the range "
        "the score can take: the env's where its rules fix it, else the scores the study's runs reached (each "
        "study says which). The untrained policy's score (`python -m experiments.untrained`) is stated with "
        "each study and drawn as a dashed line in its figure.",
        "",
    ]
    lines += budget_lines(results)
    for name in STUDIES:
        lines += study_section(name, results)
    lines += across_games_lines(results)
    lines += baselines_sections(results)
    lines += readme_seeds_section(results)
    output.write_text("\n".join(lines))
    click.echo(f"wrote {output}")


if __name__ == "__main__":
    main()
