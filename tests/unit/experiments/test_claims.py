"""experiments/claims.py: a claim's verdict comes from P(X > Y)'s bootstrap interval on the claim's
own axis (above 0.5 supports, below contradicts, holding 0.5 cannot decide), or for a claim with a
margin from the IQM ratio's interval against 1 - margin; a claim's several comparisons are read
with Bonferroni intervals and combined so that a clear loss is never hidden by a missing estimate;
seed counts are counted, not written, and the equal-total-frames gap is explained only where
there is one. The SB3 reference section (experiments/make_results.py) reads P(X > Y) the same way."""

import numpy as np
import pytest

from experiments import claims, make_results, study, swarm_vs_one
from experiments.common import cell_key
from gossiprl.settings import NO_GOSSIP

ONE, RING = "1 agent", "ring of 4"
EQUAL = claims.EQUAL_TOTAL["swarm_vs_one"]
TOTAL = EQUAL.total
BOUNDS = (0.0, 100.0)


def rows(scores: dict[str, list[list[float]]]) -> list[dict]:
    """Cells at 1M frames per agent (the ring's total frames for TOTAL's one agent): setting -> each
    seed's agents' last-100 scores."""
    return [
        {
            "setting": setting,
            "seed": seed,
            "agents": len(per_agent),
            "frames": 4_000_000 if setting == TOTAL else 1_000_000 * len(per_agent),
            "n_steps": 5,
            "num_envs": 16,
            "per_agent_last100": per_agent,
            "consensus_eval": float(np.mean(per_agent)),
            "equal_wall_s": 100.0,
        }
        for setting, seeds in scores.items()
        for seed, per_agent in enumerate(seeds, 1)
    ]


def verdict(scores) -> str:
    (line,) = claims.claim_lines("swarm_vs_one", claims.Arms(None, rows(scores)), BOUNDS, frames_per_agent=True)
    return line


@pytest.mark.parametrize(
    "ring, word",
    [
        ([[7.0, 7.1, 7.2, 7.3]] * 5, "**supports** it"),
        ([[4.0, 4.1, 4.2, 4.3]] * 5, "**contradicts** it"),
        ([[5.5, 6.0, 6.5, 7.0], [4.5, 5.0, 5.5, 6.0], [5.0, 6.5, 6.0, 5.5], [6.5, 5.0, 6.0, 5.5]], "**cannot decide**"),
    ],
)
def test_the_verdict_is_read_off_the_interval_of_p_against_one_half(ring, word):
    line = verdict({ONE: [[5.8], [6.0], [6.2], [5.9], [6.1]], RING: ring})
    assert word in line and f"({len(ring)} and 5 seeds)" in line
    assert "Judged at equal frames per agent" in line


LR = claims.CLAIMS["lr_sweep"]


@pytest.mark.parametrize(
    "one_gain, ring_gain, word",
    [
        (1.3, 1.3, "**cannot decide** it: an interval of the gain ratio holds 1."),  # a rate that helps both alike
        (1.0, 1.5, "**supports** it."),  # the rule's prediction: the ring gains, one agent does not
        (1.5, 1.3, "**contradicts** it."),  # one agent gains more
    ],
)
def test_the_lr_rule_is_judged_by_the_rings_gain_beyond_one_agents(one_gain, ring_gain, word):
    """The square-root rule asks for a larger rate because the ring's mean steps on a larger batch, so
    only a gain beyond one agent's (its control) is evidence for it: the ring's own gain (P = 1.00)
    read "supports" on SpaceInvaders, where one agent gained as much from the same doubling."""
    spread = [0.97, 1.0, 1.03, 0.99, 1.01]
    one = [[60.0 * k] for k in spread]
    ring = [[70.0 * k, 71.0 * k, 69.0 * k, 70.5 * k] for k in spread]
    scores = {
        LR.control[1]: one,
        LR.control[0]: [[v * one_gain for v in seed] for seed in one],
        LR.than[0]: ring,
        LR.better: [[v * ring_gain for v in seed] for seed in ring],
    }
    (line,) = claims.claim_lines("lr_sweep", claims.Arms(None, rows(scores)), BOUNDS, frames_per_agent=True)
    assert line.endswith(f"This data {word}") and f"control {LR.control[0]}" in line
    assert f"gain ratio ({LR.better} / {LR.than[0]}) / ({LR.control[0]} / {LR.control[1]}) = " in line


