"""One figure per study: score vs frames (per agent and for the whole swarm) and vs wall-clock,
the interquartile mean of every agent's score over seeds with a shaded 95 % stratified-bootstrap
band (whole seeds resampled, as the IQMs RESULTS.md states are; cut to the range the score can
take), the untrained policy's score as the floor the curves start from, and (where asked) the
per-iteration time split as stacked bars. Rendered on an Agg canvas (headless)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments import stats
from experiments.common import agent_curves, cell_key, read_curves

GRID_POINTS = 150
BAND = "line: IQM of every agent's last-100 mean over seeds; shaded: its 95 % stratified-bootstrap band"
Y_LABEL = "episode return (IQM of agents' last-100 means)"
VIEWS = {
    "agent": ("frames per agent (M)", "score vs frames per agent"),
    "swarm": ("frames, whole swarm (M)", "score vs frames of the whole swarm"),
    "wall_s": (
        "wall-clock of training on the same 2 cores (s), after start-up",
        "score vs wall-clock (finished seeds hold their last score)",
    ),
}
"""A figure's x-axes: (label, panel title)."""


def seeds_curves(per_seed: list[np.ndarray]) -> np.ndarray:
    """Each seed's (agents, points) curves as one (seeds, agents, points) array, a seed with
    fewer agents padded with nan (a point no agent reached)."""
    members = max(c.shape[0] for c in per_seed)
    padded = [np.vstack([c, np.full((members - c.shape[0], c.shape[1]), np.nan)]) for c in per_seed]
    return np.stack(padded)


