"""Table 1's arms are the cells other studies already run, so the shared cache serves them instead
of a second run; and RESULTS.md's Table 1 section reads them from there and names what is missing."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from experiments import learners, make_results, swarm_vs_one, table1
from experiments.common import QUICK_ENV, REAL_ENV, cell_fingerprint

SAME_RUN = {
    "A2C, 1 agent": (swarm_vs_one, "1 agent"),
    "PALA-A2C, sync ring of 4": (swarm_vs_one, "ring of 4"),
    "PPO, 1 agent": (learners, "PPO, 1 agent"),
    "IMPALA, 1 agent": (learners, "IMPALA, 1 agent"),
}
"""Written out here rather than read from table1.SOURCES, so a change of that mapping fails here."""


def fingerprints(study, quick: bool, frames: int, seeds: list[int], env: str, episodes: int) -> dict:
    cells, _ = study.build(quick, frames, seeds)
    return {(c.setting, c.seed): cell_fingerprint(c, env, episodes) for c in cells}


@pytest.mark.parametrize(
    ("quick", "frames", "env", "episodes"), [(False, 1_000_000, REAL_ENV, 10), (True, 8_000, QUICK_ENV, 3)]
)
def test_every_arm_another_study_runs_has_that_studys_fingerprint(quick, frames, env, episodes):
    seeds = [1, 2, 3, 4, 5]
    mine = fingerprints(table1, quick, frames, seeds, env, episodes)
    assert {setting for setting, _ in mine} == {*SAME_RUN, table1.GALA}
    for setting, (study, theirs) in SAME_RUN.items():
        other = fingerprints(study, quick, frames, seeds, env, episodes)
        assert [mine[setting, s] for s in seeds] == [other[theirs, s] for s in seeds], setting
    every_other = {
        fp for study in (swarm_vs_one, learners) for fp in fingerprints(study, quick, frames, seeds, env, episodes)
    }
    assert not {mine[table1.GALA, s] for s in seeds} & every_other


def test_lr_confirm_runs_the_sweeps_4x_arms_on_seeds_no_other_study_runs():
    """A confirmation on the seeds whose comparison suggested it would test nothing: its default seeds
    are 6-10; on a seed both plan, its cells are the sweep's (the same runs, run once)."""
    from experiments import claims, lr_confirm, lr_sweep
    from experiments.study import Study

    assert lr_confirm.STUDY.real_seeds == "6,7,8,9,10" and Study.real_seeds == "1,2,3,4,5"
    claim = claims.CLAIMS["lr_confirm"]
    assert {claim.better, *claim.than} == set(lr_confirm.SETTINGS) <= set(lr_sweep.SETTINGS)
    mine = fingerprints(lr_confirm, False, 1_000_000, [6, 1], REAL_ENV, 10)
    theirs = fingerprints(lr_sweep, False, 1_000_000, [1], REAL_ENV, 10)
    assert all(mine[s, 1] == theirs[s, 1] for s in lr_confirm.SETTINGS)
    assert not {mine[s, 6] for s in lr_confirm.SETTINGS} & set(theirs.values())


def test_the_learners_a2c_arms_are_swarm_vs_ones_cells():
    """learners' A2C cells named the default learner ({"algo": "a2c"}), so their fingerprint was
    another than swarm_vs_one's identical runs, and each ran twice (about 20 minutes a cell)."""
    seeds = [1, 2, 3, 4, 5]
    mine = fingerprints(learners, False, 1_000_000, seeds, REAL_ENV, 10)
    theirs = fingerprints(swarm_vs_one, False, 1_000_000, seeds, REAL_ENV, 10)
    for setting, same in (("A2C, 1 agent", "1 agent"), ("A2C, ring of 4", "ring of 4")):
        assert [mine[setting, s] for s in seeds] == [theirs[same, s] for s in seeds], setting


def test_gala_is_palas_ring_in_async_mode_with_nothing_else_changed():
    cells, _ = table1.build(False, 1_000_000, [1])
    pala, gala = (next(c for c in cells if c.setting == s) for s in (table1.PALA, table1.GALA))
    assert (pala.swarm.mode, gala.swarm.mode, gala.swarm.max_staleness) == ("sync", "async", None)
    assert {k for k, v in asdict(gala.swarm).items() if asdict(pala.swarm)[k] != v} == {"mode"}
    assert (gala.agent, gala.a2c, gala.total_frames, gala.agents) == (pala.agent, pala.a2c, 4_000_000, 4)


def test_run_all_runs_the_command_results_md_plans_on_each_game():
    run_all = (Path(table1.__file__).parent / "run_all.sh").read_text().replace("\\\n    ", "")
    assert table1.COMMAND.replace("python -m experiments.", "run ") in run_all.splitlines()
    for env in table1.GAMES:
        assert table1.command_for(env).replace("python -m experiments.", "run ") in run_all.splitlines(), env