def test_lr_sweeps_gain_ratios_at_4x_are_listed_beside_its_claim_without_a_verdict():
    spread = [0.97, 1.0, 1.03, 0.99, 1.01]
    base = {"1 agent": 6.0, "ring of 4": 6.5}
    gain = {("1 agent", "lr 7e-4"): 1.0, ("1 agent", "lr 1.4e-3"): 1.5, ("1 agent", "lr 2.8e-3"): 2.0}
    gain |= {("ring of 4", "lr 7e-4"): 1.0, ("ring of 4", "lr 1.4e-3"): 1.5, ("ring of 4", "lr 2.8e-3"): 3.0}
    scores = {
        f"{layout}, {rate}": [[base[layout] * g * k] * (4 if layout == "ring of 4" else 1) for k in spread]
        for (layout, rate), g in gain.items()
    }
    arms = claims.Arms(None, rows(scores))
    lines = claims.gain_lines("lr_sweep", arms)  # comparison_lines ends with these
    four = "- Gain ratio (ring of 4, lr 2.8e-3 / ring of 4, lr 7e-4) / (1 agent, lr 2.8e-3 / 1 agent, lr 7e-4)"
    (line,) = [x for x in lines if x.startswith(four)]
    assert "at equal frames per agent: 1.50 [" in line and line.endswith("(above 1).")  # the ring 3x, one agent 2x
    assert sum(x.startswith("- Gain ratio") for x in lines) == 2
    assert claims.gain_lines("lr_sweep", arms, stale=("ring of 4, lr 2.8e-3",)) == []


def test_too_few_seeds_or_a_missing_arm_decide_nothing():
    assert "fewer than 3 seeds" in verdict({ONE: [[5.8], [6.0]], RING: [[7.0, 7.1, 7.2, 7.3]] * 2})
    assert "Not tested here: no finished cell of ring of 4" in verdict({ONE: [[5.8], [6.0], [6.2]]})


def test_no_verdict_is_read_off_cells_that_ran_under_other_settings():
    one = [[5.8], [6.0], [6.2], [5.9], [6.1]]
    ring = [[7.0, 7.2, 7.4, 7.6]] * 5  # a clear gain, had the ring's cells answered today's question
    arms = claims.Arms(None, rows({ONE: one, RING: ring}))
    assert "**supports** it" in claims.claim_lines("swarm_vs_one", arms, BOUNDS, frames_per_agent=True)[0]
    (line,) = claims.claim_lines("swarm_vs_one", arms, BOUNDS, frames_per_agent=True, stale=(RING, "another arm"))
    assert f"**cannot decide** it: the cells of {RING} ran under other settings" in line and "P(" not in line
    (pair,) = claims.comparison_lines("swarm_vs_one", arms, [ONE, RING], frames_per_agent=True, stale=(RING,))
    assert pair.endswith(f"not compared, the cells of {RING} are older runs (above).") and "1.00" not in pair


def test_the_equal_total_gap_is_explained_by_steps_only_where_there_is_one():
    one = [[5.8], [6.0], [6.2], [5.9], [6.1]]
    ring = [[6.0, 6.2, 6.4, 6.6]] * 5
    far = claims.equal_total_lines(
        "swarm_vs_one", claims.Arms(None, rows({EQUAL.one: one, EQUAL.swarm: ring, TOTAL: [[16.0]] * 5})), BOUNDS
    )
    assert "outside that arm's interval" in far[0] and len(far) == 2
    assert f"took 12,500 steps of 320 transitions, as many as {EQUAL.one} (12,500 steps of 80" in far[1]
    assert f"{TOTAL} took 50,000 steps of 80" in far[1]
    # the swarm and the agent set beside the total are the arms with its rate, not the claim's defaults
    assert far[0].startswith(f"- At equal total frames (4M): {EQUAL.swarm} 6.30") and (EQUAL.swarm, EQUAL.one) != (
        RING,
        ONE,
    )
    near = claims.equal_total_lines(
        "swarm_vs_one",
        claims.Arms(None, rows({EQUAL.one: one, EQUAL.swarm: ring, TOTAL: [[6.0], [6.5], [6.2], [6.8], [6.3]]})),
        BOUNDS,
    )
    assert "inside that arm's interval" in near[0] and len(near) == 1
    assert (
        "not measured here"
        in claims.equal_total_lines("swarm_vs_one", claims.Arms(None, rows({EQUAL.one: one})), BOUNDS)[0]
    )


