"""experiments/stats.py against rliable, the library whose estimators it reimplements.

REFERENCE was computed with rliable 1.2.0 (arch 7.2.0, numpy 2.4.6) in a venv of its own, from
the X and Y below (runs x tasks): ``metrics.aggregate_iqm`` and ``metrics.probability_of_improvement``
for the points, ``library.get_interval_estimates(..., reps=50000)`` (percentile method, its default)
for the intervals, after ``np.random.seed(0)`` (rliable draws its indices from numpy's global
generator). Point estimates must match exactly; our bootstrap draws other indices, so an endpoint
may differ from rliable's by its Monte Carlo error: with seed 1 rliable's own lower end of Y's IQM
moved one step of its bootstrap distribution (5.333 to 5.317), and a P(X > Y) step is 1/60, so
TOLERANCE allows about one to three steps. Errors it catches, tried: a bootstrap that resamples
(run, task) rows together instead of each task's runs on their own puts X's interval at
[6.20, 8.92]; the 'basic' method instead of 'percentile' at [6.00, 8.05].
"""

import numpy as np
import pytest

from experiments import stats

X = np.array([[3.1, 10.0], [4.0, 12.5], [2.2, 9.0], [5.5, 15.0], [4.0, 11.0]])
Y = np.array([[2.0, 9.0], [4.0, 12.5], [3.3, 8.0], [1.5, 10.0], [2.8, 7.5], [4.0, 9.5]])
X_TASKS, Y_TASKS = list(X.T), list(Y.T)  # ours: a list of tasks, each its runs' scores

REFERENCE = {
    "iqm_x": (7.25, (6.45, 8.5)),
    "iqm_y": (5.966666666666666, (5.333333333333333, 6.666666666666667)),
    "improvement": (0.7416666666666667, (0.5166666666666667, 0.925)),
}
"""name: (rliable's point estimate, its 95 % interval (low, high) with seed 0)."""
TOLERANCE = {"iqm_x": 0.05, "iqm_y": 0.05, "improvement": 0.02}


def ours() -> dict[str, stats.Estimate]:
    return {
        "iqm_x": stats.iqm_interval(X_TASKS),
        "iqm_y": stats.iqm_interval(Y_TASKS),
        "improvement": stats.improvement_interval(X_TASKS, Y_TASKS),
    }


def test_point_estimates_are_rliables():
    assert stats.iqm(X) == pytest.approx(REFERENCE["iqm_x"][0], abs=1e-12)
    assert stats.iqm(Y) == pytest.approx(REFERENCE["iqm_y"][0], abs=1e-12)
    assert stats.probability_of_improvement(X_TASKS, Y_TASKS) == pytest.approx(REFERENCE["improvement"][0], abs=1e-12)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_intervals_match_rliables_within_monte_carlo_error(name):
    estimate = ours()[name]
    point, (low, high) = REFERENCE[name]
    assert estimate.point == pytest.approx(point, abs=1e-12)
    assert estimate.low == pytest.approx(low, abs=TOLERANCE[name])
    assert estimate.high == pytest.approx(high, abs=TOLERANCE[name])


def test_improvement_counts_ties_as_half_and_averages_over_tasks():
    assert stats.probability_of_improvement([[1.0, 2.0]], [[1.0, 2.0]]) == 0.5
    assert stats.probability_of_improvement([[3.0, 4.0], [0.0]], [[1.0, 2.0], [5.0]]) == 0.5  # (1 + 0) / 2
    assert stats.probability_of_improvement([[2.0]], [[1.0, 2.0, 3.0]]) == pytest.approx(0.5)  # (1 + 1/2 + 0) / 3


def test_iqm_trims_a_quarter_from_each_end_as_scipy_does():
    assert stats.iqm([1.0, 2.0, 3.0]) == 2.0  # int(3 / 4) = 0 cut: the plain mean
    assert stats.iqm([0.0, 1.0, 2.0, 100.0]) == 1.5  # one cut from each end
    assert stats.iqm(np.arange(10.0)) == pytest.approx(np.mean(np.arange(2.0, 8.0)))  # int(10 / 4) = 2


