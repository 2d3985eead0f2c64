"""Mixing under hostile letters: no agent may crash or become non-finite because of what a peer sent.

The poison goes through a real broker (a peer that skips its own finite check, as a foreign
implementation or a stolen key would), and the honest side is the Gossip hook agents run.
"""

import threading

import numpy as np
import pytest
import torch

import topologies
from gossiprl import Broker, Gossip, GossipClient, mix
from gossiprl.comms.gossip import CHUNK, DeviationBound, MixError

N = 2 * CHUNK + 1000  # three blocks of the fused mean: poison in the last one lands after writes began

POISONS = {
    "1e30": lambda x: np.full_like(x, 1e30),
    "nan": lambda x: np.full_like(x, np.nan),
    "inf-at-the-end": lambda x: np.concatenate([x[:-1], [np.inf]]).astype(x.dtype),
    "float32-max": lambda x: np.full_like(x, np.finfo(np.float32).max),
    "huge-but-finite": lambda x: x + 1e4,
}


def _swarm_round(liar, letter, hook, mine):
    """One sync round: the liar publishes its letter and collects; the honest hook exchanges."""
    stats = {}
    thread = threading.Thread(target=lambda: stats.update(hook.exchange(mine)))
    thread.start()
    liar.publish({"params": letter})
    liar.collect()
    thread.join(30)
    assert not thread.is_alive()
    return stats


@pytest.mark.parametrize("aggregate", ["mean", "trimmed-mean", "median"])
@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_peer_cannot_make_an_honest_agent_non_finite(poison, aggregate):
    rng = np.random.default_rng(0)
    start = rng.standard_normal(N).astype(np.float32)
    mine = start.copy()
    with Broker(topologies.make("ring", 2)).start() as broker:
        liar = GossipClient(broker.address, 0, check_finite=False)
        hook = Gossip(GossipClient(broker.address, 1), aggregate=aggregate)
        # first a few honest rounds, so the deviation bound has recent distances to judge by
        for _ in range(5):
            honest = mine + rng.standard_normal(N).astype(np.float32) * 1e-2
            stats = _swarm_round(liar, honest, hook, mine)
            assert stats["gossip/peers"] == 1 and stats["gossip/dropped"] == 0
        before = mine.copy()
        for _ in range(3):
            stats = _swarm_round(liar, POISONS[poison](mine), hook, mine)
            assert stats["gossip/peers"] == 0
        assert stats["gossip/dropped"] == 3 and stats["gossip/refused"] == 0
        assert np.isfinite(mine).all()
        np.testing.assert_allclose(mine, before, rtol=1e-5, atol=1e-5)  # restored where mixing had begun
        liar.close()
        hook.close()


@pytest.mark.parametrize("poison", ["1e30", "huge-but-finite"])
def test_a_first_letter_of_poison_is_refused_before_any_history(poison):
    """The bound judges by our own parameters' norm until recent distances exist."""
    mine = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    before = mine.copy()
    result = mix(
        {"p": mine},
        {1: {"p": POISONS[poison](mine) * (1e3 if poison == "huge-but-finite" else 1)}},
        {0: 0.5, 1: 0.5},
        0,
        bound=DeviationBound(),
    )
    assert result.dropped == [1] and result.peers == 0
    np.testing.assert_array_equal(mine, before)


def test_deviation_bound_keeps_honest_letters_and_counts_what_it_drops():
    rng = np.random.default_rng(2)
    mine = rng.standard_normal(5000)
    bound = DeviationBound(factor=10)
    for _ in range(10):
        letter = mine + rng.standard_normal(5000) * 0.1
        assert mix({"p": mine}, {1: {"p": letter}}, {0: 0.5, 1: 0.5}, 0, bound=bound).peers == 1
    recent = float(np.median(bound.recent))
    far = mine + 20 * recent / np.sqrt(5000)  # 20x the recent distance
    near = mine + 5 * recent / np.sqrt(5000)
    result = mix({"p": mine}, {1: {"p": far}, 2: {"p": near}}, {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}, 0, bound=bound)
    assert result.dropped == [1] and result.peers == 1