def test_the_equal_total_comparison_sets_no_older_run_against_todays():
    one, ring, total = [[5.8], [6.0], [6.2], [5.9], [6.1]], [[6.0, 6.2, 6.4, 6.6]] * 5, [[16.0]] * 5
    arms = claims.Arms(None, rows({EQUAL.one: one, EQUAL.swarm: ring, TOTAL: total}))
    (line,) = claims.equal_total_lines("swarm_vs_one", arms, BOUNDS, stale=(TOTAL,))
    assert line == f"- At equal total frames: not compared, the cells of {TOTAL} are older runs (above)."
    every = claims.equal_total_lines("swarm_vs_one", arms, BOUNDS, stale=(TOTAL, EQUAL.one, EQUAL.swarm))
    assert "outside that arm's interval" in every[0]


def test_a_study_with_no_recorded_claim_gets_no_verdict_rather_than_an_error():
    arms = claims.Arms(None, rows({ONE: [[5.8], [6.0], [6.2]]}))
    assert "no verdict" in claims.claim_lines("a_study_without_a_claim", arms, BOUNDS, frames_per_agent=True)[0]
    assert claims.comparison_lines("a_study_without_a_claim", arms, [ONE], frames_per_agent=True) == []


def test_a_wall_clock_claim_leaves_out_seeds_with_no_score_by_then(tmp_path):
    # the layout claim is judged at equal wall-clock T = 10 s: the spread cell logged its first score
    # at 20 s, so it has none at T and the claim is not tested, rather than judged on nothing
    layout = claims.CLAIMS["layout"]
    (tmp_path / "curves").mkdir()
    cells = []
    for setting, first in ((layout.better, 20.0), (layout.than[0], 5.0)):
        cells.append({"setting": setting, "seed": 1, "agents": 1, "equal_wall_s": 10.0})
        (tmp_path / "curves" / f"{cell_key(setting, 1)}.csv").write_text(
            f"agent,frames,wall_s,mean_return_100,wait_s,mix_s\n0,100,{first},1.0,0,0\n0,200,30.0,2.0,0,0\n"
        )
    arms = claims.Arms(tmp_path, cells)
    assert arms.scores(layout.better, "wall_s").shape == (0, 0) and arms.scores(layout.than[0], "wall_s").shape == (
        1,
        1,
    )
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    assert f"Not tested here: no finished cell of {layout.better} has a score there" in line


ORDERING = claims.CLAIMS["ordering_ablation"]
SYNC = [[3.0], [4.0], [5.0], [6.0], [7.0], [8.0]]


def ordering(scores: dict[str, list[list[float]]]) -> str:
    (line,) = claims.claim_lines("ordering_ablation", claims.Arms(None, rows(scores)), BOUNDS, frames_per_agent=False)
    return line


def shifted(seeds: list[list[float]], by: float) -> list[list[float]]:
    return [[v + by for v in agents] for agents in seeds]


def test_several_comparisons_take_bonferroni_intervals():
    # each async arm 2.5 below sync: P(sync > arm) = 0.83, 95 % interval [0.56, 1.00], 98.75 % interval
    # [0.44, 1.00]: one interval size serves both verdicts, conservatively for 'supports' (see claims.py)
    line = ordering({ORDERING.better: SYNC, **{arm: shifted(SYNC, -2.5) for arm in ORDERING.than}})
    assert "98.75 % intervals (Bonferroni: 95 % over 4 comparisons)" in line
    assert "= 0.83 [0.44, 1.00]" in line
    assert "**cannot decide** it: an interval of P holds 0.5." in line
    assert "98.75 %" not in verdict({ONE: [[5.8], [6.0], [6.2]], RING: [[7.0, 7.1, 7.2, 7.3]] * 3})


