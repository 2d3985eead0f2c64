"""Fixtures only the integration tests use: they start brokers on real sockets."""

import time

import pytest

import topologies
from brokers import close_broker, new_broker
from gossiprl import Broker
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
    each swarm started costs a loaded two-core CI machine tens of seconds.

    The launcher's broker thread stops for 2 s as the first agent registers, as it does when the
    launcher's process pauses (a garbage collection of a big heap took 0.3 s in this test runner,
    and over 0.75 s under load): agents took 0.75 s of silence for a dead broker, and CI failed."""
    run_dir = tmp_path_factory.mktemp("swarm") / "run"
    on_hello, paused = Broker._on_hello, []

    def paused_hello(self, *args):
        if not paused:
            paused.append(time.sleep(2))
        return on_hello(self, *args)

    try:
        import wandb  # noqa: F401

        track = ["--track", "--wandb-project", "gossiprl-test"]
    except ImportError:
        track = []
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        env.setattr(Broker, "_on_hello", paused_hello)
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
    assert paused and result.exit_code == 0, result.output
    (run_dir.parent / "output.txt").write_text(result.output)  # what the run printed, for tests of its end lines
    return run_dir
