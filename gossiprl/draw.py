"""Pictures: gossip topologies (who hears from whom, before a run) and learning curves (after)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np


def draw_topology(topology, path: str | os.PathLike) -> None:
    """Save a PNG of ``topology``: agents on a circle, an arrow j -> i wherever i mixes in j.

    A time-varying topology is drawn as the union of one period, edges coloured by the round
    that uses them, because that union is what must be strongly connected for consensus.
    Edge labels (the weight p_ij agent i gives to j) are only legible up to 8 agents.
    matplotlib is imported here, not at module level, so the comms runtime never needs it;
    the figure is rendered on an explicit Agg canvas, which works headless and leaves the
    caller's pyplot backend and open figures alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    n, period = topology.n, topology.period
    rounds = [topology.at(t).matrix for t in range(period)]
    pos = [(math.sin(2 * math.pi * k / n), math.cos(2 * math.pi * k / n)) for k in range(n)]  # clockwise from top

    edges: dict[tuple[int, int], list[tuple[int, float]]] = {}  # (j, i) -> [(round, p_ij)]
    for t, p in enumerate(rounds):
        for i in range(n):
            for j in range(n):
                if i != j and p[i, j] > 0:
                    edges.setdefault((j, i), []).append((t, float(p[i, j])))

    fig = Figure(figsize=(6.5, 6.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)

    node_size = max(40.0, 700.0 * min(1.0, 16.0 / n))
    colors = [f"C{t % 10}" for t in range(period)]
    _draw_edges(ax, edges, pos, n, period, colors, node_size)
    _draw_agents(ax, pos, rounds, node_size)

    title = f"{topology.name}: n={n}, spectral gap {topology.spectral_gap:.3f}"
    if topology.time_varying:
        title += f"\nunion of one period ({period} rounds; colour = round)"
        ax.legend(
            handles=[Line2D([], [], color=c, label=f"round t % {period} == {t}") for t, c in enumerate(colors)],
            loc="lower right",
            fontsize=7,
            frameon=False,
        )
    ax.set_title(title, fontsize=11)
    fig.text(
        0.5, 0.02, "arrow j \u2192 i: agent i mixes in agent j's parameters", ha="center", fontsize=8, color="dimgray"
    )
    fig.savefig(path, format="png", dpi=120)


def _draw_edges(ax, edges: dict, pos: list, n: int, period: int, colors: list[str], node_size: float) -> None:
    """An arrow j -> i per edge, coloured by the first round that uses it; up to 8 agents, its weights."""
    gap = math.sqrt(node_size) / 2 + 2  # points between node centre and arrow tip
    rad = 0.12  # curve j->i and i->j to opposite sides
    for (j, i), uses in edges.items():
        (x1, y1), (x2, y2) = pos[j], pos[i]
        ax.annotate(
            "",
            xy=(x2, y2),
            xytext=(x1, y1),
            zorder=1,
            arrowprops=dict(
                arrowstyle="-|>",
                color=colors[uses[0][0]],
                lw=1.0 if n <= 16 else 0.5,
                shrinkA=gap,
                shrinkB=gap,
                mutation_scale=12 if n <= 16 else 6,
                connectionstyle=f"arc3,rad={rad}",
            ),
        )
        if n <= 8:
            # a point of matplotlib's arc3 quadratic Bezier, past the middle towards the receiver
            # (whose weight it is), so labels of crossing and opposite arrows do not pile up
            cx, cy = (x1 + x2) / 2 + rad * (y2 - y1), (y1 + y2) / 2 - rad * (x2 - x1)
            s = 0.65
            lx = (1 - s) ** 2 * x1 + 2 * s * (1 - s) * cx + s**2 * x2
            ly = (1 - s) ** 2 * y1 + 2 * s * (1 - s) * cy + s**2 * y2
            text = ", ".join(f"t{t}: {w:.2f}" if period > 1 else f"{w:.2f}" for t, w in uses)
            ax.text(
                lx,
                ly,
                text,
                fontsize=7,
                ha="center",
                va="center",
                zorder=3,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85),
            )


