"""Robust mixing against peers that stay inside the deviation bound (issue 19, E11).

Each letter of these attacks is close enough to be accepted; what they do is steer, round after
round: a peer that pulls a tenth of |x| in one direction every round, and one that sends zeros.
The honest agent takes noisy steps of a hundredth of |x| per round, as an A2C agent's are (its
consensus distance runs at 1-2 % of |x|). The promise DeviationBound makes: the trailing sum of
what mixing did to us stays within DRIFT of our own steps, so over T rounds mixing moves us at
most DRIFT * step * (1 + T / WINDOW), whatever the peers send.
"""

import numpy as np
import pytest
import torch

from gossiprl.comms import gossip
from gossiprl.comms.client import BrokerUnavailable, GossipTimeout
from gossiprl.comms.gossip import DeviationBound, Gossip, mix

N = 8192
ROUNDS = 200
STEP = 0.001
"""Our own step per round, as a share of |x| at the start."""


def _noise(rng, size):
    s = rng.standard_normal(N)
    return s * (size / np.linalg.norm(s))


def _run(attack, aggregate="mean", kind="numpy", honest_peer=False, seed=0):
    """An agent that steps and mixes for ROUNDS rounds while in-peer 1 sends ``attack(x, rng)``.
    Returns |x0|, the displacement that mixing caused, the step size and the bound."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(N) * 0.1).astype(np.float32)
    x0 = x.copy()
    own = np.zeros(N)
    size = STEP * float(np.linalg.norm(x0))
    bound = DeviationBound()
    for _ in range(ROUNDS):
        s = _noise(rng, size)
        x += s.astype(np.float32)
        own += s
        letters, weights = {1: {"p": attack(x, rng).astype(np.float32)}}, {0: 0.5, 1: 0.5}
        if honest_peer:
            letters[2] = {"p": (x + _noise(rng, size)).astype(np.float32)}
            weights = {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}
        mine = torch.from_numpy(x).double() if kind == "torch" else x  # float64 tensor: the measure-first path
        result = mix({"p": mine}, letters, weights, 0, aggregate=aggregate, bound=bound)
        if kind == "torch":
            x[:] = mine.numpy()
        assert result.dropped == []  # the attacks stay inside the drop bound: the cap must do the work
    return float(np.linalg.norm(x0)), float(np.linalg.norm(x - x0 - own)), size, bound, x


def _promised(size):
    """The cap's promise over ROUNDS rounds, with 10 % for the sampled step's error: about the path
    our own ROUNDS steps took, ROUNDS * size (0.23 against 0.2 |x0| here)."""
    return 1.1 * DeviationBound.DRIFT * size * (1 + ROUNDS / DeviationBound.WINDOW)


DIRECTION = np.random.default_rng(9).standard_normal(N) / np.sqrt(N)


def _stealthy(x, rng):
    return x + 0.1 * np.linalg.norm(x) * DIRECTION


def _zeros(x, rng):
    return np.zeros_like(x)


CASES = [("mean", "numpy", False), ("median", "numpy", False), ("mean", "torch", False), ("mean", "numpy", True)]


@pytest.mark.parametrize("aggregate, kind, honest_peer", CASES)
def test_a_stealthy_peer_drags_no_farther_than_the_drift_cap(aggregate, kind, honest_peer):
    """Before the cap, this peer dragged the agent 9,370 |x0| in 200 rounds (370 |x0| with an honest
    in-peer beside it), against a path of 0.2 |x0| for the agent's own steps."""
    norm0, dragged, size, bound, _ = _run(_stealthy, aggregate, kind, honest_peer)
    assert dragged <= 2 * ROUNDS * size, f"mixing moved us {dragged / norm0:.3g} |x0|, twice our own steps' path"
    assert dragged <= _promised(size) and bound.clipped > 0


@pytest.mark.parametrize("aggregate, kind, honest_peer", CASES)
def test_an_all_zero_peer_cannot_collapse_its_neighbours(aggregate, kind, honest_peer):
    """Before the cap, each round all but halved the agent's parameters: |x| 0.00058 |x0| after 200
    rounds (0.00099 |x0| with an honest in-peer beside it)."""
    norm0, dragged, size, _, x = _run(_zeros, aggregate, kind, honest_peer)
    assert np.linalg.norm(x) >= 0.5 * norm0, f"|x| fell to {np.linalg.norm(x) / norm0:.3g} |x0|"
    assert dragged <= _promised(size)


