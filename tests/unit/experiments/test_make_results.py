"""RESULTS.md's budget paragraph is read from the studies' own records, so it cannot go stale as a
study's budget changes."""

import json

from experiments import make_results
from experiments.common import cell_fingerprint


def write_study(results, folder, frames_per_cell, per_agent):
    """``per_agent`` as study.json has it: True, or for a whole-swarm budget None (studies written
    before the key existed: the key is left out), False or null."""
    (results / folder).mkdir(parents=True)
    meta = {"frames_per_cell": frames_per_cell, **({} if per_agent is None else {"frames_per_agent": per_agent})}
    (results / folder / "study.json").write_text(json.dumps(meta))


def test_the_budget_paragraph_names_each_studys_frames_and_flags_only_the_small_whole_swarm_ones(tmp_path):
    (tmp_path / "_shared").mkdir()
    for i, (frames, wall_s) in enumerate([(4_000_000, 800.0), (100_000, 40.0)]):
        (tmp_path / "_shared" / f"{i}.json").write_text(json.dumps({"frames": frames, "wall_s": wall_s}))
    write_study(tmp_path, "scaling", 1_000_000, per_agent=True)
    write_study(tmp_path, "ordering_ablation", 1_000_000, per_agent=True)
    write_study(tmp_path, "batch_period", 100_000, per_agent=None)
    write_study(tmp_path, "layout", 100_000, per_agent=False)

    text = make_results.budget_lines(tmp_path)[0]

    assert "2 runs, 4.1 M frames in 14 min of wall-clock, 4881 frames/s" in text
    assert (
        "1,000,000 for each agent in ordering_ablation and scaling; 100,000 for the whole swarm in batch_period "
        "and layout." in text
    )
    assert "The whole-swarm budgets of batch_period and layout were chosen from a short probe" in text


def test_without_a_whole_swarm_budget_no_early_training_caveat_is_given(tmp_path):
    (tmp_path / "_shared").mkdir()
    (tmp_path / "_shared" / "0.json").write_text(json.dumps({"frames": 1_000_000, "wall_s": 100.0}))
    write_study(tmp_path, "scaling", 1_000_000, per_agent=True)

    text = make_results.budget_lines(tmp_path)[0]

    assert "1,000,000 for each agent in scaling." in text
    assert "early-training" not in text


def test_an_older_run_standing_in_for_a_cell_does_not_count_it_finished(tmp_path):
    """A 16-agent cell run at 100k frames for the whole swarm is shown as it ran, but the study's 1M
    frames per agent are still to run there: "N of M cells finished" counts it with the missing."""
    from experiments import scaling
    from experiments.common import older_keys

    env = "MinAtar/Breakout-v1"
    cells, _ = scaling.build(False, 1_000_000, [1])
    (tmp_path / "cells").mkdir()
    one, older_ring = cells[0], cells[-1]
    for cell, fingerprint in ((one, cell_fingerprint(one, env, 10)), (older_ring, "an older loop's")):
        row = {"setting": cell.setting, "seed": 1, "eval_episodes": 10, "fingerprint": fingerprint}
        (tmp_path / "cells" / f"{cell.key}.json").write_text(json.dumps(row))

    older = older_keys(tmp_path, cells, env)

    assert older == {older_ring.key}
    assert make_results.cells_done(tmp_path, cells, older) == {one.key}