def test_bootstrap_keeps_a_runs_agents_together():
    # every run (seed) holds the same four agents' scores: resampling whole runs always draws the same
    # pool, so the interval is a point; resampling agents one by one would spread it over [0, 9]
    runs = np.tile([0.0, 3.0, 6.0, 9.0], (5, 1))
    estimate = stats.iqm_interval([runs], reps=2_000)
    assert estimate.low == estimate.high == estimate.point == 4.5
    assert stats.improvement_interval([runs], [runs], reps=2_000).low == 0.5


def test_iqm_ratio_pools_each_arm_and_resamples_the_arms_on_their_own():
    estimate = stats.ratio_interval(X_TASKS, Y_TASKS)
    assert estimate.point == pytest.approx(REFERENCE["iqm_x"][0] / REFERENCE["iqm_y"][0], abs=1e-12)
    assert estimate.low < estimate.point < estimate.high
    # each arm's runs all hold the same scores: every draw has IQM 5 over 2.5
    exact = stats.ratio_interval([np.tile([2.0, 4.0, 6.0, 8.0], (4, 1))], [np.tile([1.0, 2.0, 3.0, 4.0], (3, 1))])
    assert exact.point == exact.low == exact.high == 2.0
    with pytest.raises(ValueError, match="every score of Y above 0"):
        stats.ratio_interval([[1.0, 2.0, 3.0]], [[1.0, 0.0, 3.0]])


