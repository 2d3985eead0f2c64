"""experiments/claims.py: a claim's verdict comes from P(X > Y)'s bootstrap interval on the claim's
own axis (above 0.5 supports, below contradicts, holding 0.5 cannot decide), seed counts are
counted, not written, and the equal-total-frames gap is explained only where there is one."""

import numpy as np
import pytest

from experiments import claims
from experiments.common import cell_key

ONE, RING, TOTAL = "1 agent", "ring of 4", claims.EQUAL_TOTAL["swarm_vs_one"]
BOUNDS = (0.0, 100.0)


def rows(scores: dict[str, list[list[float]]]) -> list[dict]:
    """Cells of swarm_vs_one at 1M frames per agent: setting -> each seed's agents' last-100 scores."""
    agents = {ONE: 1, RING: 4, TOTAL: 1}
    frames = {ONE: 1_000_000, RING: 4_000_000, TOTAL: 4_000_000}
    return [
        {
            "setting": setting,
            "seed": seed,
            "agents": agents[setting],
            "frames": frames[setting],
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


def test_too_few_seeds_or_a_missing_arm_decide_nothing():
    assert "fewer than 3 seeds" in verdict({ONE: [[5.8], [6.0]], RING: [[7.0, 7.1, 7.2, 7.3]] * 2})
    assert "Not tested here: no finished cell of ring of 4" in verdict({ONE: [[5.8], [6.0], [6.2]]})


def test_a_claim_the_data_cannot_test_on_its_axis_says_why():
    scaling = claims.CLAIMS["scaling"]
    arms = claims.Arms(None, [{"setting": scaling.better, "equal_wall_s": 11.0}])
    (line,) = claims.claim_lines("scaling", arms, BOUNDS, frames_per_agent=False)
    assert "at equal wall-clock (11 s of training)" in line and "**cannot decide** it: the per-second" in line


def test_the_equal_total_gap_is_explained_by_steps_only_where_there_is_one():
    one = [[5.8], [6.0], [6.2], [5.9], [6.1]]
    ring = [[6.0, 6.2, 6.4, 6.6]] * 5
    far = claims.equal_total_lines(
        "swarm_vs_one", claims.Arms(None, rows({ONE: one, RING: ring, TOTAL: [[16.0]] * 5})), BOUNDS
    )
    assert "outside that arm's interval" in far[0] and len(far) == 2
    assert "took 12,500 steps of 320 transitions, as many as 1 agent (12,500 steps of 80" in far[1]
    assert "1 agent, the ring's total frames took 50,000 steps of 80" in far[1]
    near = claims.equal_total_lines(
        "swarm_vs_one",
        claims.Arms(None, rows({ONE: one, RING: ring, TOTAL: [[6.0], [6.5], [6.2], [6.8], [6.3]]})),
        BOUNDS,
    )
    assert "inside that arm's interval" in near[0] and len(near) == 1
    assert (
        "not measured here" in claims.equal_total_lines("swarm_vs_one", claims.Arms(None, rows({ONE: one})), BOUNDS)[0]
    )


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