def test_the_across_games_summary_reads_lr_confirm_beside_swarm_vs_one(tmp_path):
    """The finding MinAtar's default rests on (lr_confirm, on two games) belongs in the across-games
    summary; a dir named like a study but holding another is not read as it."""
    from experiments import lr_confirm

    cells, _ = lr_confirm.build(False, 1_000_000, [6, 7, 8, 9])
    for folder, env, study in (
        ("lr_confirm", "MinAtar/Breakout-v1", "lr_confirm"),
        ("lr_confirm_spaceinvaders", "MinAtar/SpaceInvaders-v1", "lr_confirm"),
        ("lr_confirm_other", "MinAtar/Asterix-v1", "lr_sweep"),
    ):
        (tmp_path / folder / "cells").mkdir(parents=True)
        meta = {"study": study, "env": env, "quick": False, "frames_per_cell": 1_000_000, "seeds": [6, 7, 8, 9]}
        (tmp_path / folder / "study.json").write_text(json.dumps(meta))
        for cell in cells:
            ring = cell.agents > 1
            row = {
                "setting": cell.setting,
                "seed": cell.seed,
                "per_agent_last100": [10.0 if ring else 1.0] * cell.agents,
                "fingerprint": cell_fingerprint(cell, env, 10),
                "eval_episodes": 10,
            }
            (tmp_path / folder / "cells" / f"{cell.key}.json").write_text(json.dumps(row))

    (tmp_path / "swarm_vs_one" / "cells").mkdir(parents=True)  # a study's dir with no study.json yet
    (text,) = [line for line in make_results.across_games_lines(tmp_path) if line.startswith("Probability")]

    assert (
        "P(ring of 4, lr 2.8e-3 > 1 agent, lr 2.8e-3) over MinAtar/Breakout-v1, MinAtar/SpaceInvaders-v1 = "
        "1.00 [1.00, 1.00]" in text
    )
    ring = next(c for c in cells if c.agents > 1 and c.seed == 6)  # an older run of another plan is not read
    path = tmp_path / "lr_confirm_spaceinvaders" / "cells" / f"{ring.key}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "fingerprint": "older", "per_agent_last100": [0.0]}))
    (text,) = [line for line in make_results.across_games_lines(tmp_path) if line.startswith("Probability")]
    assert "= 1.00 [1.00, 1.00]" in text


def test_settings_whose_cells_other_studies_hold_are_named_as_one_finding():
    """The topology study's ring and independent agents at 4 are the ordering study's sync and
    independent arms: RESULTS.md names such settings, and only where every cell is shared."""
    rows = [
        {"setting": "ring", "seed": 1, "fingerprint": "a"},
        {"setting": "ring", "seed": 2, "fingerprint": "b"},
        {"setting": "full", "seed": 1, "fingerprint": "c"},
        {"setting": "full", "seed": 2, "fingerprint": "d"},
    ]
    elsewhere = {"a": {"ordering", "scaling"}, "b": {"ordering"}, "c": {"ordering"}}

    (_, line) = make_results.shared_lines(rows, ["ring", "full"], elsewhere)

    assert "too: ring (ordering). A comparison" in line and "full" not in line
    assert make_results.shared_lines(rows, ["full"], elsewhere) == []


def test_equal_wall_clock_iqms_say_when_their_cells_ran_under_other_loads(tmp_path):
    """Listed side by side, IQMs at equal wall-clock read as a comparison; where the cells ran under
    other loads (or recorded none), the list says so, as the claims that refuse to read them do."""
    from experiments import claims
    from experiments.common import cell_key

    (tmp_path / "curves").mkdir()
    rows = []
    for setting in ("a", "b"):
        for seed in (1, 2, 3):
            lines = ["agent,frames,wall_s,mean_return_100,wait_s,mix_s", "0,500,5,1,0,0", "0,1000,10,2,0,0"]
            (tmp_path / "curves" / f"{cell_key(setting, seed)}.csv").write_text("\n".join(lines) + "\n")
            rows.append(
                {"setting": setting, "seed": seed, "agents": 1, "per_agent_last100": [2.0], "equal_wall_s": 10.0}
            )

    def wall_line(windows) -> str:
        for row, window in zip(rows, windows):
            row["window"] = window
        arms = claims.Arms(tmp_path, rows)
        return make_results.iqm_lines(arms, ["a", "b"], (0.0, 100.0), frames_per_agent=True)[1]

    assert wall_line(["w1"] * 6).endswith("(3 seed(s)).")
    assert "different machine loads" in wall_line(["w1"] * 3 + ["w2"] * 3)
    assert "record no window of machine load" in wall_line([None] * 6)