@pytest.mark.parametrize(
    "others",
    [
        # every other arm run, one with too few seeds for an interval
        {"async, max-staleness 4": shifted(SYNC[:2], -5.0), "async, unbounded": SYNC, "none (independent)": SYNC},
        {},  # the other arms not run at all
    ],
)
def test_a_clear_loss_is_not_hidden_by_another_comparisons_missing_estimate(others):
    lost = shifted(SYNC, 10.0)  # every sync agent below every one of this arm: P = 0 [0, 0]
    line = ordering({ORDERING.better: SYNC, "async, max-staleness 1": lost, **others})
    assert "P(sync (turn locks) > async, max-staleness 1) = 0.00 [0.00, 0.00]" in line
    assert line.endswith("This data **contradicts** it.")


def test_supports_only_if_every_comparison_does_else_it_says_every_reason():
    ahead = {arm: shifted(SYNC, -5.0) for arm in ORDERING.than}
    assert ordering({ORDERING.better: SYNC, **ahead}).endswith("This data **supports** it.")
    short = {**ahead, "async, unbounded": shifted(SYNC[:2], -5.0), "async, max-staleness 4": SYNC}
    del short["none (independent)"]
    line = ordering({ORDERING.better: SYNC, **short})
    assert "none (independent): no finished cell has a score there" in line
    assert line.endswith(
        "This data **cannot decide** it: an interval of P holds 0.5; fewer than 3 seeds in an arm give no "
        "interval; an arm has no finished cell with a score there."
    )


LAYOUT = claims.CLAIMS["layout"]


def layout_arms(tmp_path, scores: dict[str, list[float]], windows: dict | None = None) -> claims.Arms:
    """Layout cells of one agent each whose only score, logged at 5 s, is their score at T = 10 s (and
    at the end); ``windows``: setting -> each seed's window of machine load, (window, sessions) for a
    resumed cell (none recorded where not given)."""
    (tmp_path / "curves").mkdir(exist_ok=True)
    cells = []
    for setting, seeds in scores.items():
        for seed, score in enumerate(seeds, 1):
            cell = {"setting": setting, "seed": seed, "agents": 1, "equal_wall_s": 10.0, "per_agent_last100": [score]}
            window = (windows or {}).get(setting, [None] * len(seeds))[seed - 1]
            window, sessions = window if isinstance(window, tuple) else (window, 1)
            cells.append({**cell, "consensus_eval": score, "window": window, "sessions": sessions})
            (tmp_path / "curves" / f"{cell_key(setting, seed)}.csv").write_text(
                f"agent,frames,wall_s,mean_return_100,wait_s,mix_s\n0,100,5.0,{score},0,0\n"
            )
    return claims.Arms(tmp_path, cells)


def layout(tmp_path, spread: list[float], one_host: list[float]) -> str:
    """The layout claim's line, its arms run in one window of machine load."""
    windows = {LAYOUT.better: ["A"] * len(spread), LAYOUT.than[0]: ["A"] * len(one_host)}
    arms = layout_arms(tmp_path, {LAYOUT.better: spread, LAYOUT.than[0]: one_host}, windows)
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    return line


ONE_HOST = [1.00, 1.01, 1.00, 1.01, 1.00]


@pytest.mark.parametrize(
    "spread, ratio, word",
    [
        # every spread seed below every one-host seed, so P(X > Y) = 0 would contradict "costs
        # little"; it keeps 95 % of the score, inside the margin
        ([0.95, 0.96, 0.95, 0.96, 0.95], "0.95 [0.94, 0.96]", "**supports** it."),
        ([0.50, 0.51, 0.50, 0.51, 0.50], "0.50 [0.50, 0.51]", "**contradicts** it."),
        (
            [0.70, 1.10, 0.80, 1.20, 0.90],
            "0.93 [0.73, 1.16]",
            "**cannot decide** it: an interval of the ratio holds 0.90.",
        ),
    ],
)
def test_a_costs_little_claim_is_judged_by_the_iqm_ratio_against_its_margin(tmp_path, spread, ratio, word):
    assert LAYOUT.margin == 0.10 and LAYOUT.why_margin
    line = layout(tmp_path, spread, ONE_HOST)
    assert "margin of 10 %: the data supports the claim where the ratio's whole interval lies above 0.90" in line
    assert f"Why 10 %: {LAYOUT.why_margin}." in line
    assert f"IQM ratio {LAYOUT.better} / {LAYOUT.than[0]} = {ratio}" in line and "P(" not in line
    assert line.endswith(word)


