"""Tests for the topologies package: the mixing maths every agent and the broker rely on."""

from __future__ import annotations

import cmath
import copy
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import topologies
from helpers import REPO_ROOT, invoke
from topologies import NAMES, Topology, TopologyError, from_dict, from_matrix, make

FAST = settings(max_examples=40, deadline=None)


def kinds(max_n: int = 40):
    """Every way make() can be called, over a range of swarm sizes."""
    n = st.integers(1, max_n)
    return st.one_of(
        st.builds(lambda n: make("ring", n), n),
        st.builds(lambda n: make("full", n), n),
        st.builds(lambda n, tv: make("sparse", n, time_varying=tv), n, st.booleans()),
        st.integers(2, max_n).flatmap(
            lambda n: st.builds(
                lambda p, tv: make("sparse", n, peers=p, time_varying=tv), st.integers(1, n - 1), st.booleans()
            )
        ),
        st.builds(
            lambda name, n, k: make(name, n, peers_per_round=min(k, len(topologies.phone_book(name, n)[0]))),
            st.sampled_from(["gala-exponential", "directed-linear", "static-linear"]),
            st.integers(2, max_n),
            st.integers(1, 4),
        ),
        st.builds(
            lambda name, half, k: make(
                name, 2 * half, peers_per_round=min(k, len(topologies.phone_book(name, 2 * half)[0]))
            ),
            st.sampled_from(["bipartite-exponential", "bipartite-linear"]),
            st.integers(1, max_n // 2),
            st.integers(1, 3),
        ),
        st.builds(lambda n: make("one-peer-exponential", n), n),
        st.builds(lambda n: make("torus", n), n),
        st.builds(lambda b, tv: make("hypercube", 2**b, time_varying=tv), st.integers(0, 5), st.booleans()),
        st.integers(5, max_n).flatmap(
            lambda n: st.builds(
                lambda d, seed: make("random-regular", n, degree=d, seed=seed),
                st.sampled_from([d for d in (2, 3, 4) if n * d % 2 == 0]),
                st.integers(0, 3),
            )
        ),
    )


def rounds_of(t: Topology) -> list[Topology]:
    return [t.at(r) for r in range(t.period)]


def hears_everyone(matrices) -> bool:
    """Strong connectivity, computed independently of the package: (I + A)^(n-1) has no zero."""
    reach = np.eye(len(matrices[0]), dtype=bool) | sum(np.asarray(m) > 0 for m in matrices).astype(bool)
    for _ in range(max(1, len(reach)).bit_length()):  # squaring: paths of length 2, 4, 8, ... >= n - 1
        reach = (reach.astype(float) @ reach.astype(float)) > 0
    return bool(reach.all())


def random_strongly_connected(rng: np.random.Generator, n: int, doubly: bool = False) -> np.ndarray:
    """A ring (to guarantee strong connectivity) plus random extra edges, rows normalised."""
    a = rng.random((n, n)) * (rng.random((n, n)) < 0.3)
    a[np.arange(n), (np.arange(n) - 1) % n] += 1.0
    a[np.arange(n), np.arange(n)] += 1.0
    if doubly:  # Sinkhorn: alternate row and column normalisation
        for _ in range(500):
            a /= a.sum(axis=1, keepdims=True)
            a /= a.sum(axis=0, keepdims=True)
    return a / a.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------- invariants
@FAST
@given(kinds())
def test_every_made_topology_is_row_stochastic_and_read_only(t):
    assert t.name in NAMES
    for view in rounds_of(t):
        p = view.matrix
        assert p.shape == (t.n, t.n) and p.dtype == np.float64
        assert (p >= 0).all()
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
        assert not p.flags.writeable
    assert hears_everyone([v.matrix for v in rounds_of(t)])


@FAST
@given(kinds(), st.integers(0, 50))
def test_in_and_out_peers_are_mirror_images(t, round_):
    for i in range(t.n):
        ins = t.in_peers(i, round=round_)
        assert list(ins) == sorted(ins) and i not in ins
        assert all(type(j) is int for j in ins)
        for j in range(t.n):
            assert (j in ins) == (i in t.out_peers(j, round=round_))


@FAST
@given(kinds(), st.integers(0, 50))
def test_weights_are_uniform_over_self_and_in_peers(t, round_):
    for i in range(t.n):
        ins = t.in_peers(i, round=round_)
        w = t.weights(i, round=round_)
        assert list(w) == sorted((*ins, i))
        for j, wij in w.items():
            assert wij == pytest.approx(1.0 / (1 + len(ins)))
            assert t.at(round_).matrix[i, j] == wij
        assert sum(w.values()) == pytest.approx(1.0)


def test_weights_always_include_self_even_at_zero():
    t = from_matrix([[0.0, 1.0], [1.0, 0.0]])
    assert t.weights(0) == {0: 0.0, 1: 1.0} and t.in_peers(0) == (1,)


@FAST
@given(kinds())
def test_made_topologies_are_doubly_stochastic(t):
    assert t.doubly_stochastic


# --------------------------------------------------------------------------- hand-checked graphs
def peers(t: Topology, round_: int = 0):
    return [t.in_peers(i, round_) for i in range(t.n)], [t.out_peers(i, round_) for i in range(t.n)]


def test_ring_hand_checked():
    one = make("ring", 1)
    assert one.matrix.tolist() == [[1.0]] and peers(one) == ([()], [()])
    assert peers(make("ring", 2)) == ([(1,), (0,)], [(1,), (0,)])
    assert make("ring", 2).matrix.tolist() == [[0.5, 0.5], [0.5, 0.5]]
    assert peers(make("ring", 3)) == ([(2,), (0,), (1,)], [(1,), (2,), (0,)])
    ins, outs = peers(make("ring", 5))
    assert ins == [(4,), (0,), (1,), (2,), (3,)] and outs == [(1,), (2,), (3,), (4,), (0,)]
    ins, outs = peers(make("ring", 8))
    assert ins == [((i - 1) % 8,) for i in range(8)] and outs == [((i + 1) % 8,) for i in range(8)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_full_hand_checked(n):
    t = make("full", n)
    others = [tuple(j for j in range(n) if j != i) for i in range(n)]
    assert peers(t) == (others, others)
    np.testing.assert_array_equal(t.matrix, np.full((n, n), 1.0 / n))


@pytest.mark.parametrize(
    "n, options, outs",
    [
        (1, {}, [()]),
        (2, {}, [(1,), (0,)]),
        (3, {}, [(1, 2), (0, 2), (0, 1)]),  # offsets 1, 2
        (5, {}, [(1, 2, 4), (2, 3, 0), (3, 4, 1), (4, 0, 2), (0, 1, 3)]),  # offsets 1, 2, 4
        (8, {}, [tuple(sorted({(i + 1) % 8, (i + 2) % 8, (i + 4) % 8})) for i in range(8)]),
        (8, {"peers": 1}, [((i + 1) % 8,) for i in range(8)]),  # = ring
        (8, {"peers": 7}, [tuple(sorted({(i + 1) % 8, (i + 2) % 8, (i + 4) % 8})) for i in range(8)]),  # 8, 16.. = self
        (4, {"peers": 3}, [tuple(sorted({(i + 1) % 4, (i + 2) % 4})) for i in range(4)]),  # 4 % 4 = self, dropped
        (6, {"peers": 5}, [tuple(sorted({(i + 1) % 6, (i + 2) % 6, (i + 4) % 6})) for i in range(6)]),  # 8%6=2 dup
    ],
)
def test_sparse_hand_checked(n, options, outs):
    t = make("sparse", n, **options)
    assert [t.out_peers(i) for i in range(n)] == [tuple(sorted(o)) for o in outs]
    assert not t.time_varying and t.period == 1


def test_sparse_default_peers_is_ceil_log2():
    for n in range(2, 70):
        k = math.ceil(math.log2(n))
        assert len(make("sparse", n).out_peers(0)) == k
        assert make("sparse", n).digest() == make("sparse", n, peers=k).digest()


# --------------------------------------------------------------------------- time-varying
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 17, 33])
def test_time_varying_sparse_sends_to_one_peer_per_round(n):
    t = make("sparse", n, time_varying=True)
    k = max(1, math.ceil(math.log2(n)))
    assert t.period == k and t.time_varying == (k > 1)
    for r in range(3 * k):
        view = t.at(r)
        assert view.period == 1 and not view.time_varying
        assert view is t.at(r + k)
        for i in range(n):
            assert view.out_peers(i) == ((i + 2 ** (r % k)) % n,) == t.out_peers(i, round=r)
            assert len(view.in_peers(i)) == 1
    assert hears_everyone([v.matrix for v in rounds_of(t)])
    assert t.matrix is t.at(0).matrix


