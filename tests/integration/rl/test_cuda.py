"""Swarms that train on a CUDA GPU, end to end through `gossiprl run` and `gossiprl eval`.

Skipped where torch sees no GPU, as on CI. The same runs, on MinAtar Breakout, were made on a lent
H200 (README, "On a GPU"); these are their short CartPole form, for any host that has one.
"""

import csv

import pytest
import torch

from helpers import invoke

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch on this host"),
    pytest.mark.timeout(180),
]


def _ring_of_2(run_dir, *options) -> None:
    """A CartPole ring of 2 on the GPU, 4,000 frames in all."""
    result = invoke(
        "run",
        *("--agents", 2, "--topology", "ring", "--total-frames", 4000, "--device", "cuda", "--seed", 7),
        *("--log-every", 5, "--run-dir", run_dir, "--no-progress", "--stop-at-return", "none"),
        *options,
    )
    assert result.exit_code == 0, result.output
    model = torch.load(run_dir / "agent-0" / "checkpoint.pt")["model"]  # saved where it trained
    assert all(t.is_cuda for t in model.values()), "agent-0 did not train on the GPU"
    rows = list(csv.DictReader((run_dir / "agent-0" / "metrics.csv").open()))
    assert any(float(row["gossip/peers"]) == 1.0 for row in rows), f"{options}: no letter was ever mixed"


def test_a_sync_ring_on_a_gpu_learns_bitwise_the_same_over_every_data_plane(tmp_path):
    """A CUDA letter leaves the device (through a pinned buffer to the broker or a peer, straight into
    the segment over shm) and comes back onto it: where its bytes travel still must not change what a
    sync swarm learns."""
    params = {}
    for plane in ("broker", "shm", "direct"):
        _ring_of_2(tmp_path / plane, "--data-plane", plane)
        params[plane] = [torch.load(tmp_path / plane / f"agent-{r}" / "checkpoint.pt")["model"] for r in range(2)]
    for plane in ("shm", "direct"):
        for rank, (through_broker, other) in enumerate(zip(params["broker"], params[plane])):
            assert all(torch.equal(through_broker[k], other[k]) for k in through_broker), f"agent-{rank} over {plane}"


@pytest.mark.parametrize(
    "options",
    [
        ("--mode", "async", "--max-staleness", 1),  # unbounded, agent-0 may be done before agent-1's first letter
        ("--gossip-overlap", "--data-plane", "shm"),
        ("--codec", "bf16"),
        ("--algo", "ppo"),
        ("--algo", "impala", "--actors-per-agent", 2),
    ],
    ids=["async", "overlapped", "bf16", "ppo", "impala"],
)
def test_every_mode_and_learner_trains_on_a_gpu_and_its_policies_play_there(tmp_path, options):
    _ring_of_2(tmp_path / "run", *options)
    result = invoke("eval", tmp_path / "run", "--device", "cuda", "--episodes", 2)
    assert result.exit_code == 0, result.output
    assert "consensus (mean of the 2 agents' parameters)" in result.output
