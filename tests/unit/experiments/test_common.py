"""Where a study writes when it is not told: never into the committed experiments/results/."""

import tempfile
from pathlib import Path

from experiments.common import fresh_out
from experiments.study import RESULTS


def test_a_run_without_out_gets_a_fresh_directory_outside_the_committed_results():
    quick, first = fresh_out("scaling", quick=True), fresh_out("scaling", quick=True)
    assert quick != first and quick.name == "scaling"
    # its shared cell cache (<out>/../_shared) is a fresh temporary directory's too
    assert quick.parent.is_dir() and quick.parent.parent == Path(tempfile.gettempdir())
    real = fresh_out("scaling", quick=False)
    assert real.parent.name == "runs" and real.name.startswith("scaling-") and not real.exists()
    for out in (quick, real):
        assert RESULTS.resolve() not in out.resolve().parents


def test_a_window_too_short_for_every_cell_runs_the_small_and_short_ones_and_plans_the_rest():
    from experiments import swarm_vs_one
    from experiments.study import run_now

    one, ring, lr2 = {"1 agent", swarm_vs_one.ONE_LR2}, {"ring of 4", swarm_vs_one.RING_LR2}, swarm_vs_one.RING_LR2
    cells, _ = swarm_vs_one.build(False, 1_000_000, [1, 2])
    assert len(run_now(cells, None, None)) == 10
    short = run_now(cells, None, 1_000_000)  # the ring's agents get 1M each; the 4M agent waits
    assert {c.setting for c in short} == one | ring and len(short) == 8
    assert {c.setting for c in run_now(cells, 1, None)} == one | {swarm_vs_one.EQUAL_TOTAL}
    assert {c.setting for c in run_now(cells, 1, 1_000_000)} == one
    assert {c.a2c.lr for c in cells if c.setting == lr2} == {2 * swarm_vs_one.LR}
    assert {(c.setting, c.seed) for c in run_now(cells, None, None, (lr2,))} == {(lr2, 1), (lr2, 2)}


def test_only_an_unknown_setting_is_refused_naming_the_studys_settings(tmp_path):
    from click.testing import CliRunner

    from experiments import swarm_vs_one

    result = CliRunner().invoke(swarm_vs_one.main, ["--only", "ring of 5", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "swarm_vs_one has no setting 'ring of 5'; its settings: 1 agent; ring of 4;" in result.output
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_recorded_command_is_quoted_and_plans_the_whole_study():
    from experiments.study import rerun_command

    command = rerun_command("learners", False, "MinAtar/Breakout-v1", 1_000_000, "1,2", None, Path("out dir"))
    expected = "python -m experiments.learners --env MinAtar/Breakout-v1 --frames 1000000 --seeds 1,2 --out 'out dir'"
    assert command == expected
