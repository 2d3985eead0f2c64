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

    cells, _ = swarm_vs_one.build(False, 1_000_000, [1, 2])
    assert len(run_now(cells, None, None)) == 6
    short = run_now(cells, None, 1_000_000)  # the ring's agents get 1M each; the 4M agent waits
    assert {c.setting for c in short} == {"1 agent", "ring of 4"} and len(short) == 4
    assert {c.setting for c in run_now(cells, 1, None)} == {"1 agent", swarm_vs_one.EQUAL_TOTAL}
    assert {c.setting for c in run_now(cells, 1, 1_000_000)} == {"1 agent"}