@pytest.mark.parametrize(
    "t", [make("gala-exponential", 8), make("bipartite-exponential", 8), make("one-peer-exponential", 8)], ids=repr
)
def test_new_time_varying_families_survive_a_departure(t):
    survivors = t.without([3])
    assert survivors.period == t.period
    for r in range(t.period):
        assert survivors.in_peers(3, r) == () and all(3 not in survivors.in_peers(i, r) for i in range(8))
        np.testing.assert_allclose(survivors.at(r).matrix.sum(axis=1), 1.0)
    assert hears_everyone(
        [survivors.at(r).matrix[np.ix_([0, 1, 2, 4, 5, 6, 7], [0, 1, 2, 4, 5, 6, 7])] for r in range(t.period)]
    )


def test_time_varying_round_graph_alone_need_not_be_connected():
    t = make("sparse", 4, time_varying=True)
    assert not hears_everyone([t.at(1).matrix])  # i -> i + 2: two separate pairs
    assert t.at(1).name == "sparse@1"


def test_time_varying_with_peers_cycles_through_those_offsets():
    t = make("sparse", 16, peers=2, time_varying=True)
    assert t.period == 2
    assert [t.out_peers(0, round=r) for r in range(4)] == [(1,), (2,), (1,), (2,)]
    assert make("sparse", 16, peers=1, time_varying=True).digest() == make("ring", 16).digest()


def test_at_and_rank_arguments_are_checked():
    ring = make("ring", 4)
    assert ring.at(0) is ring and ring.at(123) is ring
    with pytest.raises(TopologyError, match="round must be >= 0"):
        ring.at(-1)
    with pytest.raises(TopologyError, match="round must be an integer"):
        ring.in_peers(0, round=1.5)
    with pytest.raises(TopologyError, match=r"rank 4 out of range.*0\.\.3"):
        ring.in_peers(4)
    with pytest.raises(TopologyError, match="rank must be an integer"):
        ring.weights("0")
    assert ring.in_peers(np.int64(1)) == (0,)


# --------------------------------------------------------------------------- spectrum
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_full_graph_mixes_in_one_round(n):
    t = make("full", n)
    assert t.slem == pytest.approx(0.0, abs=1e-12)
    assert t.spectral_gap == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13, 32])