def test_a_second_games_table1_reads_that_games_cells_and_plans_its_own_dir(tmp_path):
    """SpaceInvaders' Table 1 is read from that game's cells alone (its A2C arms are swarm_vs_one's
    there), and names the command that runs the rest into its own dir."""
    env = "MinAtar/SpaceInvaders-v1"
    shared = tmp_path / "_shared"
    shared.mkdir()
    cells, _ = table1.build(False, table1.FRAMES, table1.SEEDS)
    for game, score in ((env, 50.0), (REAL_ENV, 5.0)):
        for cell in (c for c in cells if c.setting == "A2C, 1 agent"):
            row = {"setting": "1 agent", "seed": cell.seed, "per_agent_last100": [score]}
            (shared / f"{cell_fingerprint(cell, game, 10)}.json").write_text(json.dumps(row))
    text = "\n".join(make_results.table1_section(tmp_path, env))
    assert text.startswith(f"## {table1.STUDY.title}: {env}")
    assert "| A2C, 1 agent | 1 | 1,000,000 | 5 | 50.00" in text
    assert "--out experiments/results/table1_spaceinvaders`" in text and f"--env {env}" in text


def test_table1_section_reads_cells_from_the_shared_cache_and_names_the_missing_ones(tmp_path):
    """No table1 dir at all: the A2C cells another study ran are found by fingerprint in _shared."""
    shared = tmp_path / "_shared"
    shared.mkdir()
    cells, _ = table1.build(False, table1.FRAMES, table1.SEEDS)
    for cell in (c for c in cells if c.setting == "A2C, 1 agent"):
        row = {"setting": "1 agent", "seed": cell.seed, "per_agent_last100": [float(cell.seed)]}
        (shared / f"{cell_fingerprint(cell, REAL_ENV, 10)}.json").write_text(json.dumps(row))
    text = "\n".join(make_results.table1_section(tmp_path))
    # IQM of 1..5: the middle three, 3.00; the bootstrap's interval stays within the scores
    assert "| A2C, 1 agent | 1 | 1,000,000 | 5 | 3.00 [" in text
    assert "5 of 25 cells finished; 5 of them are runs other studies hold too (the shared cell cache: the" in text
    assert "; 5 read from the shared cell cache, not yet copied into the study's directory)" in text
    assert f"| {table1.GALA} | 4 | 1,000,000 | 0 | not run |" in text
    assert f"{table1.GALA} seed(s) 1, 2, 3, 4, 5" in text and f"They run with `{table1.COMMAND}`" in text
    assert "| AC(λ), published" in text and "about 9-10" in text and "| untrained policy |" in text


def test_table1_section_with_no_cell_anywhere_says_not_run_and_how_to_run_it(tmp_path):
    text = "\n".join(make_results.table1_section(tmp_path))
    assert "**Not run**" in text and f"`{table1.COMMAND}` runs it" in text and "| not run |" not in text


def test_table1_compares_each_gossiping_arm_with_one_agent_and_gala_with_pala():
    """By P(X > Y) at equal frames per agent, Bonferroni over the pairs it can read; an arm with too
    few seeds gets no interval, and a pair with an arm not run is left out."""

    def rows(setting, agents, scores):
        return [{"setting": setting, "seed": s, "per_agent_last100": [x] * agents} for s, x in enumerate(scores, 1)]

    one = rows(table1.ONE, 1, [5.0, 5.5, 6.0, 6.5, 7.0])
    gala = rows(table1.GALA, 4, [9.0, 9.5, 10.0, 10.5, 11.0])
    pala = rows(table1.PALA, 4, [5.2, 5.7, 6.2, 6.7, 7.2])
    text = "\n".join(make_results.table1_comparisons(one + gala + pala))
    assert "98.33 % intervals (Bonferroni: 95 % over 3 comparisons)" in text
    assert f"P({table1.GALA} > {table1.ONE}) = 1.00 [1.00, 1.00]: {table1.GALA} ends higher" in text
    assert f"P({table1.GALA} > {table1.PALA}) = 1.00 [1.00, 1.00]: {table1.GALA} ends higher" in text
    assert f"P({table1.PALA} > {table1.ONE}) = 0.60" in text and "cannot tell them apart" in text
    two = "\n".join(make_results.table1_comparisons(one + gala[:2]))
    assert "95 % intervals:" in two and table1.PALA not in two
    assert f"P({table1.GALA} > {table1.ONE}) = 1.00: too few seeds for an interval" in two
    assert make_results.table1_comparisons(one) == []
