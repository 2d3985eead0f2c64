"""MinAtar, the CPU-scale Atari stand-in: its ids build a vector env, get the MinAtar paper's
network, and a gossiping pair trains on it through the real launcher and is evaluated, consensus
policy included; an agent learns bitwise the same on batched SpaceInvaders as on MinAtar's loop.
Skipped, with the install line, where the optional extra is missing."""

import json
from functools import partial

import pytest
import torch

pytest.importorskip("minatar", reason="MinAtar is the optional extra: pip install 'gossiprl[minatar]'")

from gossiprl.launch import SwarmConfig, run  # noqa: E402
from gossiprl.rl.agent import AgentConfig, load_checkpoint, train  # noqa: E402
from gossiprl.rl.envs import env_spec, make_env  # noqa: E402
from gossiprl.rl.models import MinAtarActorCritic, make_model  # noqa: E402
from helpers import invoke  # noqa: E402


@pytest.mark.parametrize("game", ["Breakout", "SpaceInvaders", "Asterix", "Freeway", "Seaquest"])
def test_every_minatar_game_gets_the_papers_small_cnn(game):
    envs = make_env(f"MinAtar/{game}-v1", 2, seed=1)
    try:
        obs = envs.reset()
        model = make_model(envs.observation_space, envs.action_space)
        assert isinstance(model, MinAtarActorCritic)
        conv, linear = model.trunk[0], model.trunk[3]
        assert (conv.out_channels, conv.kernel_size, linear.out_features) == (16, (3, 3), 128)
        logits, value = model(torch.from_numpy(obs))
        assert logits.shape == (2, envs.action_space.n) and value.shape == (2,)
    finally:
        envs.close()


def test_minatar_has_no_threshold_and_a_bad_id_says_what_is_valid():
    assert env_spec("MinAtar/Breakout-v1") is None  # runs stop at their frame budget
    with pytest.raises(ValueError, match="MinAtar id"):
        env_spec("MinAtar/NoSuchGame-v1")


@pytest.mark.timeout(180)
def test_a_minatar_ring_trains_a_few_updates_and_its_consensus_is_evaluated(tmp_path):
    cfg = AgentConfig(env_id="MinAtar/Breakout-v1", seed=3, log_every=2)
    summary = run(
        SwarmConfig(agents=2, topology="ring", total_frames=2 * 6 * 80), cfg, tmp_path / "run", show_progress=False
    )
    assert summary["failed"] == {}
    assert [summary["per_agent"][r]["updates"] for r in (0, 1)] == [6, 6]
    assert summary["gossip_share"] > 0
    own = [summary["per_agent"][r]["mean_return"] for r in (0, 1)]
    assert summary["agents_min_return"] == min(own)
    assert summary["agents_mean_return"] == pytest.approx(sum(own) / 2)

    result = invoke("eval", tmp_path / "run", "--episodes", 2, "--json")
    scores = json.loads(result.output)
    assert scores["consensus"]["agents"] == 2 and len(scores["consensus"]["returns"]) == 2
    assert scores["overall"]["episodes"] == 4


@pytest.mark.timeout(120)
def test_an_agent_learns_bitwise_the_same_on_batched_spaceinvaders_as_on_minatars_loop(tmp_path, monkeypatch):
    """Same frames, rewards and terminals, so the same updates: the batch changes the cost of a
    frame, not what a run learns (the studies' cells from before it stand per frame)."""
    import gossiprl.rl.rollouts as rollouts

    cfg = AgentConfig(env_id="MinAtar/SpaceInvaders-v1", seed=5, total_frames=16 * 5 * 60, log_every=20)
    batched = train(cfg, tmp_path / "batched")
    monkeypatch.setattr(rollouts, "make_env", partial(make_env, batched=False))
    looped = train(cfg, tmp_path / "looped")
    assert batched["episodes"] > 0 and batched["episodes"] == looped["episodes"]
    params = [load_checkpoint(tmp_path / run / "agent-0" / "checkpoint.pt")["model"] for run in ("batched", "looped")]
    assert all(torch.equal(params[0][name], params[1][name]) for name in params[0])