def study_figure(
    out: Path,
    rows: list[dict],
    settings: list[str],
    path: Path,
    title: str,
    env_id: str,
    time_split: bool = False,
    threshold: float | None = None,
    frames_per_agent: bool = False,
    bounds: tuple[float, float] = (-np.inf, np.inf),
    untrained: float | None = None,
) -> None:
    """``frames_per_agent``: the first panel counts each agent's frames (studies that give every
    agent the same budget) and a third the whole swarm's; else the one frames panel counts the
    swarm's. ``bounds``: the score's range, which the bands are cut to; ``untrained``: the untrained
    policy's score, drawn as a line (None: not measured)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # a study that gives each agent the same frames is read per agent (the papers' axis, each agent on its
    # own hardware) and shown beside the whole swarm's frames, which is what the 2 shared cores paid for
    views = ("agent", "wall_s", "swarm") if frames_per_agent else ("swarm", "wall_s")
    panels = len(views) + time_split
    fig = Figure(figsize=(6 * panels, 4.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels)
    present = [s for s in settings if any(r["setting"] == s for r in rows)]
    max_wall = max(float(row["wall_s"]) for r in rows for row in read_curves(out, cell_key(r["setting"], r["seed"])))
    grids = {
        "agent": np.linspace(0, max(r["frames"] / r["agents"] for r in rows), GRID_POINTS),
        "swarm": np.linspace(0, max(r["frames"] for r in rows), GRID_POINTS),
        "wall_s": np.linspace(0, max_wall, GRID_POINTS),
    }
    for k, setting in enumerate(present):
        mine = [r for r in rows if r["setting"] == setting]
        color = f"C{k % 10}"
        for ax, view in zip(axes, views):
            grid = grids[view]
            # vs wall-clock a seed that has spent its frames keeps its final score, so the mean does not
            # jump when the fastest seed stops (and it matches the table's equal-wall-clock score)
            curves = seeds_curves(
                [
                    agent_curves(
                        read_curves(out, cell_key(r["setting"], r["seed"])),
                        "wall_s" if view == "wall_s" else "frames",
                        grid,
                        1 if view == "agent" else r["agents"],
                        hold_last=view == "wall_s",
                    )
                    for r in mine
                ]
            )
            xs = grid if view == "wall_s" else grid / 1e6
            _draw_band(ax, xs, curves, bounds, color, f"{setting} (n={len(mine)} seeds)")
    for ax, view in zip(axes, views):
        ax.set_xlabel(VIEWS[view][0])
        ax.set_ylabel(Y_LABEL)
        ax.set_title(VIEWS[view][1] + (wall_clock_caveat(rows) if view == "wall_s" else ""), fontsize=10)
        ax.ticklabel_format(axis="x", style="plain", useOffset=False)
        if threshold is not None:
            ax.axhline(threshold, color="gray", linestyle=":", linewidth=1, label=f"threshold {threshold:g}")
        _draw_untrained(ax, untrained)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    if time_split:
        _time_split_bars(axes[-1], rows, present)
    fig.suptitle(f"{title} — {env_id}\n{BAND} (whole seeds resampled), cut to the score's range", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_windows(rows: list[dict]) -> str:
    """Under what machine load the cells ran: "unrecorded" (no cell records its window), "several"
    (another call of a study, another study's cached cell or a resumed cell among them) or "one"."""
    if all(r.get("window") is None for r in rows):
        return "unrecorded"
    resumed = any((r.get("sessions") or 1) > 1 for r in rows)
    return "several" if resumed or len({r.get("window") for r in rows}) > 1 else "one"


def wall_clock_caveat(rows: list[dict]) -> str:
    """What the wall-clock panel cannot show: arms whose cells ran under different machine loads are
    drawn on one time axis, but their time compares only where RESULTS.md says
    (claims.Arms.same_window_seeds)."""
    return {
        "unrecorded": "\nload windows not recorded; RESULTS.md says what compares",
        "several": "\ncells ran under different loads; RESULTS.md says what compares",
        "one": "",
    }[load_windows(rows)]


def _draw_band(ax, xs: np.ndarray, curves: np.ndarray, bounds: tuple[float, float], color: str, label: str) -> None:
    """The IQM of ``curves`` (seeds, agents, points) and its bootstrap band, cut to ``bounds``; no
    band where fewer than stats.MIN_RUNS seeds reached the point."""
    iqm, low, high = stats.iqm_curve_interval(curves)
    ax.plot(xs, iqm, color=color, label=label)
    ax.fill_between(xs, np.clip(low, *bounds), np.clip(high, *bounds), color=color, alpha=0.2, linewidth=0)


def _draw_untrained(ax, untrained: float | None) -> None:
    if untrained is not None:
        ax.axhline(untrained, color="black", linestyle="--", linewidth=1, label=f"untrained policy {untrained:.2f}")


def _time_split_bars(ax, rows: list[dict], settings: list[str]) -> None:
    """Seconds per update of one agent, mean over seeds, split into the loop's phases."""
    parts = [
        ("rollout_s", "rollout"),
        ("learn_s", "learn"),
        ("gossip_wait_s", "gossip wait + transfer"),
        ("mix_s", "mix"),
    ]
    bottom = np.zeros(len(settings))
    for k, (key, label) in enumerate(parts):
        values = []
        for setting in settings:
            mine = [r for r in rows if r["setting"] == setting]
            values.append(np.mean([1e3 * r[key] / updates_per_agent(r) for r in mine]))
        ax.bar(range(len(settings)), values, bottom=bottom, label=label, color=f"C{k}")
        bottom += np.array(values)
    ax.set_xticks(range(len(settings)), settings, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("ms per update of one agent")
    ax.set_title("per-iteration time split (mean over seeds)")
    ax.legend(fontsize=7)


def updates_per_agent(row: dict) -> float:
    """The updates an agent's timers (``rollout_s`` ...) cover: those of the frames its last session
    trained (``timed_frames``, all of them but in a resumed cell), each of the learner's own size
    (rows from before either was recorded: A2C's, n_steps x num_envs, over all the frames)."""
    timed = row.get("timed_frames", row["frames"] / row["agents"])
    return max(1.0, timed / row.get("steps_per_update", row["n_steps"] * row["num_envs"]))


def reference_figure(
    curves: dict[str, list[list[dict]]],
    published: list[tuple[str, int, float, float]],
    path: Path,
    env_id: str,
    bounds: tuple[float, float] = (-np.inf, np.inf),
    untrained: float | None = None,
) -> None:
    """Score vs frames per agent beside a library's runs: per setting the IQM over seeds of its
    agents' last-100 curves (each seed's curve rows as ``agent_curves`` reads them) with its
    bootstrap band cut to ``bounds``, the published figures (name, frames, low, high) as bars where they were
    read off, and the untrained policy's score as a line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    max_frames = max((r["frames"] for runs in curves.values() for run in runs for r in run), default=1)
    grid = np.linspace(0, max_frames, GRID_POINTS)
    for k, (setting, runs) in enumerate(curves.items()):
        band = seeds_curves([agent_curves(run, "frames", grid, 1) for run in runs])
        _draw_band(ax, grid / 1e6, band, bounds, f"C{k % 10}", f"{setting} (n={len(runs)} seeds)")
    _draw_untrained(ax, untrained)
    names = list(dict.fromkeys(name for name, *_ in published))
    labelled = set()
    for name, frames, low, high in published:
        if frames <= 1.05 * max_frames:
            ax.errorbar(
                [frames / 1e6],
                [(low + high) / 2],
                yerr=[(high - low) / 2],
                fmt="^sDv"[names.index(name) % 4],
                color="black",
                capsize=4,
                label=None if name in labelled else f"MinAtar paper, {name} (read off its curves, approx.)",
            )
            labelled.add(name)
    ax.set_xlabel("frames per agent (M)")
    ax.set_ylabel(Y_LABEL)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"Library reference — {env_id}\n{BAND}, cut to the score's range", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
