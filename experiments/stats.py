"""The interval estimates RESULTS.md reports: rliable's (Agarwal et al. 2021, *Deep RL at the edge
of the statistical precipice*), in numpy, because rliable itself pulls arch, seaborn and pandas.

* IQM: the mean of the middle half of every score pooled over runs and tasks (the 25 % trimmed
  mean, as ``scipy.stats.trim_mean(scores, 0.25, axis=None)``): a few lucky or broken runs move it
  less than the mean, and it uses half the data where the median uses one point.
* Probability of improvement P(X > Y): per task, the chance that a score of X beats one of Y
  (ties count 1/2; the Mann-Whitney U over n m), averaged over tasks. It says which arm ends
  higher, never by how much.
* IQM ratio IQM(X) / IQM(Y), each arm's scores pooled over tasks: how much of Y's score X keeps,
  the scale-free size of a difference that a margin (experiments/claims.py) can be set against.
* Gain ratio (IQM(X) / IQM(Y)) / (IQM(CX) / IQM(CY)): X's gain over Y against a control's, CX over
  CY, for a claim that a change helps one layout more than another (an interaction).
* Intervals: percentile intervals of a stratified bootstrap, runs resampled within each task
  (and each arm's runs on their own for P(X > Y) and the ratios), as rliable's
  ``get_interval_estimates`` does. Where k comparisons are read together, each takes a
  ``bonferroni(k)`` interval, so that all k cover their truths at once with 95 % or more.
* Curves: the IQM at each point of a learning curve, one bootstrap draw of whole runs serving
  every point, as rliable's sample-efficiency curves are drawn.

A task's scores are a (runs, members) array: a run is one seed, the only independent unit; its
members are the agents of that seed's swarm, which share the seed's environment streams and
gossip, so the bootstrap resamples whole runs and keeps their agents together. With one member
per run every estimate here is rliable's own (tests/unit/experiments/test_stats.py checks that against it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MIN_RUNS = 3
"""Fewer runs than this in any task give no interval: the bootstrap of 2 runs has 3 outcomes."""

ALPHA = 0.05
"""The error rate of a family of comparisons read together (one claim's, one section's)."""

CHUNK = 2_000
"""Bootstrap draws computed at once (bounds the memory of P(X > Y)'s pairwise comparison)."""


@dataclass(frozen=True)
class Estimate:
    point: float
    low: float | None
    high: float | None
    """None where some task has fewer than MIN_RUNS runs."""

    def clipped(self, bounds: tuple[float, float]) -> Estimate:
        """The interval cut to the range the score can take: a bootstrap percentile interval never
        leaves the data's range, but this keeps every interval the report shows to one rule."""
        if self.low is None:
            return self
        lo, hi = bounds
        return Estimate(self.point, min(max(self.low, lo), hi), max(min(self.high, hi), lo))


def as_tasks(tasks: Sequence) -> list[np.ndarray]:
    """Each task's scores as a float (runs, members) array; a 1-D task is one member per run."""
    out = []
    for k, task in enumerate(tasks):
        scores = np.asarray(task, dtype=float)
        if scores.ndim == 1:
            scores = scores[:, None]
        if scores.ndim != 2 or scores.size == 0:
            raise ValueError(f"task {k}: scores must be a non-empty (runs,) or (runs, members) array: {scores.shape}")
        if np.isnan(scores).any():
            raise ValueError(f"task {k}: scores hold nan; leave unfinished runs out instead")
        out.append(scores)
    if not out:
        raise ValueError("no tasks: give at least one task's scores")
    return out


def iqm(scores) -> float:
    """25 % trimmed mean of all values: int(n / 4) cut from each end, as scipy's trim_mean."""
    return float(_iqm_rows(np.asarray(scores, dtype=float).reshape(1, -1))[0])


def _iqm_rows(values: np.ndarray) -> np.ndarray:
    n = values.shape[1]
    cut = n // 4
    return np.sort(values, axis=1)[:, cut : n - cut].mean(axis=1)


def probability_of_improvement(x_tasks: Sequence, y_tasks: Sequence) -> float:
    """P(X > Y) averaged over tasks; task k of x is compared with task k of y."""
    xs, ys = _paired(x_tasks, y_tasks)
    return float(_improvement_rows([x.reshape(1, -1) for x in xs], [y.reshape(1, -1) for y in ys])[0])


def _improvement_rows(xs: list[np.ndarray], ys: list[np.ndarray]) -> np.ndarray:
    per_task = []
    for x, y in zip(xs, ys):
        a, b = x[:, :, None], y[:, None, :]
        per_task.append(np.mean((a > b) + 0.5 * (a == b), axis=(1, 2)))
    return np.mean(per_task, axis=0)


def _paired(x_tasks: Sequence, y_tasks: Sequence) -> tuple[list[np.ndarray], list[np.ndarray]]:
    xs, ys = as_tasks(x_tasks), as_tasks(y_tasks)
    if len(xs) != len(ys):
        raise ValueError(f"X has {len(xs)} tasks and Y {len(ys)}: P(X > Y) compares them task by task")
    return xs, ys


def iqm_interval(tasks: Sequence, reps: int = 50_000, size: float = 0.95, seed: int = 0) -> Estimate:
    """IQM over all tasks' scores pooled, with its stratified-bootstrap percentile interval."""
    groups = as_tasks(tasks)
    interval = _bootstrap(groups, lambda drawn: _iqm_rows(np.concatenate(drawn, axis=1)), reps, size, seed)
    return _estimate(iqm(np.concatenate([g.ravel() for g in groups])), interval)


def improvement_interval(
    x_tasks: Sequence, y_tasks: Sequence, reps: int = 50_000, size: float = 0.95, seed: int = 0
) -> Estimate:
    """P(X > Y) with its interval: X's and Y's runs resampled independently, each within its task."""
    xs, ys = _paired(x_tasks, y_tasks)
    n = len(xs)
    interval = _bootstrap(xs + ys, lambda drawn: _improvement_rows(drawn[:n], drawn[n:]), reps, size, seed)
    return _estimate(probability_of_improvement(xs, ys), interval)


def ratio_interval(
    x_tasks: Sequence, y_tasks: Sequence, reps: int = 50_000, size: float = 0.95, seed: int = 0
) -> Estimate:
    """IQM(X) / IQM(Y), each arm's scores pooled over its tasks, with its interval: X's and Y's
    runs resampled independently, each within its task. Y's scores must all be above 0, so that
    every draw's IQM of Y is: a ratio to a score of 0 or less does not measure a share of it."""
    xs, ys = _paired(x_tasks, y_tasks)
    if min(float(y.min()) for y in ys) <= 0:
        raise ValueError("IQM(X) / IQM(Y) needs every score of Y above 0; compare such arms by P(X > Y)")
    n = len(xs)

    def ratio(drawn: list[np.ndarray]) -> np.ndarray:
        return _iqm_rows(np.concatenate(drawn[:n], axis=1)) / _iqm_rows(np.concatenate(drawn[n:], axis=1))

    interval = _bootstrap(xs + ys, ratio, reps, size, seed)
    pooled = [np.concatenate([g.ravel() for g in groups]) for groups in (xs, ys)]
    return _estimate(iqm(pooled[0]) / iqm(pooled[1]), interval)


def gain_ratio_interval(
    x_tasks: Sequence,
    y_tasks: Sequence,
    cx_tasks: Sequence,
    cy_tasks: Sequence,
    reps: int = 50_000,
    size: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """(IQM(X) / IQM(Y)) / (IQM(CX) / IQM(CY)), with its interval: how X's gain over Y compares with a
    control's gain, CX over CY (above 1: X gains more). A treatment that helps every arm alike, as a
    better learning rate can, shows in X / Y and in CX / CY both; only what is X's own moves this. Each
    arm's runs are resampled on their own, within each task; Y's, CX's and CY's scores must be above 0."""
    arms = [as_tasks(t) for t in (x_tasks, y_tasks, cx_tasks, cy_tasks)]
    n = len(arms[0])
    if any(len(a) != n for a in arms):
        raise ValueError(f"the arms have {[len(a) for a in arms]} tasks: a gain ratio compares them task by task")
    if min(float(g.min()) for a in arms[1:] for g in a) <= 0:
        raise ValueError("a gain ratio needs every score of Y, CX and CY above 0; compare such arms by P(X > Y)")

    def gain(drawn: list[np.ndarray]) -> np.ndarray:
        x, y, cx, cy = (_iqm_rows(np.concatenate(drawn[k * n : (k + 1) * n], axis=1)) for k in range(4))
        return (x / y) / (cx / cy)

    interval = _bootstrap([g for a in arms for g in a], gain, reps, size, seed)
    x, y, cx, cy = (iqm(np.concatenate([g.ravel() for g in a])) for a in arms)
    return _estimate((x / y) / (cx / cy), interval)


def bonferroni(comparisons: int) -> float:
    """The interval size for each of ``comparisons`` read together: 1 - ALPHA / comparisons."""
    if comparisons < 1:
        raise ValueError(f"comparisons must be at least 1, got {comparisons}")
    return 1 - ALPHA / comparisons


def iqm_curve_interval(
    runs: np.ndarray, reps: int = 2_000, size: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM at every point of a learning curve with its stratified-bootstrap band, as rliable's
    sample-efficiency curves: ``runs`` is (runs, members, points), one draw of whole runs serves
    every point, and a point takes the IQM of the members that reached it (nan: not reached).
    Returns (iqm, low, high), each (points,); the band is nan where fewer than MIN_RUNS runs
    reached the point, and the IQM where none did."""
    runs = np.asarray(runs, dtype=float)
    if runs.ndim != 3 or runs.shape[0] == 0 or runs.shape[1] == 0:
        raise ValueError(f"curves must be a non-empty (runs, members, points) array: {runs.shape}")
    point = _nan_iqm(runs.reshape(1, -1, runs.shape[2]))[0]
    interval = _bootstrap([runs], lambda drawn: _nan_iqm(drawn[0]), reps, size, seed)
    if interval is None:
        return point, np.full_like(point, np.nan), np.full_like(point, np.nan)
    low, high = interval
    reached = np.sum(~np.isnan(runs).all(axis=1), axis=0)
    thin = reached < MIN_RUNS
    return point, np.where(thin, np.nan, low), np.where(thin, np.nan, high)


def _nan_iqm(values: np.ndarray) -> np.ndarray:
    """The 25 % trimmed mean over axis 1 of a (draws, n, points) array, of its non-nan values only."""
    ordered = np.sort(values, axis=1)  # nan sorts last
    count = np.sum(~np.isnan(values), axis=1, keepdims=True)
    rank = np.arange(values.shape[1])[None, :, None]
    kept = (rank >= count // 4) & (rank < count - count // 4)
    with np.errstate(invalid="ignore"):  # a point no member reached: 0 / 0, nan as intended
        return np.where(kept, ordered, 0.0).sum(axis=1) / kept.sum(axis=1)


def _estimate(point: float, interval: tuple[np.ndarray, np.ndarray] | None) -> Estimate:
    return Estimate(point, None, None) if interval is None else Estimate(point, float(interval[0]), float(interval[1]))


def _bootstrap(
    groups: list[np.ndarray],
    statistic: Callable[[list[np.ndarray]], np.ndarray],
    reps: int,
    size: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``statistic`` maps each group's resampled runs, a (draws, runs x members, ...) array per
    group, to a value per draw (or a row of them); the interval is the percentiles (1 -/+ size) / 2
    of those values over the draws. None where a group has fewer than MIN_RUNS runs."""
    if not 0 < size < 1:
        raise ValueError(f"size must be in (0, 1), got {size}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    if min(len(g) for g in groups) < MIN_RUNS:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, reps, CHUNK):
        draws = min(CHUNK, reps - start)
        drawn = [g[rng.integers(0, len(g), (draws, len(g)))].reshape(draws, -1, *g.shape[2:]) for g in groups]
        values.append(statistic(drawn))
    with warnings.catch_warnings():  # a curve's point that no drawn run reached stays nan
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanpercentile(np.concatenate(values), [50 * (1 - size), 50 * (1 + size)], axis=0)
    return low, high
