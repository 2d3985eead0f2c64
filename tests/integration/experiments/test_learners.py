"""The learners study's --quick runs each learner end to end through the real launcher."""

import json

import pytest
from click.testing import CliRunner

from experiments import learners
from experiments.common import cell_key


@pytest.mark.timeout(300)
def test_learners_quick_runs_a2c_ppo_and_impala_and_each_curve_has_points(tmp_path):
    out = tmp_path / "learners"
    result = CliRunner().invoke(
        learners.main, ["--quick", "--seeds", "1", "--frames", "6000", "--out", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    rows = {json.loads(p.read_text())["setting"]: json.loads(p.read_text()) for p in (out / "cells").glob("*.json")}
    assert set(rows) == {"A2C, 1 agent", "PPO, 1 agent", "IMPALA, 1 agent"}
    assert {row["algo"] for row in rows.values()} == {"a2c", "ppo", "impala"}
    for setting, row in rows.items():
        assert row["frames"] >= 6000, setting
        points = (out / "curves" / f"{cell_key(setting, 1)}.csv").read_text()
        assert len(points.splitlines()) > 3, setting