def test_ring_slem_matches_closed_form(n):
    expected = abs((1 + cmath.exp(2j * math.pi / n)) / 2)  # = cos(pi / n)
    assert make("ring", n).slem == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("n", [3, 5, 8, 12, 20])
def test_sparse_slem_matches_circulant_eigenvalues(n):
    t = make("sparse", n)
    offsets = t.out_peers(0)  # agent i sends to i + o for each o
    eig = [abs(1 + sum(cmath.exp(2j * math.pi * k * o / n) for o in offsets)) / (1 + len(offsets)) for k in range(1, n)]
    assert t.slem == pytest.approx(max(eig), abs=1e-9)


def test_time_varying_slem_is_per_round_rate_of_one_period():
    t = make("sparse", 8, time_varying=True)
    assert t.slem == 0.0  # offsets 1, 2, 4 average 8 agents exactly in 3 rounds
    t = make("sparse", 6, time_varying=True)
    product = t.at(2).matrix @ t.at(1).matrix @ t.at(0).matrix
    moduli = sorted(np.abs(np.linalg.eigvals(product)), reverse=True)
    assert t.slem == pytest.approx(moduli[1] ** (1 / 3), abs=1e-9)
    assert 0 < t.slem < 1


def test_single_agent_slem_is_zero():
    assert make("ring", 1).slem == 0.0 and make("sparse", 1, time_varying=True).slem == 0.0


def test_periodic_matrix_has_slem_one_and_is_explained():
    t = from_matrix([[0.0, 1.0], [1.0, 0.0]])  # zero diagonal is allowed, but never converges
    assert t.slem == pytest.approx(1.0) and t.spectral_gap == pytest.approx(0.0)
    assert "never shrinks" in t.describe()


# --------------------------------------------------------------------------- gossip simulation
@pytest.mark.parametrize(
    "t",
    [
        make("ring", 8),
        make("ring", 13),
        make("sparse", 12),
        make("full", 5),
        make("sparse", 10, time_varying=True),
        make("sparse", 16, time_varying=True),
    ],
    ids=repr,
)
def test_gossip_converges_to_the_average_at_the_slem_rate(t):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(t.n, 3))
    mean = x.mean(axis=0)
    errors = [np.linalg.norm(x - mean)]
    rounds = 420  # a multiple of every period here
    for r in range(rounds):
        x = t.at(r).matrix @ x
        errors.append(np.linalg.norm(x - mean))
    np.testing.assert_allclose(x.mean(axis=0), mean, atol=1e-12)  # doubly stochastic: mean is kept
    assert errors[-1] <= 1e-3 * errors[0] + 1e-12
    k = t.period  # measure whole periods
    # only while the error is well above float noise (~1e-16 of |x|), where ratios are meaningful
    per_period = [errors[s + k] / errors[s] for s in range(0, rounds - k + 1, k) if errors[s + k] > 1e-9 * errors[0]]
    for ratio in per_period:  # normal matrices: never slower than slem
        assert ratio <= t.slem**k * (1 + 1e-6)
    if t.slem > 0.05:  # and the slowest mode is really that slow
        assert per_period[-1] ** (1 / k) == pytest.approx(t.slem, rel=0.05)


def test_row_stochastic_gossip_converges_to_the_weighted_average():
    rng = np.random.default_rng(1)
    p = random_strongly_connected(rng, 9)
    t = from_matrix(p)
    assert not t.doubly_stochastic
    pi = np.real(np.linalg.eig(p.T)[1][:, 0])
    pi /= pi.sum()  # left Perron vector: the consensus weights
    x0 = rng.normal(size=9)
    x = x0.copy()
    for _ in range(400):
        x = t.matrix @ x
    np.testing.assert_allclose(x, np.full(9, pi @ x0), atol=1e-9)
    assert not np.allclose(x, x0.mean())  # ...which is not the plain mean


def test_random_doubly_stochastic_matrix_contracts_within_slem_bound():
    rng = np.random.default_rng(2)
    t = from_matrix(random_strongly_connected(rng, 10, doubly=True))
    assert t.doubly_stochastic
    x = rng.normal(size=10)
    mean = x.mean()
    start = np.linalg.norm(x - mean)
    steps = 30
    for _ in range(steps):
        x = t.matrix @ x
    rate = (np.linalg.norm(x - mean) / start) ** (1 / steps)
    # non-normal P: transients may differ, but the long-run rate cannot beat slem by much nor exceed 1
    assert rate <= min(1.0, 1.5 * t.slem + 0.05)


# --------------------------------------------------------------------------- from_matrix and files
def test_from_matrix_roundtrips_through_npy_and_csv(tmp_path):
    p = random_strongly_connected(np.random.default_rng(3), 6)
    direct = from_matrix(p)
    np.save(tmp_path / "p.npy", p)
    np.savetxt(tmp_path / "p.csv", p, delimiter=",", fmt="%.17g")
    for source in (tmp_path / "p.npy", str(tmp_path / "p.csv"), p.tolist()):
        t = from_matrix(source)
        assert t.name == "matrix" and t.n == 6 and not t.time_varying
        np.testing.assert_array_equal(t.matrix, p)
        assert t.digest() == direct.digest()


def test_from_matrix_copies_its_input():
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    t = from_matrix(p)
    p[0, 0] = 7.0
    assert t.matrix[0, 0] == 0.5