def test_a_ratio_to_a_score_of_zero_decides_nothing(tmp_path):
    line = layout(tmp_path, [0.95, 0.96, 0.95], [1.0, 0.0, 1.0])
    assert "has a score of 0 or less, which a ratio cannot take" in line
    assert line.endswith("**cannot decide** it: an arm has a score of 0 or less, which a ratio cannot take.")


def test_the_sb3_reference_is_read_by_p_with_bonferroni_intervals_not_by_overlap():
    one = np.arange(3.0, 15.0)[:, None]  # 12 seeds, IQM 8.50 [5.83, 11.17]
    scores = {
        "gossiprl, 1 agent (swarm_vs_one)": one + 100,  # at MinAtar's rate: not SB3 A2C's, so not compared
        f"gossiprl, {swarm_vs_one.ONE_ATARI} (swarm_vs_one)": one,
        "SB3 A2C": one - 4.5,  # IQM 4.00 [1.33, 6.67]: the 95 % intervals overlap, yet P is above 0.5
        "SB3 PPO": one,
        "SB3 DQN": one[:2],
        "SB3 long": one,
    }
    frames = {name: 5_000_000 if name == "SB3 long" else 1_000_000 for name in scores}
    lines = make_results.reference_lines(["SB3 A2C", "SB3 PPO", "SB3 DQN", "SB3 long"], scores, frames)
    assert "98.33 % intervals (Bonferroni: 95 % over 3 comparisons)" in lines[0]
    assert "- P(gossiprl's one agent > SB3 A2C) = 0.81 [0.56, 0.97]: gossiprl's one agent ends higher." in lines
    assert "- P(gossiprl's one agent > SB3 PPO) = 0.50 [0.22, 0.78]: this data cannot tell them apart" in " ".join(
        lines
    )
    assert "(gossiprl's one agent has 12, SB3 DQN 2; 3 needed)" in " ".join(lines)
    assert "- SB3 long ran 5,000,000 frames, gossiprl's one agent 1,000,000: not compared." in lines
    assert not any("overlap" in line and "not read" not in line for line in lines)


def test_gossiprls_ppo_is_read_against_sb3s_ppo_at_the_same_frames():
    seeds = np.arange(5.0, 6.0, 0.2)[:, None]  # 5 seeds
    frames = {make_results.GOSSIPRL_PPO: 1_000_000, "SB3 PPO": 1_000_000}
    level = make_results.same_algorithm_lines({make_results.GOSSIPRL_PPO: seeds, "SB3 PPO": seeds}, frames)
    assert "P(gossiprl's PPO > SB3 PPO) = 0.50 [" in level[0] and "cannot tell them apart" in level[0]
    ahead = make_results.same_algorithm_lines({make_results.GOSSIPRL_PPO: seeds + 1, "SB3 PPO": seeds}, frames)
    assert "P(gossiprl's PPO > SB3 PPO) = 1.00 [1.00, 1.00]" in ahead[0] and "gossiprl's PPO ends higher" in ahead[0]
    one_seed = make_results.same_algorithm_lines({make_results.GOSSIPRL_PPO: seeds, "SB3 PPO": seeds[:1]}, frames)
    assert "too few seeds for an interval (gossiprl's PPO has 5, SB3 PPO 1; 3 needed)" in one_seed[0]
    longer = {**frames, "SB3 PPO": 5_000_000}
    (line, _) = make_results.same_algorithm_lines({make_results.GOSSIPRL_PPO: seeds, "SB3 PPO": seeds}, longer)
    assert line == "- SB3 PPO ran 5,000,000 frames, gossiprl's PPO 1,000,000: not compared."


