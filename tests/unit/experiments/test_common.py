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