def test_a_larger_honest_step_near_consensus_is_mixed_not_dropped():
    """Near consensus the recent distances are tiny; one honest step 500x larger (5% of |x|) must
    still be mixed, or the two agents stop mixing and drift apart for good."""
    rng = np.random.default_rng(4)
    mine = rng.standard_normal(5000)
    bound = DeviationBound()
    for _ in range(40):
        letter = mine + rng.standard_normal(5000) * 1e-4
        assert mix({"p": mine}, {1: {"p": letter}}, {0: 0.5, 1: 0.5}, 0, bound=bound).peers == 1
    step = mine + rng.standard_normal(5000) * 5e-2
    assert mix({"p": mine}, {1: {"p": step}}, {0: 0.5, 1: 0.5}, 0, bound=bound).peers == 1


def test_a_diverged_agent_refuses_the_mix_and_blames_no_peer():
    mine = np.ones(N, np.float32)
    mine[-3] = np.nan
    before = mine.copy()
    result = mix({"p": mine}, {1: {"p": np.ones(N, np.float32) * 2}}, {0: 0.5, 1: 0.5}, 0)
    assert result.refused and result.dropped == [] and result.peers == 0
    np.testing.assert_array_equal(mine, before)


@pytest.mark.parametrize("kind", ["numpy", "torch64"])
def test_a_mix_vouches_for_our_parameters_only_when_it_found_every_one_finite(kind):
    """MixResult.checked lets an overlapped agent send its letter unchecked (the letter is a copy of
    the parameters the mix read): it must be False whenever some parameter went unread or was bad."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(N).astype(np.float32)
    letter = {1: {"p": x + np.float32(1e-3)}}
    weights = {0: 0.5, 1: 0.5}

    def mine(bad=None):
        arr = x.copy()
        if bad is not None:
            arr[-5] = bad
        return {"p": torch.from_numpy(arr).double() if kind == "torch64" else arr}

    assert mix(mine(), letter, weights, 0).checked
    assert mix(mine(), letter, weights, 0, bound=DeviationBound()).checked
    assert not mix(mine(), letter, weights, 0, check_finite=False).checked
    assert not mix(mine(), {}, weights, 0).checked
    for bad in (np.nan, np.inf):
        assert not mix(mine(bad), letter, weights, 0).checked
    poison = {1: {"p": np.where(np.arange(N) == N - 5, np.float32(np.nan), x)}}
    assert not mix(mine(), poison, weights, 0).checked  # the only letter dropped: nothing mixed


def test_a_late_bad_block_leaves_the_other_letters_mixed():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(N).astype(np.float32)
    good = rng.standard_normal(N).astype(np.float32)
    bad = good.copy()
    bad[-1] = np.nan
    mine = x.copy()
    result = mix({"p": mine}, {1: {"p": good}, 2: {"p": bad}}, {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}, 0)
    assert result.dropped == [2] and result.peers == 1
    np.testing.assert_allclose(mine, (x + good) / 2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("aggregate", ["median", "trimmed-mean"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_robust_aggregates_ignore_one_outlier_per_coordinate(aggregate, kind):
    x = np.zeros(6)
    letters = {1: {"p": np.full(6, 1.0)}, 2: {"p": np.full(6, -1.0)}, 3: {"p": np.full(6, 1e6)}}
    own = torch.from_numpy(x) if kind == "torch" else x
    result = mix({"p": own}, letters, {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}, 0, aggregate=aggregate)
    assert result.peers == 3
    # sorted per coordinate: -1, 0, 1, 1e6; median (0 + 1) / 2; trimmed mean drops -1 and 1e6
    np.testing.assert_allclose(x, 0.5)


def test_torch_and_numpy_mix_alike():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(3000).astype(np.float32)
    letters = {j: {"p": rng.standard_normal(3000).astype(np.float32)} for j in (1, 2)}
    weights = {0: 0.5, 1: 0.25, 2: 0.25}
    a, b = x.copy(), torch.from_numpy(x.copy()).to(torch.float64)
    ra = mix({"p": a}, letters, weights, 0)
    rb = mix({"p": b}, letters, weights, 0)  # float64 tensor: the measure-first path
    np.testing.assert_allclose(a, b.numpy(), rtol=1e-6, atol=1e-6)
    assert ra.consensus_distance == pytest.approx(rb.consensus_distance, rel=1e-5)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_integer_tensors_are_refused_with_their_name_and_dtype(kind):
    x = np.ones(4, np.int32)
    own = torch.from_numpy(x) if kind == "torch" else x
    with pytest.raises(MixError, match=r"'steps'.*int32.*floating"):
        mix({"steps": own}, {1: {"steps": np.full(4, 9, np.int32)}}, {0: 0.5, 1: 0.5}, 0)
    assert (x == 1).all()


def test_gossip_refuses_integer_parameters_before_sending_anything():
    with Broker(topologies.make("ring", 2)).start() as broker:
        hook = Gossip(GossipClient(broker.address, 0))
        with pytest.raises(MixError, match="int64"):
            hook.exchange(np.arange(4))
        assert broker.stats()["agents"][0]["publishes"] == 0
        hook.close()


def test_unknown_aggregate_is_refused():
    with pytest.raises(ValueError, match="mean, trimmed-mean, median"):
        mix({"p": np.zeros(2)}, {}, {0: 1.0}, 0, aggregate="mode")


@pytest.mark.parametrize("value", [1e30, float("nan")])
def test_a_training_agent_survives_a_peer_that_sends_poison_every_round(tmp_path, value):
    """The issue's attack end to end: an A2C agent trains on CartPole while its only in-peer
    sends 1e30 (or NaN) letters of the right schema every round; it must finish, finite."""
    from gossiprl.rl.a2c import A2CConfig
    from gossiprl.rl.agent import AgentConfig, train

    stop = threading.Event()
    with Broker(topologies.make("ring", 2)).start() as broker:
        liar = GossipClient(broker.address, 0, check_finite=False, timeout=10)

        def poison():
            while not stop.is_set():
                try:
                    letters = liar.collect()
                except Exception:
                    return
                if 1 not in letters:  # the agent has left
                    return
                shape = letters[1]["params"].shape
                liar.publish({"params": np.full(shape, value, np.float32)})

        thread = threading.Thread(target=poison, daemon=True)
        thread.start()
        hook = Gossip(GossipClient(broker.address, 1, timeout=10))
        cfg = AgentConfig(
            total_frames=2400, log_every=5, checkpoint_every=1000, torch_threads=1, a2c=A2CConfig(num_envs=4)
        )
        summary = train(cfg, tmp_path, rank=1, gossip=hook)
        stop.set()
        hook.close()
        liar.close()
        thread.join(10)
    assert summary["frames"] >= 2400
    state = torch.load(tmp_path / "agent-1" / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
    assert all(torch.isfinite(v).all() for v in state.values())
    rows = (tmp_path / "agent-1" / "metrics.csv").read_text().splitlines()
    header, last = rows[0].split(","), rows[-1].split(",")
    assert float(last[header.index("gossip/dropped")]) >= 0.8 * summary["updates"]


def test_all_zero_parameters_still_accept_honest_letters():
    """Zeros give the bound no scale of their own: they count as n parameters of a typical
    initialisation's size (norm 0.1 sqrt(100) = 1 here), not 0, which would refuse every letter.
    Before the agent's own step is known, the drift cap lets the first mix move it 0.1 of that:
    0.1 of the way along the mean's displacement of norm 0.25, so 0.4 of the pull."""
    mine = np.zeros(100)
    result = mix({"p": mine}, {1: {"p": np.full(100, 0.05)}}, {0: 0.5, 1: 0.5}, 0, bound=DeviationBound())
    assert result.peers == 1 and result.dropped == [] and result.pull == pytest.approx(0.4)
    assert np.allclose(mine, 0.01)


@pytest.mark.parametrize("poison", ["1e30", "nan", "inf-at-the-end"])
@pytest.mark.parametrize("aggregate", ["mean", "median"])
def test_the_measure_first_path_drops_poison_before_writing(poison, aggregate):
    """float64 torch tensors (like CUDA and bfloat16 ones) take the path that measures first."""
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    own = torch.from_numpy(x.astype(np.float64))
    before = own.clone()
    result = mix(
        {"p": own}, {1: {"p": POISONS[poison](x)}}, {0: 0.5, 1: 0.5}, 0, aggregate=aggregate, bound=DeviationBound()
    )
    assert result.dropped == [1] and result.peers == 0 and not result.refused
    assert torch.equal(own, before)