def test_an_honest_swarm_is_never_cut_or_dropped():
    """Four agents on a ring, one shared initialisation, noisy steps: every letter is mixed whole."""
    rng = np.random.default_rng(3)
    start = (rng.standard_normal(N) * 0.1).astype(np.float32)
    size = STEP * float(np.linalg.norm(start))
    xs = [start.copy() for _ in range(4)]
    bounds = [DeviationBound() for _ in range(4)]
    for _ in range(ROUNDS):
        for x in xs:
            x += _noise(rng, size).astype(np.float32)
        letters = [x.copy() for x in xs]
        for i, x in enumerate(xs):
            left, right = (i - 1) % 4, (i + 1) % 4
            msgs = {left: {"p": letters[left]}, right: {"p": letters[right]}}
            result = mix({"p": x}, msgs, {i: 1 / 3, left: 1 / 3, right: 1 / 3}, i, bound=bounds[i])
            assert result.dropped == [] and result.pull == 1.0
    assert [b.clipped for b in bounds] == [0, 0, 0, 0]


@pytest.mark.parametrize("scale", [0.0, 1e-3])
def test_an_agent_with_tiny_parameters_mixes_honest_letters_in(scale):
    """The drop bound used to scale on the receiver's own norm: all-zero (or tiny) parameters
    dropped every honest letter, and since only accepted letters end the warm-up, for good. Now
    they are mixed in, at the drift cap's pace: from far away, an honest swarm and an attacker
    look alike (an agent that must catch up at once adopts its neighbours' parameters instead)."""
    rng = np.random.default_rng(5)
    swarm = (rng.standard_normal(N) * 0.1).astype(np.float32)
    mine = (swarm * scale).astype(np.float32)
    size = STEP * float(np.linalg.norm(swarm))
    bound = DeviationBound()
    start = float(np.linalg.norm(mine - swarm))
    for _ in range(50):
        mine += _noise(rng, size).astype(np.float32)
        swarm += _noise(rng, size).astype(np.float32)
        result = mix({"p": mine}, {1: {"p": swarm.copy()}}, {0: 0.5, 1: 0.5}, 0, bound=bound)
        assert result.dropped == [] and result.peers == 1
    first_cap = DeviationBound.FLOOR * DeviationBound.UNIT * np.sqrt(N)  # before our own step is known
    assert start - np.linalg.norm(mine - swarm) >= 0.5 * first_cap


def test_the_fused_sweep_and_the_measure_first_path_cap_alike(monkeypatch):
    """The fused mean samples our coordinates inside its sweep and adds to the trailing sum as it
    writes; the measure-first path (here: a transposed, non-contiguous tensor) does both apart. Under
    the stealthy peer both must measure the same steps, keep the same sum and cut the same rounds."""
    monkeypatch.setattr(gossip, "CHUNK", 999)  # blocks that start off the sample grid (every 2nd coordinate)
    rng = np.random.default_rng(11)
    x0 = (rng.standard_normal((64, 128)) * 0.1).astype(np.float32)
    flat, strided = x0.copy(), torch.from_numpy(x0.T.copy()).T  # the same values, one of them not contiguous
    bounds = [DeviationBound(), DeviationBound()]
    size = STEP * float(np.linalg.norm(x0))
    direction = rng.standard_normal(x0.shape) / np.sqrt(x0.size)
    for _ in range(40):
        s = rng.standard_normal(x0.shape) * (size / np.sqrt(x0.size))
        flat += s.astype(np.float32)
        strided += torch.from_numpy(s.astype(np.float32))
        results = []
        for mine, bound in zip((flat, strided), bounds):
            here = np.asarray(mine)
            letter = {1: {"p": (here + 0.1 * np.linalg.norm(here) * direction).astype(np.float32)}}
            results.append(mix({"p": mine}, letter, {0: 0.5, 1: 0.5}, 0, bound=bound))
        assert results[0].pull == pytest.approx(results[1].pull, abs=1e-4)
    np.testing.assert_allclose(flat, strided.numpy(), rtol=1e-4, atol=1e-6)
    assert list(bounds[0].steps) == pytest.approx(list(bounds[1].steps), rel=1e-3)
    assert bounds[0].trail_sq == pytest.approx(bounds[1].trail_sq, rel=1e-3)
    assert bounds[0].clipped == bounds[1].clipped > 0


@pytest.mark.parametrize("error", [BrokerUnavailable("the broker is gone"), GossipTimeout("no letter in 60 s")])
def test_an_agent_rejoining_without_neighbours_starts_from_its_own_parameters(error):
    """adopt() for an agent with no checkpoint: neither an unreachable broker nor silent neighbours
    end it (it failed before it trained at all); it counts the failure and keeps its parameters."""

    class Unreachable:
        rank = 2

        def collect(self):
            raise error

    gossip = Gossip(Unreachable())
    params = np.arange(4, dtype=np.float32)
    assert gossip.adopt(params) == 0 and gossip.failures == 1
    assert params.tolist() == [0.0, 1.0, 2.0, 3.0]
