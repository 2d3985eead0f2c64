"""Fixtures only the integration tests use: they start brokers on real sockets."""

import pytest

import topologies
from brokers import close_broker, new_broker
from helpers import invoke


@pytest.fixture
def ring2():
    """A started two-agent ring broker on tcp://127.0.0.1:0; closing it must not hang."""
    broker = new_broker(topologies.make("ring", 2))
    yield broker
    assert close_broker(broker), "broker.close() hung"


@pytest.fixture(scope="session")
def swarm_run(tmp_path_factory):
    """One real two-agent CartPole ring run through `gossiprl run`, finished, mirrored to an offline W&B run when
    wandb is installed. Shared by every test that only reads what such a run leaves (test_cli, test_swarmlog):
    each swarm started costs a loaded two-core CI machine tens of seconds."""
    run_dir = tmp_path_factory.mktemp("swarm") / "run"
    try:
        import wandb  # noqa: F401

        track = ["--track", "--wandb-project", "gossiprl-test"]
    except ImportError:
        track = []
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        result = invoke(
            "run",
            "--agents",
            2,
            "--topology",
            "ring",
            "--total-frames",
            40000,
            "--run-dir",
            run_dir,
            "--no-progress",
            "--stop-at-return",
            "none",
            "--torch-threads",
            1,
            *track,
        )
    assert result.exit_code == 0, result.output
    (run_dir.parent / "output.txt").write_text(result.output)  # what the run printed, for tests of its end lines
    return run_dir
