"""The papers' claims each study tests, and how its cells judge them: by interval estimates of
experiments/stats.py on the axis the claim is about, never by whether two t-intervals overlap.

A claim says one arm X scores at least as well as each of some arms Y (or, about several arms, each
X as well as its own Y). Most are judged by the
probability of improvement P(X > Y) (an agent of X, drawn at random, ends above one of Y) and its
stratified-bootstrap interval: a comparison is *higher* where the interval lies above 0.5, *lower*
where it lies below, and cannot tell the arms apart where it holds 0.5. "At least as well" is never
shown by an interval that holds 0.5: that is the data failing to tell the arms apart.

A claim that X costs little against Y ("no worse by much") is about how big a difference is, which
P(X > Y) does not measure: it could support such a claim only where X is better. Such a claim
states a margin m, and why, and is judged by the ratio IQM(X) / IQM(Y) and its interval against
1 - m (non-inferiority): higher where the whole interval lies above 1 - m, lower where it lies
below, undecided where it holds 1 - m.

A claim that a change helps X beyond what it does elsewhere (the square-root learning-rate rule: a
ring gains from a larger rate where one agent does not) names a control, the pair (CX, CY) that the
same change turns CY into CX, and is judged by the gain ratio (IQM(X) / IQM(Y)) / (IQM(CX) / IQM(CY))
against 1: a change that helps both alike is no evidence for it.

A claim with several Ys is decided by all its comparisons at once: it is *contradicted* if any
comparison is lower (a clear result on data that exists is never hidden by another comparison's
missing seeds or cells), *supported* only if every comparison is higher, and *cannot be decided*
otherwise, with every reason (an interval that holds the line, too few seeds for an interval, an
arm with no finished cell). Reading k comparisons together, each takes a Bonferroni interval,
1 - 0.05 / k (95 % for one, 98.75 % for four): "contradicted" when any one of k comparisons is
lower would otherwise err more often than 5 % of the time. "Supported", which needs every one to
be higher, would already err at most 5 % with 95 % intervals (an intersection-union test), so one
interval size for both makes it conservative: it can miss a real gain, never claim a false one.
The IQMs of the arms, with intervals of the same size, are stated beside it.

The axes: ``frames``, each agent's own last-100 score at the end of its budget (equal frames per
agent where the study gives each agent the same frames, else equal frames for the whole swarm);
``wall_s``, each agent's last-100 score after T seconds of training (T from
``study.add_equal_wall_score``); ``consensus``, the averaged policy's evaluation, one per seed.
The comparisons listed beside the claim, on every axis, are 95 % intervals each, not corrected
for how many are shown: a description, and no verdict is read off them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments import lr_sweep, stats, swarm_learning, swarm_vs_one, topology_ablation
from experiments.common import agent_curves, cell_key, read_curves
from gossiprl.settings import NO_GOSSIP


@dataclass(frozen=True)
class Claim:
    source: str
    """Who claims it, and where: 'PALA Fig. 6, Table 1'."""
    text: str
    better: str
    """The arm the claim says scores at least as well as each of ``than``."""
    than: tuple[str, ...]
    axis: str
    """'frames' or 'wall_s': the axis the claim is about, the only one its verdict is read on."""
    why_axis: str
    margin: float | None = None
    """For a claim that ``better`` costs little against ``than``: the share of their IQM it may lose,
    judged by IQM ratio against 1 - margin (None: judged by P(X > Y) against 0.5)."""
    why_margin: str = ""
    control: tuple[str, str] | None = None
    """For a claim that a change helps ``better`` beyond what it does elsewhere: the control's arms with
    and without the change. Judged by the gain ratio (IQM(better) / IQM(than)) / (IQM(control[0]) /
    IQM(control[1])) against 1 (None: the claim's own arms alone)."""
    comparisons: tuple[tuple[str, str], ...] = ()
    """For a claim about several arms, each against its own: the (X, Y) pairs it is judged by, in place
    of ``better`` against each of ``than`` (which name its first pair). The scaling claim is about every
    swarm size, the topology claim about every graph at each size."""

    def __post_init__(self):
        if self.control is not None and (self.axis != "frames" or len(self.than) != 1 or self.margin is not None):
            raise ValueError(f"{self.source}: a claim with a control compares one arm per frame, with no margin")
        if self.comparisons and (self.control is not None or self.margin is not None):
            raise ValueError(f"{self.source}: a claim about several arms is judged by P, with no control or margin")
        if self.comparisons and self.comparisons[0] != (self.better, self.than[0]):
            raise ValueError(f"{self.source}: better and than name a claim's first comparison")

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The claim's comparisons, (X, Y)."""
        return list(self.comparisons) or [(self.better, y) for y in self.than]

    @property
    def arms(self) -> list[str]:
        """Every arm the claim's comparisons read."""
        return list(dict.fromkeys(arm for pair in self.pairs for arm in pair))


SCALING_PAIRS = tuple((f"{n} agents, ring", "1 agent (plain A2C)") for n in (2, 4, 8, 16))
TOPOLOGY_PAIRS = tuple(
    (f"{topology}, {n} agents", f"none (independent), {n} agents")
    for n in (4, 8)
    for topology in topology_ablation.TOPOLOGIES
    if topology != NO_GOSSIP
)

CLAIMS = {
    "swarm_learning": Claim(
        "GALA and PALA (PALA Fig. 6, Table 1)",
        "gossiping A2C agents learn at least as much per agent step as one A2C agent",
        "ring of 4, entropy 0.01, shared init, blocking",
        ("1 agent, entropy 0.01",),
        "frames",
        "per agent step is equal frames per agent; the ring has `gossiprl run`'s entropy bonus and one initial "
        "network, at A2C's Atari rate (7e-4) as every arm of this study; the agent is its control",
    ),
    "swarm_vs_one": Claim(
        "GALA and PALA (PALA Fig. 6, Table 1)",
        "gossiping A2C agents learn at least as much per agent step as one A2C agent",
        "ring of 4",
        ("1 agent",),
        "frames",
        "per agent step is equal frames per agent",
    ),
    "lr_sweep": Claim(
        "the square-root rule for adaptive optimizers (Malladi et al. 2022), which GALA's README follows for 4 "
        "learners (2x A2C's rate)",
        "a ring of 4, whose mean steps on a 4x batch, gains more per agent step from 2x the rate than one agent, "
        "whose batch is not larger, does",
        "ring of 4, lr 1.4e-3",
        ("ring of 4, lr 7e-4",),
        "frames",
        "the rule is about progress per step, and each agent's steps are its frames; one agent at each rate is "
        "the control (the rule predicts no gain for it), so a rate that helps both alike is no evidence for it",
        control=("1 agent, lr 1.4e-3", "1 agent, lr 7e-4"),
    ),
    "lr_confirm": Claim(
        "this project's own hypothesis, from a comparison listed beside the learning-rate sweep's claim, fixed "
        "before these seeds ran",
        "at 4x A2C's Atari rate (2.8e-3), gossiping A2C agents in a ring of 4 learn more per agent step than one "
        "A2C agent",
        "ring of 4, lr 2.8e-3",
        ("1 agent, lr 2.8e-3",),
        "frames",
        "per agent step is equal frames per agent, the papers' axis; on seeds 6-10, which the sweep that "
        "suggested it did not use",
    ),
    "learners": Claim(
        "PALA Table 1 (PALA-A2C against A2C); for PPO and IMPALA this project's own question",
        "a ring of 4 learns at least as much per agent step as one agent of the same learner",
        "A2C, ring of 4",
        ("A2C, 1 agent",),
        "frames",
        "per agent step is equal frames per agent; each learner runs its papers' defaults in both arms",
    ),
    "ordering_ablation": Claim(
        "PALA (its implicit synchronisation, the turn locks)",
        "ordered (sync) gossip learns more per agent step than unordered async gossip and than independent agents",
        "sync (turn locks)",
        ("async, max-staleness 1", "async, max-staleness 4", "async, unbounded", "none (independent)"),
        "frames",
        "a gain from agents is a gain per agent step, and every arm has 4 agents and the same frames; the "
        "cells' wall-clock is confounded by the load of the window each ran in",
    ),
    "topology_ablation": Claim(
        "GALA (its one-peer exponential graph) and PALA (its ring)",
        "gossiping agents learn more per agent step than independent ones, whichever graph they gossip on (ring, "
        "sparse, full, one-peer-exponential), at 4 and at 8 agents",
        TOPOLOGY_PAIRS[0][0],
        (TOPOLOGY_PAIRS[0][1],),
        "frames",
        "each graph is set against independent agents of its size, with the same frames; their wall-clock ran in "
        "other windows of load (Note). The claim read the ring of 4 alone until 2026-11-28, when a review found it "
        "named one graph of the four the study runs; it was widened after the 4-agent cells were known",
        comparisons=TOPOLOGY_PAIRS,
    ),
    "scaling": Claim(
        "PALA Figs. 6-8",
        "gossiping agents, 2 to 16 of them, learn at least as much per agent step as one agent, so that with each "
        "agent on its own cores and GPU more agents reach a score sooner in wall-clock time (Fig. 7: the time "
        "efficiency decays past 16-24 agents)",
        SCALING_PAIRS[0][0],
        (SCALING_PAIRS[0][1],),
        "frames",
        "with each agent on its own hardware, as in the paper, an agent's frames are its wall-clock (plus the "
        "gossip's share, which the time split gives); on these 2 shared cores more agents bring no more cores, "
        "so the cells' own seconds measure the sharing, not the claim",
        comparisons=SCALING_PAIRS,
    ),
    "batch_period": Claim(
        "this project's own question, not a paper's claim (PALA Fig. 12 varies the batch size, not the gossip period)",
        "gossiping every 16 updates learns at least as much per frame as gossiping every update",
        "5 steps x 16 envs, gossip every 16",
        ("5 steps x 16 envs, gossip every update",),
        "frames",
        "what gossiping less often may cost is learning per frame; the time it saves is in the table",
    ),
    "layout": Claim(
        "PALA Fig. 5(b)",
        "spreading the agents over hosts costs little time, because parameter transfer is a small share of an "
        "iteration",
        "2 netns hosts, 1 Gbit/s links (tcp + CURVE)",
        ("one host (tcp loopback)",),
        "wall_s",
        "the claim is about time, and per frame the two are the same runs (sync gossip is deterministic)",
        margin=0.10,
        why_margin="the paper puts no number on 'little'; a tenth of the one host's score is this project's "
        "reading of it, a common non-inferiority margin. It was chosen when the study's older cells (100k frames, "
        "since replaced by its plan) were known, and fixed on 2026-11-25, before any cell of the plan ran",
    ),
}
"""Each study's claim, keyed by the study's module name."""

EXTRA = {
    "swarm_learning": [
        ("ring of 4, entropy 0.01, shared init, blocking", "ring of 4, old defaults (entropy 0, own inits, blocking)"),
        ("ring of 4, entropy 0.01, shared init, blocking", "ring of 4, entropy 0.01, shared init, overlapped"),
        *swarm_learning.CONTROL.items(),
    ],
    "learners": [("PPO, ring of 4", "PPO, 1 agent"), ("IMPALA, ring of 4", "IMPALA, 1 agent")],
    "ordering_ablation": [("sync (turn locks)", "sync, overlapped")],
    "swarm_vs_one": [(swarm_vs_one.RING_ATARI, swarm_vs_one.ONE_ATARI), ("1 agent", swarm_vs_one.ONE_ATARI)],
    "lr_sweep": [
        (f"{layout}, {rate}", f"{layout}, {other}")
        for layout in lr_sweep.LAYOUTS
        for rate, other in itertools.combinations(reversed(lr_sweep.RATES), 2)
    ]
    + [(f"ring of 4, {rate}", f"1 agent, {rate}") for rate in lr_sweep.RATES],
}
"""Comparisons a study reports beside its claim's: swarm_learning's every ring against its control,
the learners study's ring of each learner against its one agent, swarm_vs_one's arms at A2C's Atari
rate (the ring against one agent as it stood before MinAtar's rate, and what the new rate bought one
agent), and every pair of lr_sweep's rates for one agent and for the ring, and the ring against one
agent at each rate."""


EXTRA_GAINS = {
    "lr_sweep": [
        ("ring of 4, lr 2.8e-3", "ring of 4, lr 7e-4", "1 agent, lr 2.8e-3", "1 agent, lr 7e-4"),
        ("ring of 4, lr 2.8e-3", "ring of 4, lr 1.4e-3", "1 agent, lr 2.8e-3", "1 agent, lr 1.4e-3"),
    ],
}
"""Gain ratios (X / Y) / (CX / CY) a study reports beside its claim's, per frame, uncorrected: lr_sweep's
at 4x the rate, the linear scaling rule's setting for a 4x batch (Goyal et al. 2017), against 1x and 2x."""


@dataclass(frozen=True)
class EqualTotal:
    total: str
    """The arm of one agent trained as many frames as the whole swarm."""
    swarm: str
    one: str
    """The swarm and the one agent it is set beside: the arms with ``total``'s hyperparameters."""


EQUAL_TOTAL = {"swarm_vs_one": EqualTotal(swarm_vs_one.EQUAL_TOTAL, swarm_vs_one.RING_ATARI, swarm_vs_one.ONE_ATARI)}
"""A study's arm trained as many frames as the whole swarm: compared with the swarm at equal total
frames, and explained there, never counted among the equal-frames-per-agent settings."""


class Arms:
    """A study's settings' scores as experiments.stats tasks, (seeds, members) arrays, on each axis."""

    def __init__(self, out: Path, rows: list[dict]):
        self.out, self.rows = out, rows
        self.t_equal = rows[0]["equal_wall_s"] if rows else 0.0

    def seeds(self, setting: str) -> int:
        return sum(r["setting"] == setting for r in self.rows)

    def scores(self, setting: str, axis: str, seeds: list[int] | None = None) -> np.ndarray:
        """Rows: seeds (those of ``seeds`` where given); columns: agents ('consensus': one per seed).
        A seed none of whose agents had logged a score by T is left out of the 'wall_s' axis."""
        mine = [r for r in self.rows if r["setting"] == setting and (seeds is None or r["seed"] in seeds)]
        if axis == "frames":
            values = [r["per_agent_last100"] for r in mine]
        elif axis == "consensus":
            values = [[r["consensus_eval"]] for r in mine]
        else:
            values = [self._at_equal_wall(r) for r in mine]
            values = [v for v in values if not np.isnan(v).any()]
        return np.array(values, dtype=float).reshape(len(values), -1) if values else np.empty((0, 0))

    def _at_equal_wall(self, row: dict) -> np.ndarray:
        curves = read_curves(self.out, cell_key(row["setting"], row["seed"]))
        return agent_curves(curves, "wall_s", np.array([self.t_equal]), row["agents"], hold_last=True)[:, 0]

    def iqm(
        self, setting: str, axis: str, bounds: tuple[float, float], size: float = 0.95, seeds: list[int] | None = None
    ) -> stats.Estimate | None:
        scores = self.scores(setting, axis, seeds)
        return stats.iqm_interval([scores], size=size).clipped(bounds) if scores.size else None

    def improvement(
        self, x: str, y: str, axis: str, size: float = 0.95, seeds: list[int] | None = None
    ) -> stats.Estimate | None:
        xs, ys = self.scores(x, axis, seeds), self.scores(y, axis, seeds)
        return stats.improvement_interval([xs], [ys], size=size) if xs.size and ys.size else None

    def ratio(
        self, x: str, y: str, axis: str, size: float = 0.95, seeds: list[int] | None = None
    ) -> stats.Estimate | None:
        """IQM(x) / IQM(y); None where y has a score of 0 or less, which a ratio cannot take."""
        xs, ys = self.scores(x, axis, seeds), self.scores(y, axis, seeds)
        return stats.ratio_interval([xs], [ys], size=size) if (ys > 0).all() else None

    def windows_recorded(self, x: str, y: str) -> bool:
        """Whether a cell of ``x`` or ``y`` records its window of machine load: cells run before windows
        were recorded (2026-11-28) do not, and their wall-clock is described, never read as a result."""
        return any(r.get("window") is not None for r in self.rows if r["setting"] in (x, y))

    def gain_ratio(
        self, x: str, y: str, cx: str, cy: str, axis: str, size: float = 0.95, seeds: list[int] | None = None
    ) -> stats.Estimate | None:
        """(IQM(x) / IQM(y)) / (IQM(cx) / IQM(cy)); None where y, cx or cy has a score of 0 or less."""
        xs, ys, cxs, cys = (self.scores(s, axis, seeds) for s in (x, y, cx, cy))
        if not all(a.size for a in (xs, ys, cxs, cys)) or min(a.min() for a in (ys, cxs, cys)) <= 0:
            return None
        return stats.gain_ratio_interval([xs], [ys], [cxs], [cys], size=size)

    def same_window_seeds(self, x: str, y: str) -> list[int]:
        """The seeds whose cells of ``x`` and of ``y`` each ran in one session and, where windows are
        recorded, in one window of machine load (one call of a study, which runs its arms seed by seed;
        a cell from the shared cache keeps the window it ran in): the only seeds their wall-clock
        compares on. A resumed cell ran under two loads and compares on frames only."""
        mine = {(r["setting"], r["seed"]): r for r in self.rows if r["setting"] in (x, y)}
        recorded = self.windows_recorded(x, y)

        def window(setting: str, seed: int):
            row = mine.get((setting, seed))
            if row is None or (row.get("sessions") or 1) > 1:
                return None
            return row.get("window") if recorded else "one session"

        seeds = sorted({seed for _, seed in mine})
        return [s for s in seeds if window(x, s) is not None and window(x, s) == window(y, s)]


NO_WINDOW = "no seed has cells of both that ran in one window of machine load"
ALL_RESUMED = "no seed has cells of both that each ran in one session (a resumed cell ran under two loads)"


def no_seed_text(arms: Arms, x: str, y: str) -> str:
    """Why no seed compares ``x`` and ``y`` in wall-clock."""
    return NO_WINDOW if arms.windows_recorded(x, y) else ALL_RESUMED


UNRECORDED = "not read: these cells record no window of machine load, so they may have run under other loads"


def window_text(arms: Arms, x: str, y: str, seeds: list[int] | None) -> str:
    """Where a wall-clock comparison stands on fewer seeds than the arms both have: which, and why."""
    both = {r["seed"] for r in arms.rows if r["setting"] == x} & {r["seed"] for r in arms.rows if r["setting"] == y}
    if seeds is None or len(seeds) == len(both):
        return ""
    why = "ran in one window" if arms.windows_recorded(x, y) else "each ran in one session"
    return f"; on seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}, whose cells {why}"


def interval_text(estimate: stats.Estimate) -> str:
    return f"{estimate.point:.2f}" + ("" if estimate.low is None else f" [{estimate.low:.2f}, {estimate.high:.2f}]")


def judge(estimate: stats.Estimate, line: float = 0.5) -> str:
    """What an interval says against ``line`` (0.5 for P(X > Y), 1 - margin for a ratio):
    'higher', 'lower', 'cannot tell apart' or why not."""
    if estimate.low is None:
        return f"no interval: fewer than {stats.MIN_RUNS} seeds in an arm"
    if estimate.low > line:
        return "higher"
    if estimate.high < line:
        return "lower"
    return "cannot tell apart"


VERDICT = {"higher": "**supports** it", "lower": "**contradicts** it", "cannot tell apart": "**cannot decide** it"}


def axis_text(axis: str, arms: Arms, frames_per_agent: bool) -> str:
    if axis == "frames":
        return "at equal frames per agent" if frames_per_agent else "at equal frames for the whole swarm"
    if axis == "wall_s":
        return f"at equal wall-clock ({arms.t_equal:.0f} s of training)"
    return "consensus policy (eval)"


def size_text(size: float, comparisons: int) -> str:
    if comparisons == 1:
        return f"{100 * size:.4g} % intervals"
    return f"{100 * size:.4g} % intervals (Bonferroni: {100 * (1 - stats.ALPHA):g} % over {comparisons} comparisons)"


def comparison_lines(
    name: str, arms: Arms, settings: list[str], frames_per_agent: bool, stale: tuple[str, ...] = ()
) -> list[str]:
    """P(X > Y) with its 95 % interval and what it says, on every axis, for the claim's pairs and
    the study's extra ones (none for a study with no claim here): uncorrected, no verdict. An arm
    whose cells are older runs (``stale``) is compared only with another such arm: against one
    run today it would set one budget or loop against another (a study part-way through its
    new plan compared its first 1M-frame cell with 100k-frame ones: P = 1.00)."""
    claim = CLAIMS.get(name)
    if claim is None:
        return []
    pairs = claim.pairs + EXTRA.get(name, [])
    lines = []
    for x, y in dict.fromkeys(pairs):
        if x not in settings or y not in settings or not (arms.seeds(x) and arms.seeds(y)):
            continue
        if (x in stale) != (y in stale):
            older = x if x in stale else y
            lines.append(f"- P({x} > {y}): not compared, the cells of {older} are older runs (above).")
            continue
        parts = []
        for axis in ("frames", "wall_s", "consensus"):
            seeds = arms.same_window_seeds(x, y) if axis == "wall_s" else None
            if seeds == []:
                parts.append(f"{axis_text(axis, arms, frames_per_agent)} not compared ({no_seed_text(arms, x, y)})")
                continue
            estimate = arms.improvement(x, y, axis, seeds=seeds)
            if estimate is not None:
                read = axis != "wall_s" or arms.windows_recorded(x, y)
                reading = (judge(estimate) if read else UNRECORDED) + window_text(arms, x, y, seeds)
                parts.append(f"{axis_text(axis, arms, frames_per_agent)} {interval_text(estimate)} ({reading})")
        lines.append(f"- P({x} > {y}): {'; '.join(parts)}.")
    return lines + gain_lines(name, arms, stale)


ABOUT_ONE = {"higher": "above 1", "lower": "below 1", "cannot tell apart": "holds 1"}


def gain_lines(name: str, arms: Arms, stale: tuple[str, ...] = ()) -> list[str]:
    """``EXTRA_GAINS``' ratios at equal frames per agent, with 95 % intervals and no verdict, where all four
    arms have cells of today's plan."""
    lines = []
    for x, y, cx, cy in EXTRA_GAINS.get(name, []):
        if any(not arms.seeds(s) or s in stale for s in (x, y, cx, cy)):
            continue
        estimate = arms.gain_ratio(x, y, cx, cy, "frames")
        if estimate is None:
            shown = "no ratio: an arm has a score of 0 or less"
        else:
            reading = judge(estimate, 1.0)
            shown = f"{interval_text(estimate)} ({ABOUT_ONE.get(reading, reading)})"
        lines.append(f"- Gain ratio ({x} / {y}) / ({cx} / {cy}) at equal frames per agent: {shown}.")
    return lines


def compare(claim: Claim, x: str, other: str, arms: Arms, bounds: tuple[float, float], size: float) -> tuple[str, str]:
    """One of a claim's comparisons, ``x`` against ``other``, on its axis: (its reading, the text that
    shows it)."""
    axis = claim.axis
    name = other if not claim.comparisons else f"{x} against {other}"
    same = arms.same_window_seeds(x, other) if axis == "wall_s" and arms.seeds(other) else None
    if same == []:
        reading = "other windows" if arms.windows_recorded(x, other) else "resumed"
        return reading, f"{name}: not compared ({no_seed_text(arms, x, other)})"
    if not len(arms.scores(other, axis, same)):
        return "not run", f"{name}: no finished cell{'' if name == other else f' of {other}'} has a score there"
    if not len(arms.scores(x, axis, same)):  # none of x's cells (on the seeds whose cells share a window)
        where = "" if same is None else " on the seeds compared"
        return "not run", f"{name}: no cell of {x}{where} has a score there"
    seeds = f"({len(arms.scores(x, axis, same))} and {len(arms.scores(other, axis, same))} seeds"
    seeds += window_text(arms, x, other, same) + ")"
    x_iqm, other_iqm = (interval_text(arms.iqm(s, axis, bounds, size, same)) for s in (x, other))
    iqms = f"IQM {x_iqm} against {other_iqm}"
    unread = axis == "wall_s" and not arms.windows_recorded(x, other)
    if claim.control is not None:
        return _against_control(claim, other, arms, bounds, size, f"{iqms} {seeds}")
    if claim.margin is None:
        estimate = arms.improvement(x, other, axis, size, same)
        text = f"P({x} > {other}) = {interval_text(estimate)}, {iqms} {seeds}"
        return ("unrecorded windows", f"{text}, {UNRECORDED}") if unread else (judge(estimate), text)
    estimate = arms.ratio(x, other, axis, size, same)
    if estimate is None:
        return "no ratio", f"{other} has a score of 0 or less, which a ratio cannot take; {iqms} {seeds}"
    text = f"IQM ratio {x} / {other} = {interval_text(estimate)}, {iqms} {seeds}"
    return ("unrecorded windows", f"{text}, {UNRECORDED}") if unread else (judge(estimate, 1 - claim.margin), text)


def _against_control(
    claim: Claim, other: str, arms: Arms, bounds: tuple[float, float], size: float, iqms: str
) -> tuple[str, str]:
    """A claim with a control, on frames: X's gain over ``other`` against the control's, by the gain ratio."""
    x, (cx, cy) = claim.better, claim.control
    if not (len(arms.scores(cx, claim.axis)) and len(arms.scores(cy, claim.axis))):
        return "not run", f"the control ({cx} against {cy}) has no finished cell with a score there"
    control = f"{cx} {interval_text(arms.iqm(cx, claim.axis, bounds, size))} against {cy} "
    control += f"{interval_text(arms.iqm(cy, claim.axis, bounds, size))}"
    estimate = arms.gain_ratio(x, other, cx, cy, claim.axis, size)
    if estimate is None:
        return "no ratio", f"an arm has a score of 0 or less, which a ratio cannot take; {iqms}; control {control}"
    text = f"gain ratio ({x} / {other}) / ({cx} / {cy}) = {interval_text(estimate)}, {iqms}; control {control}"
    return judge(estimate, 1.0), text


def verdict(claim: Claim, readings: list[str]) -> str:
    """The claim's verdict from its comparisons' readings (the module's docstring says why so)."""
    if "lower" in readings:
        return VERDICT["lower"]
    if all(r == "higher" for r in readings):
        return VERDICT["higher"]
    line = "of P holds 0.5" if claim.margin is None else f"of the ratio holds {1 - claim.margin:.2f}"
    line = "of the gain ratio holds 1" if claim.control is not None else line
    reasons = {
        "cannot tell apart": f"an interval {line}",
        "not run": "an arm has no finished cell with a score there",
        "no ratio": "an arm has a score of 0 or less, which a ratio cannot take",
        "other windows": "no seed has cells of the claim's arm and of another that ran in one window of machine load",
        "unrecorded windows": "the cells record no window of machine load, so their wall-clock is not read",
        "resumed": "no seed has cells of the claim's arm and of another that each ran in one session",
    }
    too_few = f"fewer than {stats.MIN_RUNS} seeds in an arm give no interval"
    why = dict.fromkeys(reasons.get(r, too_few) for r in readings if r != "higher")
    return f"{VERDICT['cannot tell apart']}: {'; '.join(why)}"


def claim_lines(
    name: str, arms: Arms, bounds: tuple[float, float], frames_per_agent: bool, stale: tuple[str, ...] = ()
) -> list[str]:
    """The claim, the axis it is judged on and why, its margin if it has one, each comparison
    there, and the verdict. No verdict is read off an arm in ``stale``, whose cells ran under other
    settings than the study plans today (an older loop, another budget): they answer another question."""
    claim = CLAIMS.get(name)
    if claim is None:
        return ["- No paper claim is recorded for this study in experiments/claims.py: no verdict."]
    axis = axis_text(claim.axis, arms, frames_per_agent)
    head = f"- **Claim**, {claim.source}: {claim.text}. Judged {axis}: {claim.why_axis}."
    if claim.margin is not None:
        head += (
            f" Judged by the IQM ratio {claim.better} / each other arm against a margin of {100 * claim.margin:g} %: "
            f"the data supports the claim where the ratio's whole interval lies above {1 - claim.margin:.2f}, "
            f"contradicts it where the interval lies below, and cannot decide it otherwise. Why "
            f"{100 * claim.margin:g} %: {claim.why_margin}."
        )
    if claim.control is not None:
        head += (
            f" Judged by the gain ratio (IQM {claim.better} / IQM {claim.than[0]}) / (IQM {claim.control[0]} / IQM "
            f"{claim.control[1]}): the data supports the claim where its whole interval lies above 1, contradicts it "
            "where it lies below, and cannot decide it otherwise."
        )
    older = [arm for arm in (*claim.arms, *(claim.control or ())) if arm in stale]
    if older:
        return [
            f"{head} This data **cannot decide** it: the cells of {', '.join(older)} ran under other settings than "
            "the study plans today (Older runs, above); running its command again replaces them."
        ]
    missing = [s for s in claim.arms if not len(arms.scores(s, claim.axis))]
    if {x for x, _ in claim.pairs} <= set(missing) or {y for _, y in claim.pairs} <= set(missing):
        return [f"{head} Not tested here: no finished cell of {', '.join(missing)} has a score there."]
    size = stats.bonferroni(len(claim.pairs))
    readings, parts = zip(*(compare(claim, x, other, arms, bounds, size) for x, other in claim.pairs))
    return [
        f"{head} {size_text(size, len(claim.pairs))}: {'; '.join(parts)}. This data {verdict(claim, list(readings))}."
    ]


def updates(row: dict) -> int:
    """Optimizer steps each agent of a cell took (rows from before ``steps_per_update`` was
    recorded are A2C's, n_steps x num_envs; IMPALA's update takes a batch of such unrolls)."""
    return round(row["frames"] / row["agents"] / row.get("steps_per_update", row["n_steps"] * row["num_envs"]))


BATCH_GAIN = {
    "higher": "a gain this data shows",
    "lower": "a loss this data shows",
    "cannot tell apart": "this data cannot tell it from none",
}


def equal_total_lines(name: str, arms: Arms, bounds: tuple[float, float], stale: tuple[str, ...] = ()) -> list[str]:
    """The swarm against one agent given the whole swarm's frames, and why it falls where it does:
    the swarm's mean moves like one learner with an n-fold batch, not like n learners' steps. Where
    some of its three arms' cells are older runs (``stale``) and some are today's, nothing is compared:
    the explanation reads all three together."""
    equal = EQUAL_TOTAL.get(name)
    if equal is None:
        return []
    total, swarm, one = equal.total, equal.swarm, equal.one
    missing = [s for s in (swarm, one, total) if not arms.seeds(s)]
    if missing:
        return [f"- At equal total frames: not measured here (no finished cell of {', '.join(missing)})."]
    arms_here = (swarm, one, total)
    older = [s for s in arms_here if s in stale]
    if older and len(older) < len(arms_here):
        return [f"- At equal total frames: not compared, the cells of {', '.join(older)} are older runs (above)."]
    row = {s: next(r for r in arms.rows if r["setting"] == s) for s in (swarm, one, total)}
    n, batch = row[swarm]["agents"], row[swarm]["n_steps"] * row[swarm]["num_envs"]
    against_total = arms.improvement(swarm, total, "frames")
    total_iqm, one_iqm, swarm_iqm = (arms.iqm(s, "frames", bounds) for s in (total, one, swarm))
    at_equal_steps = arms.improvement(swarm, one, "frames")
    gain = BATCH_GAIN.get(judge(at_equal_steps), judge(at_equal_steps))
    if total_iqm.low is None:
        return [
            f"- At equal total frames: {swarm} {interval_text(swarm_iqm)} against {total} "
            f"{interval_text(total_iqm)}, too few seeds for an interval."
        ]
    inside = total_iqm.low <= swarm_iqm.point <= total_iqm.high
    lines = [
        f"- At equal total frames ({row[total]['frames'] / 1e6:g}M): {swarm} {interval_text(swarm_iqm)} against "
        f"{total} {interval_text(total_iqm)}; P({swarm} > {total}) = {interval_text(against_total)} "
        f"({judge(against_total)}). The {swarm}'s IQM is {'inside' if inside else 'outside'} that arm's interval."
    ]
    if not inside:
        lines.append(
            f"- Why, by the project's derivation (docs/algorithm.md, docs/swarm-learning.md): with blocking gossip "
            f"and the ring's doubly stochastic mixing, each round moves the swarm's mean by the mean of its "
            f"{n} agents' updates, about one RMSProp step at the single agent's learning rate on a gradient "
            f"averaged over {n} batches of {batch} transitions (about: each agent's RMSProp scales its own "
            f"step). The swarm's mean is one learner with a {n}x batch, not {n} learners' worth of steps: it took "
            f"{updates(row[swarm]):,} steps of {n * batch} transitions, as many as {one} "
            f"({updates(row[one]):,} steps of {batch}, IQM {interval_text(one_iqm)}), where {total} took "
            f"{updates(row[total]):,} steps of {batch}. At equal steps, P({swarm} > {one}) = "
            f"{interval_text(at_equal_steps)}: what the larger batch buys per step ({gain}). "
            "Equal total frames is not the papers' axis: their claim is per agent step, and per wall-clock with "
            f"each agent on its own hardware, where the swarm's {n}x frames take one agent's time plus the "
            "gossip's (not measurable on these 2 shared cores)."
        )
    return lines