def test_csv_with_few_digits_still_matches_digest(tmp_path):
    (tmp_path / "ring.csv").write_text("0.5,0,0.5\n0.5,0.5,0\n0,0.5,0.5\n")
    assert from_matrix(tmp_path / "ring.csv").digest() == make("ring", 3).digest()


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: make("wheel", 4), ["unknown topology 'wheel'", "ring, sparse, full"]),
        (lambda: make("ring", 0), ["n must be >= 1", "got 0"]),
        (lambda: make("ring", -3), ["n must be >= 1"]),
        (lambda: make("ring", 2.5), ["n must be an integer"]),
        (lambda: make("ring", True), ["n must be an integer"]),
        (lambda: make("ring", 4, peers=2), ["unknown option 'peers' for 'ring'", "valid options: none"]),
        (lambda: make("sparse", 4, fanout=2), ["unknown option 'fanout'", "peers, time_varying"]),
        (lambda: make("sparse", 4, peers=0), ["peers must be from 1 to 3", "got 0"]),
        (lambda: make("sparse", 4, peers=4), ["peers must be from 1 to 3", "got 4"]),
        (lambda: make("sparse", 1, peers=1), ["n=1", "leave peers unset"]),
        (lambda: make("sparse", 4, peers="2"), ["peers must be an integer"]),
        (lambda: make("sparse", 4, time_varying="yes"), ["time_varying must be True or False"]),
        (lambda: from_matrix([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), ["square", "(2, 3)"]),
        (lambda: from_matrix([0.5, 0.5]), ["2-D", "(2,)"]),
        (lambda: from_matrix(np.zeros((0, 0))), ["empty", "at least one agent"]),
        (lambda: from_matrix([[0.5, 0.5], [1.0]]), ["square 2-D array of numbers"]),
        (lambda: from_matrix([["a", "b"], ["c", "d"]]), ["real numbers", "dtype"]),
        (lambda: from_matrix([[0.5, np.nan], [0.5, 0.5]]), ["[0, 1]", "nan", "finite"]),
        (lambda: from_matrix([[0.5, np.inf], [0.5, 0.5]]), ["inf", "finite"]),
        (lambda: from_matrix([[1.5, -0.5], [0.5, 0.5]]), ["[0, 1]", "negative", ">= 0"]),
        (lambda: from_matrix([[0.5, 0.5], [0.3, 0.3]]), ["row 1 sums to 0.6", "must sum to 1"]),
        (
            lambda: from_matrix([[1.0, 0.0], [0.0, 1.0]]),
            ["not strongly connected", "agents {1} can never hear from agents {0}", "cannot reach consensus"],
        ),
        (
            lambda: from_matrix([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]]),
            ["not strongly connected", "agents {0, 1} can never hear from agents {2}"],
        ),
        (lambda: from_matrix("weights.txt"), [".npy or .csv", "weights.txt"]),
        (lambda: from_matrix("missing.npy"), ["cannot read", "missing.npy"]),
    ],
)
def test_validation_errors_say_what_is_wrong_and_what_is_valid(call, words):
    with pytest.raises(TopologyError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_row_sum_tolerance_is_1e_6():
    from_matrix([[0.5 + 5e-7, 0.5], [0.5, 0.5]])
    with pytest.raises(TopologyError, match="row 0 sums to"):
        from_matrix([[0.5 + 5e-6, 0.5], [0.5, 0.5]])


def test_unreadable_csv_is_a_topology_error(tmp_path):
    (tmp_path / "bad.csv").write_text("0.5,zero\n0.5,0.5\n")
    with pytest.raises(TopologyError, match="cannot read a matrix from"):
        from_matrix(tmp_path / "bad.csv")


def test_topology_error_is_a_value_error():
    assert issubclass(TopologyError, ValueError)


def test_topologies_are_immutable():
    t = make("ring", 3)
    with pytest.raises(AttributeError):
        t.n = 4
    with pytest.raises(AttributeError):
        t._n = 4
    with pytest.raises(ValueError):
        t.matrix[0, 0] = 1.0
    with pytest.raises(TypeError, match="make"):
        Topology()


# --------------------------------------------------------------------------- digest and dicts
def test_digest_identifies_content_not_name():
    assert make("ring", 5).digest() == make("ring", 5).digest()
    assert make("ring", 5).digest() == from_matrix(make("ring", 5).matrix).digest()
    assert make("sparse", 2).digest() == make("ring", 2).digest() == make("full", 2).digest()
    different = [
        make("ring", 5),
        make("ring", 6),
        make("full", 5),
        make("sparse", 5),
        make("sparse", 5, time_varying=True),
        make("sparse", 5, time_varying=True).at(1),
    ]
    assert len({t.digest() for t in different}) == len(different)
    d = make("ring", 5).digest()
    assert len(d) == 16 and int(d, 16) >= 0


def test_digest_ignores_negative_zero_and_tiny_noise():
    p = make("ring", 4).matrix.copy()
    p[0, 1] = -0.0
    q = p + 1e-15 * (p > 0)
    assert from_matrix(p).digest() == from_matrix(q).digest() == make("ring", 4).digest()


ALL = [
    make("ring", 1),
    make("ring", 6),
    make("full", 4),
    make("sparse", 9),
    make("sparse", 9, peers=2),
    make("sparse", 9, time_varying=True),
    make("sparse", 9, time_varying=True).at(2),
    from_matrix(random_strongly_connected(np.random.default_rng(4), 5)),
    make("gala-exponential", 8, peers_per_round=2),
    make("bipartite-linear", 6).at(1),
    make("random-regular", 10, degree=3, seed=4),
    make("torus", 12, rows=3),
    make("hypercube", 8, time_varying=True),
    topologies.metropolis(np.ones((3, 3))),
]


@pytest.mark.parametrize("t", ALL, ids=repr)
def test_to_dict_from_dict_roundtrip_through_json(t):
    d = t.to_dict()
    assert set(d) == {"name", "n", "options", "matrix", "digest"}
    back = from_dict(json.loads(json.dumps(d)))
    assert (back.name, back.n, back.period, back.digest()) == (t.name, t.n, t.period, t.digest())
    assert back.to_dict() == d


@pytest.mark.parametrize("t", ALL, ids=repr)
def test_pickle_and_copy_keep_the_topology(t):
    for clone in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t)):
        assert (clone.name, clone.n, clone.period, clone.digest()) == (t.name, t.n, t.period, t.digest())


