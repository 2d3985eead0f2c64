"""Consensus through a real broker reaches the rate the topology diagnostics predict.

Agents are threads in one process (as in README's "The comms layer on its own"), each mixing
a 100,000-float vector with what the broker delivers per round; the result is compared with
the product of the topology's own round matrices and with the contraction diagnose() states.
"""

from __future__ import annotations

import numpy as np
import pytest

import topologies
from brokers import gossip_rows
from gossiprl import Broker

SIZE = 100_000


def gossip_through_broker(topology, x: np.ndarray, rounds: int) -> np.ndarray:
    with Broker(topology).start() as broker:
        return gossip_rows(broker, x, rounds)


def product(topology, rounds: int) -> np.ndarray:
    phi = np.eye(topology.n)
    for r in range(rounds):
        phi = topology.at(r).matrix @ phi
    return phi


def disagreement(x: np.ndarray) -> float:
    return float(np.linalg.norm(x - x.mean(axis=0)))


def start(n: int) -> np.ndarray:
    return np.random.default_rng(n).normal(size=(n, SIZE))


def test_one_peer_exponential_averages_exactly_after_log2_n_rounds():
    topology = topologies.make("one-peer-exponential", 8)
    assert topology.diagnostics().exact and topology.period == 3
    x0 = start(8)
    two = gossip_through_broker(topology, x0, 2)
    assert disagreement(two) > 0.1 * disagreement(x0)  # not yet: two rounds reach 4 agents each
    three = gossip_through_broker(topology, x0, 3)
    np.testing.assert_allclose(three, np.broadcast_to(x0.mean(axis=0), x0.shape), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n, periods", [(8, 1), (6, 2)])
def test_gala_exponential_contracts_as_diagnosed(n, periods):
    topology = topologies.make("gala-exponential", n)
    d = topology.diagnostics()
    rounds = periods * topology.period
    x0 = start(n)
    x = gossip_through_broker(topology, x0, rounds)
    np.testing.assert_allclose(x, product(topology, rounds) @ x0, rtol=0, atol=1e-12)  # the broker's rows are P's
    np.testing.assert_allclose(x.mean(axis=0), x0.mean(axis=0), rtol=0, atol=1e-12)  # doubly stochastic
    ratio = disagreement(x) / disagreement(x0)
    assert ratio <= d.contraction**periods + 1e-12
    if d.exact:
        assert ratio < 1e-12
    else:  # the bound is tight: with 100k random columns the slowest mode is excited and shows
        assert ratio >= 0.5 * d.contraction**periods


@pytest.mark.parametrize(
    "name, n, options",
    [
        *[(name, 6, {}) for name in topologies.NAMES if name != "hypercube"],
        ("hypercube", 8, {"time_varying": True}),
        ("gala-exponential", 6, {"peers_per_round": 3}),
        ("random-regular", 8, {"degree": 3, "seed": 1}),
    ],
)
def test_every_family_mixes_through_the_broker_as_its_matrices_say(name, n, options):
    topology = topologies.make(name, n, **options)
    rounds = topology.period + 2  # a whole period and into the next one
    x0 = np.random.default_rng(1).normal(size=(n, 1000))
    x = gossip_through_broker(topology, x0, rounds)
    np.testing.assert_allclose(x, product(topology, rounds) @ x0, rtol=0, atol=1e-12)