def test_a_study_whose_cells_gossiped_over_two_planes_says_which_ran_where():
    """Sync cells now run over shared memory and reuse broker-plane runs: the same per frame, not in
    wall-clock. Rows from before the plane was recorded gossiped through the broker, if at all."""
    rows = [
        {"setting": "ring", "seed": 1, "gossip_share": 0.3, "mix_s": 9.0},
        {"setting": "ring", "seed": 2, "gossip_share": 0.3, "mix_s": 9.0, "data_plane": "shm"},
        {"setting": "1 agent", "seed": 1, "gossip_share": 0.0001, "mix_s": 0.0},  # timing the empty hook
        {"setting": "none", "seed": 2, "gossip_share": 0.0001, "mix_s": 0.0, "data_plane": None},
    ]
    (_, line) = make_results.plane_lines(rows)
    assert "(over broker: ring seed 1; over shm: ring seed 2)" in line and "1 agent" not in line and "none" not in line
    assert make_results.plane_lines(rows[1:]) == []


def test_the_equal_wall_clock_is_set_by_todays_cells_not_by_older_shorter_ones(tmp_path):
    """A study part-way through a 10x budget had T = 11 s from its older cells: earlier than a 1M-frame
    cell's first point, so today's cells had no score there."""
    (tmp_path / "curves").mkdir()
    ends = {"today": 600.0, "older": 11.0}
    for setting, end in ends.items():
        with open(tmp_path / "curves" / f"{cell_key(setting, 1)}.csv", "w") as f:
            f.write("agent,frames,wall_s,mean_return_100,wait_s,mix_s\n")
            f.write(f"0,1000,{end / 2},1.0,0,0\n0,2000,{end},2.0,0,0\n")
    rows = [{"setting": setting, "seed": 1, "agents": 1} for setting in ends]
    study.add_equal_wall_score(tmp_path, rows, older={cell_key("older", 1)})
    assert [r["equal_wall_s"] for r in rows] == [600.0, 600.0] and rows[0]["score_at_equal_wall"] == 2.0
    study.add_equal_wall_score(tmp_path, rows)
    assert rows[0]["equal_wall_s"] == 11.0 and rows[0]["score_at_equal_wall"] is None


SPREAD = [0.95, 0.96, 0.95, 0.96, 0.95]


def test_wall_clock_is_compared_only_on_seeds_whose_cells_ran_in_one_window(tmp_path):
    """A cell reused from another study's window (the shared cell cache), run in another call of the
    study, or resumed, ran under other load: the arms' wall-clock compares on the seeds whose cells of
    both ran in one window, and per frame on every seed."""
    windows = {
        LAYOUT.better: ["A", "A", ("A", 2), "B", "B"],  # seed 3 resumed: two sessions, two loads
        LAYOUT.than[0]: ["A", "A", "A", "C", None],  # seed 5 reused from a run that recorded no window
    }
    arms = layout_arms(tmp_path, {LAYOUT.better: SPREAD, LAYOUT.than[0]: ONE_HOST}, windows)
    assert arms.same_window_seeds(LAYOUT.better, LAYOUT.than[0]) == [1, 2]
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    assert "IQM ratio" in line and "(2 and 2 seeds; on seeds 1, 2, whose cells ran in one window)" in line
    (compared,) = claims.comparison_lines("layout", arms, list(windows), frames_per_agent=False)
    assert "at equal frames for the whole swarm 0.00 [0.00, 0.00] (lower);" in compared  # every seed
    assert "at equal wall-clock (10 s of training) 0.00 (no interval: fewer than" in compared
    assert "on seeds 1, 2, whose cells ran in one window)" in compared


def test_arms_that_share_no_window_are_not_compared_in_wall_clock_and_decide_no_time_claim(tmp_path):
    windows = {LAYOUT.better: ["A"] * 5, LAYOUT.than[0]: [None] * 5}  # the one-host arm reused from elsewhere
    arms = layout_arms(tmp_path, {LAYOUT.better: SPREAD, LAYOUT.than[0]: ONE_HOST}, windows)
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    assert f"{LAYOUT.than[0]}: not compared (no seed has cells of both that ran in one window of machine load)" in line
    assert line.endswith(
        "**cannot decide** it: no seed has cells of the claim's arm and of another that ran in one window of "
        "machine load."
    )
    (compared,) = claims.comparison_lines("layout", arms, list(windows), frames_per_agent=False)
    assert "at equal wall-clock (10 s of training) not compared (no seed has cells of both" in compared