def test_from_dict_accepts_minimal_hand_written_configs():
    assert from_dict({"name": "sparse", "n": 8, "options": {"time_varying": True}}).period == 3
    assert from_dict({"name": "ring", "n": 4}).digest() == make("ring", 4).digest()
    assert from_dict({"name": "mine", "matrix": [[0.5, 0.5], [0.5, 0.5]]}).name == "mine"


@pytest.mark.parametrize(
    "d, words",
    [
        ([1, 2], ["mapping"]),
        ({"name": "ring", "n": 4, "peer": 1}, ["unknown key 'peer'", "name, n, options, matrix, digest"]),
        ({"n": 4}, ["needs a 'name'"]),
        ({"name": "ring"}, ["needs 'n'"]),
        ({"name": "wheel", "n": 4}, ["unknown topology 'wheel'", "ring, sparse, full", "'matrix'"]),
        ({"name": "ring", "n": 4, "options": {"peers": 2}}, ["unknown option 'peers'"]),
        ({"name": "ring", "n": 4, "options": [1]}, ["options must be a mapping"]),
        ({"name": "ring", "n": 3, "matrix": make("full", 3).matrix.tolist()}, ["does not match 'ring'"]),
        ({"name": "ring", "n": 3, "digest": "0123456789abcdef"}, ["digest mismatch"]),
        ({"name": "m", "n": 3, "matrix": [[0.5, 0.5], [0.5, 0.5]]}, ["n=3", "2x2"]),
        ({"name": "m", "options": {"peers": 1}, "matrix": [[1.0]]}, ["only meaningful for the named"]),
        ({"name": "m", "matrix": [[1.0, 0.0], [0.0, 1.0]]}, ["not strongly connected"]),
        ({"name": "sparse@5", "n": 8, "options": {"time_varying": True}}, ["rounds 0..2"]),
    ],
)
def test_from_dict_rejects_inconsistent_dicts(d, words):
    with pytest.raises(TopologyError) as info:
        from_dict(d)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# --------------------------------------------------------------------------- describe
def test_describe_small_shows_matrix_peers_and_interpretation():
    text = make("ring", 4).describe()
    for word in [
        "'ring'",
        "n=4",
        "matrix",
        "0.500",
        "rank 0: in 3 | out 1",
        "slem 0.7071",
        "spectral gap 0.2929",
        "doubly stochastic: yes",
        "~14 rounds to shrink it 100x",
    ]:
        assert word in text, (word, text)


def test_describe_large_lists_peers_instead_of_matrix():
    text = make("full", 40).describe()
    assert "too large to show" in text and "rank 39: in 0-38 | out 0-38" in text
    assert "consensus is exact after one round" in text


def test_describe_time_varying_shows_every_round():
    text = make("sparse", 8, time_varying=True).describe()
    assert "time-varying, period 3" in text
    assert all(f"round {r} (every round t with t % 3 == {r})" in text for r in range(3))
    assert "exact after one period (3 rounds)" in text


def test_describe_weighted_average():
    text = from_matrix([[0.5, 0.5, 0], [0, 0.5, 0.5], [0.2, 0, 0.8]]).describe()
    assert "doubly stochastic: no" in text and "weighted average" in text


# --------------------------------------------------------------------------- packaging and drawing
def test_package_imports_only_numpy_and_the_standard_library():
    code = (
        "import sys; before = set(sys.modules); import topologies; "
        "print('\\n'.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(topologies.__file__).parents[1],
    ).stdout.split()
    foreign = [
        m
        for m in out
        if m not in sys.stdlib_module_names and m not in ("numpy", "topologies") and not m.startswith("_")
    ]
    assert foreign == []


