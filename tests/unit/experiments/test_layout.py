"""The layout study's spread arm starts its agents as `gossiprl agent` commands: they must learn with
the settings the cell's fingerprint names, not the command's own defaults."""

import contextlib
import json
from dataclasses import asdict

import pytest


@pytest.mark.parametrize("env", ["MinAtar/Breakout-v1", "CartPole-v1"])
def test_a_spread_cells_agents_learn_with_the_settings_its_fingerprint_names(tmp_path, monkeypatch, env):
    """MinAtar's default rate moved to 2.8e-3 and the studies keep 1.4e-3: the spread arm's agents,
    given no --lr, ran at the new default while the cell was named, and its one-host arm ran, at 1.4e-3."""
    from experiments import layout
    from experiments.common import Cell, cell_a2c, learner_settings
    from gossiprl import cli, config
    from gossiprl.launch import SwarmConfig
    from gossiprl.rl.learners import resolved
    from gossiprl.settings import AgentConfig

    started = []

    class Started:
        returncode = 0

        def __init__(self, args, **kwargs):
            started.append(args)

        def communicate(self, timeout=None):
            return (json.dumps({"frames": 0}), None)

        def poll(self):
            return 0

    monkeypatch.setattr(layout.subprocess, "Popen", Started)
    monkeypatch.setattr(layout, "_sh", lambda *args, **kwargs: None)
    monkeypatch.setattr(layout.shutil, "copy", lambda *args: None)
    hosts = dict.fromkeys(("broker", "a", "b"), "ns")
    monkeypatch.setattr(layout, "namespaces", contextlib.contextmanager(lambda: (yield hosts)))
    cell = Cell(layout.SPREAD, 1, 4, 40_000, SwarmConfig(agents=4, topology="ring", transport="tcp"))
    cfg = AgentConfig(env_id=env, seed=1, total_frames=10_000, a2c=cell_a2c(cell, env), agents_per_host=4)
    layout.run_spread(cell, cfg, tmp_path / "run")

    (argv, *_) = [args for args in started if "agent" in args]
    flags = argv[argv.index("agent") + 1 :]
    keys = {"--curve-secret", "--curve-broker"}  # files the stubbed key generation did not write
    flags = [f for i, f in enumerate(flags) if f not in keys and (i == 0 or flags[i - 1] not in keys)]
    ctx = cli.agent.make_context("agent", flags)
    ran = cli.AGENT_SETTINGS.build(AgentConfig, config.file_values(ctx, cli.AGENT_SETTINGS, None))
    assert asdict(resolved(ran).a2c) == asdict(learner_settings(cell, env))
