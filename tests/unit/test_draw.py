"""plot_runs on hand-made metrics, so the learning curves are checked without training anything."""

import csv
import json

import numpy as np
import pytest

from gossiprl.draw import _mean_curve, plot_runs
from gossiprl.rl.agent import METRIC_COLUMNS


def write_metrics(agent_dir, rows):
    agent_dir.mkdir(parents=True, exist_ok=True)
    with open(agent_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, METRIC_COLUMNS)
        writer.writeheader()
        for frames, wall_s, ret in rows:
            writer.writerow(
                {
                    "frames": frames,
                    "wall_s": wall_s,
                    "updates": frames // 80,
                    "episodic_return": "" if ret is None else ret,
                    "mean_return_100": "" if ret is None else ret,
                }
            )


def test_plot_runs_writes_a_png(tmp_path):
    gala = tmp_path / "gala"
    write_metrics(gala / "agent-0", [(800, 1.0, None), (1600, 2.0, 15.0), (2400, 3.0, 20.0), (3200, 4.0, 30.0)])
    # agent-1 logs at other frames and was resumed from 1200 after logging up to 2000
    write_metrics(gala / "agent-1", [(1200, 1.5, 12.0), (2000, 2.5, 99.0), (1600, 2.1, 16.0), (2800, 3.5, 26.0)])
    (gala / "config.json").write_text(
        json.dumps(
            {"swarm": {"agents": 2, "topology": "ring", "mode": "async"}, "agent": {}, "topology": {"name": "ring"}}
        )
    )
    single = tmp_path / "a2c"
    write_metrics(single / "agent-0", [(800, 0.5, 10.0), (1600, 1.0, 14.0)])
    out = tmp_path / "curves.png"
    plot_runs([gala, single], out, smooth=2)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_agents_logged_at_different_frames_are_averaged_where_all_reached():
    a = np.array([[0, 0, 0.0], [10, 1, 10.0], [20, 2, 20.0]])
    b = np.array([[5, 0, 0.0], [15, 1, 0.0], [30, 3, 0.0]])
    x, y = _mean_curve([a, b], 0, smooth=1, scale=2)
    assert x.tolist() == [10, 20, 30, 40]  # frames 5..20, charged for both agents
    assert y.tolist() == [2.5, 5.0, 7.5, 10.0]


def test_plot_runs_without_metrics_names_the_run(tmp_path):
    (tmp_path / "empty" / "agent-0").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="metrics.csv") as err:
        plot_runs([tmp_path / "empty"], tmp_path / "x.png")
    assert str(tmp_path / "empty") in str(err.value)
    assert not (tmp_path / "x.png").exists()