@pytest.mark.parametrize(
    "t", [make("ring", 5), make("sparse", 8, time_varying=True), make("full", 12), make("ring", 1)], ids=repr
)
def test_draw_topology_writes_a_png(tmp_path, t):
    pytest.importorskip("matplotlib")
    from gossiprl.draw import draw_topology

    path = tmp_path / "topology.png"
    draw_topology(t, path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000


# --------------------------------------------------------------------------- GALA's and SGP's families
# Phone books worked out by hand from graph_manager.py of GALA/SGP (facebookresearch/stochastic_gradient_push,
# gossip/graph_manager.py and GALA's copy of it): offsets, forward peer before backward peer, passive (even) ranks
# of the bipartite graphs backward first, duplicates and self dropped. Rank 0 of 8 is the anchor.
BOOKS = {
    "gala-exponential": {  # offsets 2^i, i = 0..floor(log2(n - 1))
        4: {0: [1, 3, 2], 1: [2, 0, 3]},
        8: {0: [1, 7, 2, 6, 4], 3: [4, 2, 5, 1, 7]},
        16: {0: [1, 15, 2, 14, 4, 12, 8], 5: [6, 4, 7, 3, 9, 1, 13]},
    },
    "bipartite-exponential": {  # offsets 1 and 1 + 2^i (i >= 1)
        4: {0: [3, 1], 1: [2, 0]},
        8: {0: [7, 1, 5, 3], 1: [2, 0, 4, 6]},
        16: {0: [15, 1, 13, 3, 11, 5, 7, 9], 1: [2, 0, 4, 14, 6, 12, 10, 8]},
    },
    "bipartite-linear": {  # every odd offset
        4: {0: [3, 1], 1: [2, 0]},
        8: {0: [7, 1, 5, 3], 1: [2, 0, 4, 6]},
        16: {0: [15, 1, 13, 3, 11, 5, 9, 7], 1: [2, 0, 4, 14, 6, 12, 8, 10]},
    },
    "directed-linear": {  # every odd offset, forward first for every rank
        4: {0: [1, 3], 1: [2, 0]},
        8: {0: [1, 7, 3, 5], 2: [3, 1, 5, 7]},
        16: {0: [1, 15, 3, 13, 5, 11, 7, 9], 1: [2, 0, 4, 14, 6, 12, 8, 10]},
    },
}


@pytest.mark.parametrize("name", sorted(BOOKS))
@pytest.mark.parametrize("n", [4, 8, 16])
def test_phone_books_match_gala_and_sgp(name, n):
    book = topologies.phone_book(name, n)
    for rank, peers in BOOKS[name][n].items():
        assert book[rank] == peers
    assert len({len(peers) for peers in book}) == 1


@pytest.mark.parametrize("name", sorted(BOOKS))
@pytest.mark.parametrize("n", [4, 8, 16])
def test_one_peer_per_round_walks_the_phone_book_in_order(name, n):
    t = make(name, n)
    for rank, peers in BOOKS[name][n].items():
        assert t.period == len(peers)
        assert [t.out_peers(rank, r) for r in range(2 * len(peers))] == [(p,) for p in peers * 2]
        for r, p in enumerate(peers):  # a permutation per round: whoever sends to p, p hears only from it
            assert t.in_peers(p, r) == (rank,) and t.weights(p, r) == {**{rank: 0.5}, p: 0.5}


def test_peers_per_round_moves_the_window_by_k_entries():
    t = make("gala-exponential", 8, peers_per_round=2)  # book [1, 7, 2, 6, 4], windows of 2, step 2
    assert t.period == 5
    assert [t.out_peers(0, r) for r in range(6)] == [(1, 7), (2, 6), (1, 4), (2, 7), (4, 6), (1, 7)]
    assert all(len(t.in_peers(i, r)) == 2 for i in range(8) for r in range(5))
    assert make("directed-linear", 8, peers_per_round=2).period == 2
    assert make("gala-exponential", 8, peers_per_round=5).period == 1


def test_static_linear_keeps_the_first_k_entries():
    assert make("static-linear", 8).out_peers(0) == (1,) and make("static-linear", 8).period == 1
    assert make("static-linear", 8).digest() == make("ring", 8).digest()
    assert make("static-linear", 8, peers_per_round=2).out_peers(0) == (1, 7)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: make("bipartite-exponential", 7), ["even number of agents", "n=7"]),
        (lambda: make("gala-exponential", 8, peers_per_round=6), ["peers_per_round must be from 1 to 5", "got 6"]),
        (lambda: make("gala-exponential", 8, peers=2), ["unknown option 'peers'", "peers_per_round"]),
        (lambda: make("hypercube", 6), ["power of two", "n=6"]),
        (lambda: make("torus", 12, rows=5), ["rows must divide n=12", "1, 2, 3, 4, 6, 12"]),
        (lambda: make("random-regular", 5, degree=3), ["n * degree even"]),
        (lambda: make("random-regular", 5, degree=5), ["degree must be from 1 to 4"]),
        (lambda: topologies.metropolis([[0, 1], [0, 0]]), ["undirected", "between 0 and 1"]),
    ],
)
def test_family_errors_say_what_is_valid(call, words):
    with pytest.raises(TopologyError) as info:
        call()
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# --------------------------------------------------------------------------- the graphs later work found best
@pytest.mark.parametrize("n", [2, 3, 6, 8, 16, 33])
def test_one_peer_exponential_sends_to_i_plus_two_to_the_t(n):
    t = make("one-peer-exponential", n)
    tau = math.ceil(math.log2(n))
    assert t.period == tau
    for r in range(2 * tau):
        assert [t.out_peers(i, r) for i in range(n)] == [((i + 2 ** (r % tau)) % n,) for i in range(n)]
        assert t.weights(0, r) == {0: 0.5, (-(2 ** (r % tau))) % n: 0.5}


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_one_peer_exponential_averages_exactly_in_log2_n_rounds(n):
    x = np.random.default_rng(0).normal(size=(n, 3))
    t = make("one-peer-exponential", n)
    for r in range(int(math.log2(n))):
        x = t.at(r).matrix @ x
    np.testing.assert_allclose(x, np.broadcast_to(x.mean(axis=0), x.shape), atol=1e-12)
    d = t.diagnostics()
    assert d.exact and d.contraction == 0.0 and d.rounds_to_target == int(math.log2(n))