def test_cells_that_record_no_window_are_described_in_wall_clock_but_decide_nothing(tmp_path):
    """Cells run before windows were recorded compared in wall-clock as if they shared one: RESULTS.md
    printed "(lower)" for the SpaceInvaders ordering study's sync cells, run a day before its async
    ones, which its own note called void. Their wall-clock is now shown and not read, a resumed cell
    is left out of it, and a time claim on them decides nothing."""
    windows = {LAYOUT.better: [None, None, (None, 2), None, None], LAYOUT.than[0]: [None] * 5}
    arms = layout_arms(tmp_path, {LAYOUT.better: SPREAD, LAYOUT.than[0]: ONE_HOST}, windows)
    assert not arms.windows_recorded(LAYOUT.better, LAYOUT.than[0])
    assert arms.same_window_seeds(LAYOUT.better, LAYOUT.than[0]) == [1, 2, 4, 5]
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    assert "(4 and 4 seeds; on seeds 1, 2, 4, 5, whose cells each ran in one session)" in line
    assert claims.UNRECORDED in line and "**supports**" not in line
    assert line.endswith(
        "**cannot decide** it: the cells record no window of machine load, so their wall-clock is not read."
    )
    (compared,) = claims.comparison_lines("layout", arms, list(windows), frames_per_agent=False)
    assert "at equal frames for the whole swarm 0.00 [0.00, 0.00] (lower);" in compared  # per frame: read
    assert (
        f"at equal wall-clock (10 s of training) 0.00 [0.00, 0.00] ({claims.UNRECORDED}; on seeds 1, 2, 4, 5"
        in compared
    )


def test_unrecorded_cells_all_resumed_are_said_to_be_resumed_not_of_other_windows(tmp_path):
    windows = {LAYOUT.better: [(None, 2)] * 5, LAYOUT.than[0]: [None] * 5}
    arms = layout_arms(tmp_path, {LAYOUT.better: SPREAD, LAYOUT.than[0]: ONE_HOST}, windows)
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    assert f"not compared ({claims.ALL_RESUMED})" in line and claims.NO_WINDOW not in line
    assert line.endswith(
        "**cannot decide** it: no seed has cells of the claim's arm and of another that each ran in one session."
    )
    (compared,) = claims.comparison_lines("layout", arms, list(windows), frames_per_agent=False)
    assert f"at equal wall-clock (10 s of training) not compared ({claims.ALL_RESUMED})" in compared


def test_a_claim_arm_with_no_score_by_then_on_the_shared_window_seeds_is_not_run_there(tmp_path):
    """The claim's own arm has scores at T on other seeds, but not on the one seed whose cells share a
    window with the other arm's: not tested there (it raised AttributeError on a missing estimate)."""
    windows = {LAYOUT.better: ["A", "B", "B", "B", "B"], LAYOUT.than[0]: ["A", "C", "C", "C", "C"]}
    arms = layout_arms(tmp_path, {LAYOUT.better: SPREAD, LAYOUT.than[0]: ONE_HOST}, windows)
    (tmp_path / "curves" / f"{cell_key(LAYOUT.better, 1)}.csv").write_text(
        "agent,frames,wall_s,mean_return_100,wait_s,mix_s\n0,100,20.0,0.9,0,0\n"  # its first score after T
    )
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    assert f"{LAYOUT.than[0]}: no cell of {LAYOUT.better} on the seeds compared has a score there" in line
    assert line.endswith("**cannot decide** it: an arm has no finished cell with a score there.")