def test_the_gain_ratio_is_xs_gain_over_y_against_the_controls_gain():
    """lr_sweep's claim was read off the ring's gain alone (P = 1.00: "supports"), while one agent, for
    which the rule predicts none, gained as much: only a gain beyond the control's is the ring's own."""
    rng = np.random.default_rng(3)
    y, cy = rng.uniform(4.0, 6.0, (5, 4)), rng.uniform(4.0, 6.0, (5, 1))
    alike = stats.gain_ratio_interval([1.5 * y], [y], [1.5 * cy], [cy])  # both gain 1.5x: no gain of its own
    assert alike.point == pytest.approx(1.0) and alike.low < 1.0 < alike.high
    own = stats.gain_ratio_interval([3.0 * y], [y], [cy], [cy])
    assert own.point == pytest.approx(3.0) and own.low > 1.0
    x = 2.0 * y
    pooled = [stats.iqm(a) for a in (x, y, 1.5 * cy, cy)]
    assert stats.gain_ratio_interval([x], [y], [1.5 * cy], [cy]).point == pytest.approx(
        (pooled[0] / pooled[1]) / (pooled[2] / pooled[3])
    )
    # each arm's runs all hold the same scores: every draw's gain ratio is (8/4) / (3/2)
    same = [np.tile(v, (3, 1)) for v in ([8.0], [4.0], [3.0], [2.0])]
    exact = stats.gain_ratio_interval(*([s] for s in same))
    assert exact.point == exact.low == exact.high == pytest.approx(4 / 3)
    with pytest.raises(ValueError, match="every score of Y, CX and CY above 0"):
        stats.gain_ratio_interval([[1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0]], [[0.0, 1.0, 2.0]], [[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="task by task"):
        stats.gain_ratio_interval([[1.0]], [[1.0], [2.0]], [[1.0]], [[1.0]])


def test_bonferroni_widens_each_of_k_intervals_to_1_minus_alpha_over_k():
    assert stats.bonferroni(1) == 0.95 and stats.bonferroni(4) == pytest.approx(0.9875)
    wide, narrow = (stats.improvement_interval(X_TASKS, Y_TASKS, size=stats.bonferroni(k)) for k in (4, 1))
    assert wide.low < narrow.low and wide.high >= narrow.high
    with pytest.raises(ValueError, match="comparisons must be at least 1"):
        stats.bonferroni(0)


def test_too_few_runs_give_no_interval_and_clipping_keeps_it_in_range():
    estimate = stats.iqm_interval([[1.0, 2.0]])
    assert estimate.point == 1.5 and estimate.low is None and estimate.clipped((0.0, 1.0)).low is None
    clipped = stats.Estimate(0.2, -0.3, 0.9).clipped((0.0, 0.5))
    assert (clipped.low, clipped.high) == (0.0, 0.5)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="X has 2 tasks and Y 1"):
        stats.probability_of_improvement([[1.0], [2.0]], [[1.0]])
    with pytest.raises(ValueError, match="nan"):
        stats.iqm_interval([[1.0, np.nan, 2.0]])
    with pytest.raises(ValueError, match="non-empty"):
        stats.iqm_interval([[]])
    with pytest.raises(ValueError, match="size must be in"):
        stats.iqm_interval([[1.0, 2.0, 3.0]], size=95)


def test_score_bounds_are_only_the_ends_the_envs_rules_fix():
    """The highest score a run reached was taken for the top of the range, so a t-interval reaching past
    the best seed was cut to it (swarm_vs_one: 17.34 [12.21, 22.00], its upper end 22.47 by the data):
    an end the env's rules leave open stays open."""
    import math

    from experiments.common import score_bounds

    assert score_bounds("CartPole-v1")[0] == (0.0, 500.0)
    (low, high), said = score_bounds("MinAtar/Breakout-v1")
    assert (low, high) == (0.0, math.inf) and "no MinAtar reward being negative" in said
    assert score_bounds("ALE/Pong-v5")[0] == (-math.inf, math.inf)


def test_untrained_score_pools_every_episode_of_every_seed(tmp_path):
    from experiments.untrained import untrained_score

    path = tmp_path / "untrained.csv"
    path.write_text(
        "env,seed,episodes,mean,std,returns\n"
        'CartPole-v1,1,2,10.0,0.0,"[10.0, 10.0]"\n'
        'CartPole-v1,2,2,25.0,5.0,"[20.0, 30.0]"\n'
        'MinAtar/Breakout-v1,1,2,1.0,0.0,"[1.0, 1.0]"\n'
    )
    score = untrained_score("CartPole-v1", path)
    assert score == {"mean": 17.5, "low": 10.0, "high": 25.0, "seeds": 2, "episodes": 2}
    assert untrained_score("MinAtar/SpaceInvaders-v1", path) is None


def test_curve_band_is_each_points_own_interval_and_skips_points_a_run_never_reached():
    # a curve of three points per (run, agent); one draw of whole runs serves every point, so each
    # point's band is exactly iqm_interval of that point alone with the same seed and draws
    rng = np.random.default_rng(3)
    curves = rng.normal(5.0, 2.0, (5, 4, 3))
    point, low, high = stats.iqm_curve_interval(curves, reps=3_000)
    for k in range(3):
        alone = stats.iqm_interval([curves[:, :, k]], reps=3_000)
        assert (point[k], low[k], high[k]) == pytest.approx((alone.point, alone.low, alone.high), abs=1e-12)
    # past the end of three of five runs only two reached the point: the IQM of theirs, no band
    curves[2:, :, 2] = np.nan
    point, low, high = stats.iqm_curve_interval(curves, reps=500)
    assert point[2] == pytest.approx(stats.iqm(curves[:2, :, 2])) and np.isnan(low[2]) and np.isnan(high[2])
    assert not np.isnan(low[:2]).any()
    point, low, high = stats.iqm_curve_interval(curves[:2])  # two seeds in all: no band anywhere
    assert point[0] == pytest.approx(stats.iqm(curves[:2, :, 0])) and np.isnan(low).all() and np.isnan(high).all()
    with pytest.raises(ValueError, match="runs, members, points"):
        stats.iqm_curve_interval(np.zeros((3, 4)))