def test_hypercube_and_its_one_dimension_per_round_schedule():
    t = make("hypercube", 8)
    assert [t.out_peers(i) for i in (0, 5)] == [(1, 2, 4), (1, 4, 7)] and t.weights(0)[0] == 0.25
    tv = make("hypercube", 8, time_varying=True)
    assert [tv.out_peers(5, r) for r in range(3)] == [(4,), (7,), (1,)]
    assert tv.diagnostics().exact and not t.diagnostics().exact


def test_torus_neighbours():
    t = make("torus", 16)  # 4 x 4
    assert t.out_peers(0) == (1, 3, 4, 12) and t.out_peers(5) == (1, 4, 6, 9)
    assert make("torus", 8, rows=2).out_peers(0) == (1, 3, 4)  # 2 x 4: up and down are the same agent
    assert make("torus", 7).digest() == from_matrix(make("torus", 7).matrix).digest()


def test_random_regular_is_seeded_simple_connected_and_undirected():
    t = make("random-regular", 20, degree=3, seed=7)
    for i in range(20):
        assert len(t.out_peers(i)) == 3 and t.out_peers(i) == t.in_peers(i)
    assert hears_everyone([t.matrix])
    assert make("random-regular", 20, degree=3, seed=7).digest() == t.digest()
    assert len({make("random-regular", 20, degree=3, seed=s).digest() for s in range(5)}) > 1
    assert from_dict(t.to_dict()).digest() == t.digest()


def test_metropolis_hastings_makes_an_irregular_graph_doubly_stochastic():
    star = np.zeros((5, 5))
    star[0, 1:] = star[1:, 0] = 1
    t = topologies.metropolis(star)
    assert t.doubly_stochastic and t.weights(1) == {0: 0.2, 1: 0.8} and t.weights(0)[0] == pytest.approx(0.2)
    uniform = star + np.eye(5)
    assert not from_matrix(uniform / uniform.sum(axis=1, keepdims=True)).doubly_stochastic
    x = np.arange(5.0)
    for _ in range(300):
        x = t.matrix @ x
    np.testing.assert_allclose(x, 2.0)


# --------------------------------------------------------------------------- diagnostics
def brute_force_rounds(t: Topology, target: float = 0.01, cap: int = 5000):
    """Step the product round by round: an independent check of the binary lifting in diagnose()."""
    n = t.n
    period = np.eye(n)
    for r in range(t.period):
        period = t.at(r).matrix @ period
    # where the agents end up: the plain mean for doubly stochastic rounds, the weighted average of
    # the period's left Perron vector otherwise (the star's hub and the tree's inner nodes weigh more)
    values, vectors = np.linalg.eig(period.T)
    pi = np.real(vectors[:, np.argmin(abs(values - 1))])
    j = np.outer(np.ones(n), pi / pi.sum())
    phi = np.eye(n)
    for m in range(1, cap):
        phi = t.at(m - 1).matrix @ phi
        if np.linalg.norm(phi - j, 2) <= target:
            return m
    return None


@pytest.mark.parametrize(
    "t",
    [
        make(name, n)
        for name in NAMES
        if name not in ("hypercube",)
        for n in (6, 8, 16)
        if not (name.startswith("bipartite") and n % 2)
    ]
    + [make("hypercube", 16)],
    ids=repr,
)
def test_rounds_to_one_percent_matches_stepping_the_product(t):
    d = t.diagnostics()
    assert d.rounds_to_target == brute_force_rounds(t)
    w = np.linalg.multi_dot([t.at(r).matrix for r in reversed(range(t.period))]) if t.period > 1 else t.matrix
    if np.allclose(w.sum(axis=0), 1.0):  # doubly stochastic: the second singular value
        singular = np.linalg.svd(w, compute_uv=False)
        assert d.contraction == pytest.approx(singular[1] if singular[1] > 1e-9 else 0.0, abs=1e-9)
    else:  # otherwise the distance to the projection onto the Perron-weighted average
        values, vectors = np.linalg.eig(w.T)
        pi = np.real(vectors[:, np.argmin(abs(values - 1))])
        assert d.contraction == pytest.approx(np.linalg.norm(w - np.outer(np.ones(t.n), pi / pi.sum()), 2), abs=1e-9)


@pytest.mark.parametrize("n", [4, 8, 13, 64])
def test_ring_diagnostics_match_the_closed_form(n):
    d = make("ring", n).diagnostics()
    assert d.contraction == pytest.approx(math.cos(math.pi / n), abs=1e-9)
    assert d.rounds_to_target == math.ceil(math.log(100) / -math.log(math.cos(math.pi / n)))
    assert d.letters_per_round == 1 and not d.exact


def test_gala_exponential_at_8_averages_exactly_after_its_period():
    d = make("gala-exponential", 8).diagnostics()
    assert d.period == 5 and d.exact and d.rounds_to_target == 5 and d.letters_per_round == 1


def test_diagnostics_of_a_weighted_average_use_the_perron_projection():
    p = random_strongly_connected(np.random.default_rng(5), 6)
    d = from_matrix(p).diagnostics()
    x0 = np.random.default_rng(6).normal(size=6)
    x = x0
    for _ in range(d.rounds_to_target):
        x = p @ x
    limit = np.linalg.matrix_power(p, 2000) @ x0
    assert np.linalg.norm(x - limit) <= 0.01 * np.linalg.norm(x0 - limit) * (1 + 1e-9)  # (Phi - J) kills J x0
    assert not d.exact


