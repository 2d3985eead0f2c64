"""Pictures of gossip topologies: a quick visual check of who hears from whom before a run."""
from __future__ import annotations

import math
import os


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

    edges: dict[tuple[int, int], list[tuple[int, float]]] = {}   # (j, i) -> [(round, p_ij)]
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
    gap = math.sqrt(node_size) / 2 + 2          # points between node centre and arrow tip
    colors = [f"C{t % 10}" for t in range(period)]
    rad = 0.12                                  # curve j->i and i->j to opposite sides
    for (j, i), uses in edges.items():
        (x1, y1), (x2, y2) = pos[j], pos[i]
        ax.annotate("", xy=(x2, y2), xytext=(x1, y1), zorder=1,
                    arrowprops=dict(arrowstyle="-|>", color=colors[uses[0][0]], lw=1.0 if n <= 16 else 0.5,
                                    shrinkA=gap, shrinkB=gap, mutation_scale=12 if n <= 16 else 6,
                                    connectionstyle=f"arc3,rad={rad}"))
        if n <= 8:
            # a point of matplotlib's arc3 quadratic Bezier, past the middle towards the receiver
            # (whose weight it is), so labels of crossing and opposite arrows do not pile up
            cx, cy = (x1 + x2) / 2 + rad * (y2 - y1), (y1 + y2) / 2 - rad * (x2 - x1)
            s = 0.65
            lx = (1 - s) ** 2 * x1 + 2 * s * (1 - s) * cx + s ** 2 * x2
            ly = (1 - s) ** 2 * y1 + 2 * s * (1 - s) * cy + s ** 2 * y2
            text = ", ".join(f"t{t}: {w:.2f}" if period > 1 else f"{w:.2f}" for t, w in uses)
            ax.text(lx, ly, text, fontsize=7, ha="center", va="center", zorder=3,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))

    ax.scatter([x for x, _ in pos], [y for _, y in pos], s=node_size, c="white", edgecolors="black", zorder=2)
    if n <= 64:
        for k, (x, y) in enumerate(pos):
            ax.text(x, y, str(k), fontsize=10 if n <= 16 else 6, ha="center", va="center", zorder=4)
            self_weights = {float(p[k, k]) for p in rounds}
            if n <= 8 and len(self_weights) == 1:
                side = "left" if x > 0.3 else "right" if x < -0.3 else "center"
                ax.text(1.17 * x, 1.17 * y, f"self {self_weights.pop():.2f}", fontsize=7, ha=side,
                        va="center", color="dimgray")

    title = f"{topology.name}: n={n}, spectral gap {topology.spectral_gap:.3f}"
    if topology.time_varying:
        title += f"\nunion of one period ({period} rounds; colour = round)"
        ax.legend(handles=[Line2D([], [], color=c, label=f"round t % {period} == {t}") for t, c in enumerate(colors)],
                  loc="lower right", fontsize=7, frameon=False)
    ax.set_title(title, fontsize=11)
    fig.text(0.5, 0.02, "arrow j \u2192 i: agent i mixes in agent j's parameters", ha="center",
             fontsize=8, color="dimgray")
    fig.savefig(path, format="png", dpi=120)