def test_seeds_one_arm_never_ran_are_not_called_other_windows(tmp_path):
    windows = {LAYOUT.better: ["A", "A", "A"], LAYOUT.than[0]: ["A", "A", "A", "A", "A"]}
    arms = layout_arms(tmp_path, {LAYOUT.better: SPREAD[:3], LAYOUT.than[0]: ONE_HOST}, windows)
    assert arms.same_window_seeds(LAYOUT.better, LAYOUT.than[0]) == [1, 2, 3]
    (line,) = claims.claim_lines("layout", arms, BOUNDS, frames_per_agent=False)
    assert "(3 and 3 seeds)" in line and "whose cells ran in one window" not in line


def test_the_topology_claim_sets_every_graph_beside_independent_agents_of_its_size():
    """The claim read the ring of 4 alone; it is about every graph, and the issue's question is at 8
    agents: each graph at each size is judged against independent agents of that size."""
    from experiments import topology_ablation

    cells, settings = topology_ablation.build(False, 1_000_000, [1])
    pairs = set(claims.CLAIMS["topology_ablation"].pairs)
    independent = {c.agents: c.setting for c in cells if c.swarm.topology == NO_GOSSIP}
    graphs = {(c.setting, c.agents) for c in cells if c.swarm.topology != NO_GOSSIP}
    assert {(x, independent[n]) for x, n in graphs} <= pairs
    assert {x for pair in pairs for x in pair} <= set(settings)


def test_the_scaling_claim_is_judged_at_every_swarm_size_not_at_one():
    """It was judged at 4 agents against one, the swarm_vs_one study's comparison again; the claim is
    about 2 to 16 agents, so every size is set against one agent, with Bonferroni over all four."""
    claim = claims.CLAIMS["scaling"]
    one = [[3.0], [4.0], [5.0], [6.0], [7.0], [8.0]]
    rings = {f"{n} agents, ring": [[v + 5.0] * n for (v,) in one] for n in (2, 4, 8, 16)}

    def judged(scores) -> str:
        (line,) = claims.claim_lines("scaling", claims.Arms(None, rows(scores)), BOUNDS, frames_per_agent=True)
        return line

    assert claim.pairs == [(ring, "1 agent (plain A2C)") for ring in rings]
    line = judged({"1 agent (plain A2C)": one, **rings})
    assert "98.75 % intervals (Bonferroni: 95 % over 4 comparisons)" in line
    assert line.endswith("This data **supports** it.")
    behind = {**rings, "8 agents, ring": [[v - 10.0] * 8 for (v,) in one]}  # 4 agents as far ahead as before
    assert judged({"1 agent (plain A2C)": one, **behind}).endswith("This data **contradicts** it.")
    unrun = {k: v for k, v in rings.items() if k != "16 agents, ring"}
    line = judged({"1 agent (plain A2C)": one, **unrun})
    assert "16 agents, ring against 1 agent (plain A2C): no cell of 16 agents, ring has a score there" in line
    assert line.endswith("an arm has no finished cell with a score there.")


def test_cells_of_a_batched_game_from_before_the_batch_say_they_stepped_minatars_loop():
    """SpaceInvaders cells from before its batch cost more CPU a frame: their frames/s are not today's."""
    si = "MinAtar/SpaceInvaders-v1"
    rows = [
        {"setting": "ring", "seed": 1, "window": None, "finished_at": "2026-11-29T22:39:00Z"},  # scored only
        {"setting": "ring", "seed": 2, "window": "2026-11-29T03:00:00Z", "finished_at": "2026-11-29T03:15:00Z"},
        {"setting": "ring", "seed": 3, "window": "2026-11-28T23:59:00Z", "finished_at": "2026-11-29T04:00:00Z"},
    ]
    (_, line) = make_results.game_loop_lines(rows, si)
    assert line.startswith("**MinAtar's own loop.** Ring (seeds 1, 3) stepped") and "2" not in line.split("stepped")[0]
    one = make_results.game_loop_lines([*rows, {**rows[0], "setting": "1 agent", "seed": 4}], si)[1]
    assert one.startswith("**MinAtar's own loop.** Ring (seeds 1, 3); 1 agent (seed 4) stepped")
    assert "All its cells stepped" in make_results.game_loop_lines(rows[:1], si)[1]
    assert make_results.game_loop_lines(rows[1:2], si) == []
    assert make_results.game_loop_lines(rows, "MinAtar/Breakout-v1") == []  # stepped as it always was