def test_large_swarms_refuse_dense_diagnostics_in_one_line():
    n = topologies.MAX_DENSE_N + 1
    t = make("ring", n)
    with pytest.raises(TopologyError, match=f"refused above n={n - 1}"):
        _ = t.slem
    with pytest.raises(TopologyError, match=f"refused above n={n - 1}"):
        t.diagnostics()
    text = t.describe()
    assert "diagnostics skipped" in text and f"ranks 8-{n - 3} not shown" in text and len(text.splitlines()) < 30


def test_sparse_time_varying_is_the_one_peer_exponential_graph():
    for n in (3, 8, 12):
        assert make("sparse", n, time_varying=True).digest() == make("one-peer-exponential", n).digest()


# --------------------------------------------------------------------------- the topology CLI and the docs
def test_cli_show_builds_every_family_with_its_options(tmp_path):
    pytest.importorskip("matplotlib")
    result = invoke(
        "topology", "show", "gala-exponential", "-n", "8", "--peers-per-round", "2", "--plot", tmp_path / "g.png"
    )
    assert result.exit_code == 0, result.output
    assert (
        "period 5" in result.output
        and "rank 0: in 1, 7 | out 1, 7" in result.output
        and "rank 0: in 4, 7 | out 1, 4" in result.output
    )
    assert "contraction per period (5 rounds)" in result.output and "rounds to shrink" in result.output
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")
    result = invoke("topology", "show", "random-regular", "-n", "12", "--option", "degree=4", "--option", "seed=2")
    assert result.exit_code == 0 and "options: degree=4, seed=2" in result.output
    for args, words in [
        (["torus", "-n", "12", "--option", "deg=1"], "unknown option 'deg'"),
        (["torus", "-n", "12", "--option", "rows"], "KEY=INTEGER"),
        (["bipartite-linear", "-n", "7"], "even number of agents"),
        (["sparse", "-n", "10000"], "more than `topology show` builds (4096"),
    ]:
        result = invoke("topology", "show", *args)
        assert result.exit_code == 2 and words in result.output, result.output


def test_docs_tables_are_what_the_command_prints():
    doc = (REPO_ROOT / "docs" / "topologies.md").read_text()
    for marker, args in [("k=1", []), ("k=2", ["--peers-per-round", "2"])]:
        block = doc.split(f"<!-- table {marker} -->\n")[1].split("\n<!-- end -->")[0].splitlines()
        printed = invoke("topology", "table", *args).output.splitlines()
        assert block[:2] == printed[:2] and set(block) <= set(printed) and len(block) > 10


def test_draw_rounds_draws_one_panel_per_round(tmp_path):
    pytest.importorskip("matplotlib")
    from gossiprl.draw import draw_rounds

    draw_rounds(make("bipartite-exponential", 8), tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(TopologyError, match="at most 64"):
        draw_rounds(make("ring", 65), tmp_path / "r.png")


def test_from_spec_reads_names_with_options_and_matrix_files(tmp_path):
    assert (
        topologies.from_spec("sparse", 8, peers=None, time_varying=False).digest()
        == topologies.make("sparse", 8).digest()
    )
    assert topologies.from_spec("sparse", 8, time_varying=True).period == 3
    path = tmp_path / "m.npy"
    np.save(path, topologies.make("ring", 3).matrix)
    assert topologies.from_spec(str(path)).n == 3
    with pytest.raises(TopologyError, match="3x3 matrix but the swarm has 4 agents"):
        topologies.from_spec(str(path), 4)
    with pytest.raises(TopologyError, match="options peers are for named topologies"):
        topologies.from_spec(str(path), peers=2)
    with pytest.raises(TopologyError, match="needs the number of agents"):
        topologies.from_spec("ring")
    with pytest.raises(TopologyError, match="neither a topology"):
        topologies.from_spec("mesh", 4)


def test_star_hub_hears_everyone_and_leaves_hear_the_hub():
    t = make("star", 5)
    assert t.out_peers(0) == (1, 2, 3, 4) and all(t.out_peers(i) == t.in_peers(i) == (0,) for i in range(1, 5))
    assert t.weights(0) == {r: 0.2 for r in range(5)} and t.weights(3) == {0: 0.5, 3: 0.5}
    assert make("star", 4, hub=2).out_peers(2) == (0, 1, 3) and make("star", 4, hub=2).in_peers(0) == (2,)
    assert hears_everyone([t.matrix]) and not t.diagnostics().exact
    with pytest.raises(TopologyError, match="hub must be a rank from 0 to 3"):
        make("star", 4, hub=4)


def test_tree_links_parents_and_children_in_rank_order():
    t = make("tree", 8)  # binary: 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6; 3 -> 7
    assert [t.out_peers(i) for i in range(8)] == [(1, 2), (0, 3, 4), (0, 5, 6), (1, 7), (1,), (2,), (2,), (3,)]
    assert all(t.out_peers(i) == t.in_peers(i) for i in range(8)) and hears_everyone([t.matrix])
    assert make("tree", 7, arity=3).out_peers(0) == (1, 2, 3) and make("tree", 4, arity=1).out_peers(1) == (0, 2)
    with pytest.raises(TopologyError, match="arity must be >= 1"):
        make("tree", 4, arity=0)
    x = np.random.default_rng(1).normal(size=(8, 2))
    for _ in range(t.diagnostics().rounds_to_target + 50):  # row-stochastic and connected: agents agree
        x = t.matrix @ x
    assert np.ptp(x, axis=0).max() < 1e-2 * 4
