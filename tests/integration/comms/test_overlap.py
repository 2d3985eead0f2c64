"""Overlapped gossip: letters travel while the learner works and are mixed one round later.

Two agents on a directed ring, each holding one number, run the overlapped hook through a real
broker in sync mode. Mixing the letters of round r - 1 into the parameters of round r is a
different recursion from the blocking one; the test computes it by hand and checks every round,
so a letter mixed twice, skipped, or mixed in the wrong round fails.
"""

import threading
import time

import numpy as np
import pytest

import topologies
from gossiprl import Broker, Gossip, GossipClient

ROUNDS = 12


def _run_agents(broker, steps, overlap: bool) -> dict[int, list[float]]:
    """Each agent adds steps[rank][k] (its 'update'), then exchanges; returns its values after every exchange."""
    seen = {0: [], 1: []}

    def agent(rank):
        x = np.zeros(4, dtype=np.float32)
        hook = Gossip(GossipClient(broker.address, rank, timeout=20), overlap=overlap, deviation_bound=None)
        try:
            for k in range(ROUNDS):
                x += steps[rank][k]
                hook.exchange(x)
                seen[rank].append(float(x[0]))
            hook.flush(x)
            seen[rank].append(float(x[0]))
        finally:
            hook.close()

    threads = [threading.Thread(target=agent, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert not any(t.is_alive() for t in threads)
    return seen


def _expected(steps, overlap: bool) -> dict[int, list[float]]:
    """The same recursion by hand: x_i <- (x_i + letter_j) / 2 on the ring 0 <-> 1."""
    x = [0.0, 0.0]
    sent = [None, None]  # the letter each agent published last round (overlapped)
    out = {0: [], 1: []}
    for k in range(ROUNDS):
        x = [x[i] + steps[i][k] for i in (0, 1)]
        if overlap:
            letters, sent = sent, list(x)  # published as the update left it, before the mix
            x = [x[i] if letters[1 - i] is None else (x[i] + letters[1 - i]) / 2 for i in (0, 1)]
        else:
            x = [(x[0] + x[1]) / 2] * 2
        for i in (0, 1):
            out[i].append(x[i])
    if overlap:
        x = [(x[i] + sent[1 - i]) / 2 for i in (0, 1)]  # flush: the last round's letters
    for i in (0, 1):
        out[i].append(x[i])
    return out


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "blocking"])
def test_every_letter_is_mixed_once_in_round_order(overlap):
    rng = np.random.default_rng(3)
    steps = {r: [float(s) for s in rng.integers(-8, 9, ROUNDS)] for r in (0, 1)}
    broker = Broker(topologies.make("ring", 2)).start()
    try:
        seen = _run_agents(broker, steps, overlap)
    finally:
        broker.close()
    expected = _expected(steps, overlap)
    for rank in (0, 1):
        np.testing.assert_allclose(seen[rank], expected[rank], rtol=1e-6, err_msg=f"rank {rank}")


def test_overlapped_gossip_absorbs_jitter_that_blocking_gossip_waits_out():
    """Two agents at the same mean pace whose updates alternate 0.1 s and 0.3 s out of step (as
    updates jitter on a shared host). Blocking, every round runs at the slower one's pace and the
    faster one idles 0.2 s; overlapped, the previous round's letter is always there in time."""
    broker = Broker(topologies.make("ring", 2)).start()
    waits = {}

    def agent(rank, overlap):
        hook = Gossip(GossipClient(broker.address, rank, timeout=20), overlap=overlap, deviation_bound=None)
        x = np.zeros(8, dtype=np.float32)
        try:
            rounds = []
            for k in range(6):
                time.sleep(0.1 if (k + rank) % 2 else 0.3)  # the update
                rounds.append(hook.exchange(x)["gossip/wait_s"])
            hook.flush(x)
            waits[(rank, overlap)] = sum(rounds[1:])
        finally:
            hook.close()

    try:
        for overlap in (False, True):
            threads = [threading.Thread(target=agent, args=(rank, overlap)) for rank in (0, 1)]
            [t.start() for t in threads]
            [t.join(60) for t in threads]
    finally:
        broker.close()
    blocking, overlapped = (waits[(0, o)] + waits[(1, o)] for o in (False, True))
    assert blocking > 0.6, waits  # 5 rounds x 0.2 s idle, on one side or the other
    assert overlapped < blocking / 4, waits


@pytest.mark.parametrize("plane", ["broker", "shm"])
def test_an_overlapped_agent_never_sends_parameters_gone_non_finite(plane):
    """An overlapped round sends unchecked the letters a mix has vouched for (MixResult.checked); a
    mix that refused our non-finite parameters vouches for nothing, so the client's own check still
    stops the letter, the error surfaces at the next call, and the neighbour stays finite."""
    broker = Broker(topologies.make("ring", 2), data_plane=plane).start()
    errors, final = {}, {}

    def agent(rank):
        hook = Gossip(GossipClient(broker.address, rank, timeout=2), overlap=True, deviation_bound=None)
        x = np.full(4, float(rank), dtype=np.float32)
        try:
            for k in range(6):
                if rank == 0 and k == 4:
                    x[1] = np.nan
                hook.exchange(x)
            hook.flush(x)
        except ValueError as err:
            errors[rank] = str(err)
        finally:
            hook.close()
            final[rank] = x.copy()

    try:
        threads = [threading.Thread(target=agent, args=(r,)) for r in (0, 1)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
    finally:
        broker.close()
    assert "NaN or infinity" in errors.get(0, ""), errors
    assert 1 not in errors and np.isfinite(final[1]).all(), final
