"""How fast a (possibly time-varying) topology reaches consensus, from one period's product.

For a periodic schedule P_0, ..., P_{T-1}, what gossip applies again and again is the period
product W = P_{T-1} ... P_0. Its consensus projection J = 1 pi^T (pi: W's left Perron vector,
1/n for doubly stochastic rounds) is where all agents end up, and the disagreement
e = x - J x obeys e <- (W - J) e each period. So ||W - J||_2, the second-largest singular value
of W when W is doubly stochastic, is the contraction a convergence proof needs per period;
a single round's graph may not be connected at all (one-peer graphs) and says nothing alone.
Everything here is dense linear algebra, O(n^3): above :data:`MAX_DENSE_N` agents it is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import TopologyError

MAX_DENSE_N = 256  # the most agents whose n x n products and SVDs are computed (~3 s at 256, 20 s at 512)
_EXACT = 1e-9  # ||W - J|| below this is float noise: the period averages exactly
_MAX_DOUBLINGS = 62  # 2^62 periods without reaching the target: it never converges


@dataclass(frozen=True)
class Diagnostics:
    """The figures that decide a topology for a run (see the module docstring for the maths)."""

    n: int
    period: int
    letters_per_round: float
    """Letters (full parameter copies) an agent sends per round, averaged over agents and one period."""
    contraction: float
    """||W - J||_2 for one period's product W: the worst-case shrink of disagreement per period."""
    exact: bool
    """Whether one period's product is exactly the averaging matrix 11^T / n."""
    rounds_to_target: int | None
    """Rounds until the worst-case disagreement is 1/shrink of the start (None: never)."""
    shrink: float


def check_size(n: int, what: str) -> None:
    if n > MAX_DENSE_N:
        raise TopologyError(
            f"{what} needs dense n x n algebra, refused above n={MAX_DENSE_N} agents "
            f"(got n={n}); peers and weights per rank are still available"
        )


def diagnose(rounds: list[np.ndarray], shrink: float = 100.0) -> Diagnostics:
    """Diagnostics of the periodic schedule ``rounds`` (dense row-stochastic matrices, round 0 first)."""
    n, period = rounds[0].shape[0], len(rounds)
    check_size(n, "diagnostics")
    partial = [np.eye(n)]  # partial[s] = P_{s-1} ... P_0
    for p in rounds:
        partial.append(p @ partial[-1])
    w = partial[-1]
    j = np.outer(np.ones(n), _perron(w))
    letters = sum(int((p > 0).sum() - (np.diag(p) > 0).sum()) for p in rounds) / (n * period)
    contraction = _norm(w - j)
    exact = _norm(w - 1.0 / n) < _EXACT
    return Diagnostics(
        n,
        period,
        letters,
        0.0 if contraction < _EXACT else contraction,
        exact,
        _rounds_to(partial, j, 1.0 / shrink),
        shrink,
    )


def _perron(w: np.ndarray) -> np.ndarray:
    """Left eigenvector of W for eigenvalue 1, summing to 1: the weight of each agent's start in
    the consensus value. A least-squares solve of pi^T (W - I) = 0, sum(pi) = 1."""
    n = w.shape[0]
    a = np.vstack([(w - np.eye(n)).T, np.ones((1, n))])
    b = np.zeros(n + 1)
    b[-1] = 1.0
    return np.linalg.lstsq(a, b, rcond=None)[0]


def _norm(m: np.ndarray) -> float:
    return float(np.linalg.norm(m, 2)) if m.size > 1 else float(abs(m).max())


def _rounds_to(partial: list[np.ndarray], j: np.ndarray, target: float) -> int | None:
    """Smallest m with ||Phi(m) - J|| <= target, Phi(m) the product of the first m rounds.

    Whole periods first, by binary lifting over W^(2^k) (the error never grows for doubly
    stochastic rounds, so the first power under target brackets it), then the rounds of the
    last period one by one.
    """
    w, period = partial[-1], len(partial) - 1
    powers = [w]
    while _norm(powers[-1] - j) > target:
        if len(powers) > _MAX_DOUBLINGS:
            return None
        powers.append(powers[-1] @ powers[-1])
    before, periods = np.eye(len(w)), 0  # the most whole periods still above target
    for k in range(len(powers) - 2, -1, -1):
        candidate = powers[k] @ before
        if _norm(candidate - j) > target:
            before, periods = candidate, periods + (1 << k)
    for s in range(1, period + 1):
        if _norm(partial[s] @ before - j) <= target:
            return periods * period + s
    return (periods + 1) * period


def table(make, names: list[str], sizes: list[int], shrink: float = 100.0) -> str:
    """A Markdown table of every family at every size; ``make(name, n)`` builds the topology
    (the caller's choice of options), and cells it refuses say why in a word."""
    head = ["family", "n", "period", "letters/agent/round", "contraction/period", "rounds to 1%", "exact average"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        for n in sizes:
            try:
                topology = make(name, n)
            except TopologyError as err:
                lines.append(f"| {name} | {n} | - | - | - | - | n/a: {_short(str(err))} |")
                continue
            d = diagnose([topology.at(r).matrix for r in range(topology.period)], shrink)
            rounds = "never" if d.rounds_to_target is None else str(d.rounds_to_target)
            lines.append(
                f"| {name} | {n} | {d.period} | {d.letters_per_round:g} | {d.contraction:.4g} | "
                f"{rounds} | {'yes' if d.exact else 'no'} |"
            )
    return "\n".join(lines)


def _short(message: str) -> str:
    return message.split(",")[0].split("(")[0].strip()


def summary_lines(d: Diagnostics) -> list[str]:
    """describe()'s lines for the diagnostics, worded for someone choosing a topology."""
    per = f"per period ({d.period} rounds)" if d.period > 1 else "per round"
    lines = [
        f"letters sent per agent per round: {d.letters_per_round:g} (bytes = that x the model size)",
        f"contraction {per}: {d.contraction:.4f} (largest singular value of the period product minus "
        "its consensus projection)",
    ]
    if d.exact:
        lines.append(
            f"one period's product averages exactly: yes (all agents hold the mean after {d.period} "
            f"round{'s' if d.period > 1 else ''})"
        )
    else:
        lines.append("one period's product averages exactly: no")
    if d.rounds_to_target is None:
        lines.append(f"disagreement never shrinks {d.shrink:g}x")
    else:
        periods = math.ceil(d.rounds_to_target / d.period)
        within = f" ({periods} period{'s' if periods > 1 else ''})" if d.period > 1 else ""
        lines.append(f"rounds to shrink the worst-case disagreement {d.shrink:g}x: {d.rounds_to_target}{within}")
    return lines