def _draw_agents(ax, pos: list, rounds: list, node_size: float) -> None:
    """The agents as circles, numbered up to 64 of them; up to 8, each one's own weight beside it."""
    n = len(pos)
    ax.scatter([x for x, _ in pos], [y for _, y in pos], s=node_size, c="white", edgecolors="black", zorder=2)
    if n <= 64:
        for k, (x, y) in enumerate(pos):
            ax.text(x, y, str(k), fontsize=10 if n <= 16 else 6, ha="center", va="center", zorder=4)
            self_weights = {float(p[k, k]) for p in rounds}
            if n <= 8 and len(self_weights) == 1:
                side = "left" if x > 0.3 else "right" if x < -0.3 else "center"
                ax.text(
                    1.17 * x,
                    1.17 * y,
                    f"self {self_weights.pop():.2f}",
                    fontsize=7,
                    ha=side,
                    va="center",
                    color="dimgray",
                )


def plot_runs(run_dirs, path: str | os.PathLike, smooth: int = 1) -> None:
    """Save a PNG comparing runs: return vs total frames (left) and vs wall-clock seconds (right).

    The two panels answer the two questions of the papers: is gossip as sample-efficient as
    one big learner (frames summed over all agents, so an n-agent run is charged for all n),
    and is it faster in time. A run's curve is the mean over its agents, each agent's curve
    interpolated onto a common grid, because agents need not log at the same frames (async
    gossip, a resume); the grid spans only the range every agent reached, so the mean never
    silently becomes a mean over fewer agents near the end. ``smooth`` > 1 is a trailing
    moving average over that many grid points. Like ``draw_topology``, it renders on its own
    Agg canvas and leaves pyplot alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if smooth < 1:
        raise ValueError(f"smooth must be at least 1, got {smooth}")
    fig = Figure(figsize=(12, 4.5))
    FigureCanvasAgg(fig)
    by_frames, by_time = fig.subplots(1, 2, sharey=True)
    y_columns = set()
    for run_dir in map(Path, run_dirs):
        agents = [_read_metrics(csv_path) for csv_path in sorted(run_dir.glob("agent-*/metrics.csv"))]
        if not agents:
            raise FileNotFoundError(f"no agent-<rank>/metrics.csv under {run_dir}: nothing to plot for that run")
        y_columns.update(column for column, _ in agents)
        curves = [points for _, points in agents if len(points)]
        label = _run_label(run_dir, len(agents))
        if not curves:
            label += " (no finished episodes yet)"
        x, y = _mean_curve(curves, 0, smooth, scale=len(agents))
        # a short run may have logged once (at its end): a lone point needs a marker to show
        (line,) = by_frames.plot(x, y, marker="o" if len(x) == 1 else None, label=label)
        by_time.plot(*_mean_curve(curves, 1, smooth), marker=line.get_marker(), color=line.get_color())

    y_label = "mean return, last 100 episodes" if y_columns == {"mean_return_100"} else "return"
    by_frames.set_ylabel(f"{y_label} (mean over agents)")
    by_frames.set_xlabel("frames, summed over agents")
    by_time.set_xlabel("wall-clock seconds of training")
    for ax in (by_frames, by_time):
        ax.grid(alpha=0.3)
    by_frames.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)


def _read_metrics(csv_path: Path) -> tuple[str, np.ndarray]:
    """(column used, rows of [frames, wall_s, return]) for one agent.

    mean_return_100 is the smoother signal; episodic_return is the fallback for logs without
    it, chosen per file so one curve never mixes the two. Rows logged before any episode
    finished are skipped. After a resume from an older checkpoint, frames step back and the
    rows past the checkpoint are logged again; the later rows win, as in TensorBoard.
    """
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        column = "mean_return_100" if "mean_return_100" in (reader.fieldnames or []) else "episodic_return"
        points: list[tuple[float, float, float]] = []
        for row in reader:
            if not row.get(column):
                continue
            frames = float(row["frames"])
            while points and points[-1][0] >= frames:
                points.pop()
            points.append((frames, float(row["wall_s"]), float(row[column])))
    return column, np.array(points, dtype=np.float64).reshape(-1, 3)


def _mean_curve(curves: list[np.ndarray], x_col: int, smooth: int, scale: float = 1.0):
    """Mean of the agents' returns against column ``x_col``, on the sample points of all
    agents that lie in the range every agent covers (so identical logging needs no interpolation)."""
    if not curves:
        return [], []
    lo = max(c[0, x_col] for c in curves)
    hi = min(c[-1, x_col] for c in curves)
    grid = np.unique(np.concatenate([c[:, x_col] for c in curves]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    # np.interp needs rising x: _read_metrics leaves frames strictly rising, and wall_s with them
    y = np.mean([np.interp(grid, c[:, x_col], c[:, 2]) for c in curves], axis=0)
    if smooth > 1:
        sums = np.cumsum(np.insert(y, 0, 0.0))
        counts = np.minimum(np.arange(1, len(y) + 1), smooth)
        y = (sums[1:] - sums[np.arange(len(y)) + 1 - counts]) / counts
    return grid * scale, y


def _run_label(run_dir: Path, agents_logged: int) -> str:
    """The dir's name, plus what the launcher's config.json says about agents, topology and mode."""
    name = run_dir.resolve().name
    config_path = run_dir / "config.json"
    if not config_path.exists():
        return f"{name} ({agents_logged} agent{'s' if agents_logged != 1 else ''})"
    config = json.loads(config_path.read_text())
    swarm = config.get("swarm") or {}
    agents = swarm.get("agents", agents_logged)
    parts = [f"{agents} agent{'s' if agents != 1 else ''}"]
    topology = (config.get("topology") or {}).get("name") or swarm.get("topology")
    if topology:
        parts.append(str(topology))
        if swarm.get("mode"):
            parts.append(swarm["mode"])
    return f"{name} ({', '.join(parts)})"


def draw_rounds(topology, path: str | os.PathLike, max_rounds: int = 12) -> None:
    """Save a PNG with one panel per gossip round: agents on a circle, an arrow j -> i wherever
    i mixes in j in that round.

    One panel per round rather than the union (``draw_topology``) because a time-varying
    graph's rounds are what the agents actually do: one letter each, never a connected graph
    on their own, and only the period as a whole mixes. The headline gives the diagnostics
    that judge the whole period. Up to 64 agents and ``max_rounds`` rounds are drawn.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    import topologies

    n, period = topology.n, topology.period
    if n > 64:
        raise topologies.TopologyError(f"too many agents to draw ({n}; at most 64 are legible)")
    shown = min(period, max_rounds)
    cols = shown if shown <= 6 else 4
    rows = math.ceil(shown / cols)
    fig = Figure(figsize=(max(6.5, 3.2 * cols), 3.4 * rows + 0.8))
    FigureCanvasAgg(fig)
    pos = np.array([(math.sin(2 * math.pi * k / n), math.cos(2 * math.pi * k / n)) for k in range(n)])
    node_size = max(20.0, 260.0 * min(1.0, 16.0 / n))
    gap = math.sqrt(node_size) / 2 + 1
    for t in range(shown):
        ax = fig.add_subplot(rows, cols, t + 1)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_xlim(-1.25, 1.25)
        ax.set_ylim(-1.25, 1.25)
        view = topology.at(t)
        for i in range(n):
            for j in view.in_peers(i):
                ax.annotate(
                    "",
                    xy=pos[i],
                    xytext=pos[j],
                    zorder=1,
                    arrowprops=dict(
                        arrowstyle="-|>",
                        color=f"C{t % 10}",
                        lw=0.9 if n <= 16 else 0.5,
                        shrinkA=gap,
                        shrinkB=gap,
                        mutation_scale=9 if n <= 16 else 5,
                        connectionstyle="arc3,rad=0.12",
                    ),
                )
        ax.scatter(pos[:, 0], pos[:, 1], s=node_size, c="white", edgecolors="black", zorder=2)
        if n <= 16:
            for k, (x, y) in enumerate(pos):
                ax.text(x, y, str(k), fontsize=7, ha="center", va="center", zorder=3)
        letters = sum(len(view.out_peers(i)) for i in range(n)) / n
        ax.set_title(f"round t % {period} == {t}: {letters:g} letter{'s' if letters != 1 else ''}/agent", fontsize=9)
    title = f"{topology.name}: n={n}, period {period}"
    if n <= topologies.MAX_DENSE_N:
        d = topology.diagnostics()
        title += f"\ncontraction/period {d.contraction:.3f}, " + (
            "exact average after one period"
            if d.exact
            else f"{d.rounds_to_target} rounds to 1% disagreement"
            if d.rounds_to_target
            else "never converges"
        )
    if shown < period:
        title += f" (first {shown} rounds)"
    fig.suptitle(title, fontsize=11)
    height = fig.get_figheight()
    fig.subplots_adjust(top=1 - 0.9 / height, bottom=0.3 / height, hspace=0.3)
    fig.text(
        0.5, 0.01, "arrow j \u2192 i: agent i mixes in agent j's parameters", ha="center", fontsize=8, color="dimgray"
    )
    fig.savefig(path, format="png", dpi=110)
