"""The graph families of the decentralized-training literature, as one period of mixing matrices.

The first five are GALA's and SGP's ``graph_manager.py`` graphs: every rank keeps a *phone
book*, an ordered list of the peers it may send to, and in each round it sends to
``peers_per_round`` consecutive entries of it, the window moving on by that many entries per
round (SGP's ``_rotate_group_indices``). Every rank uses the same window positions, so a
round's graph is a set of permutations and every agent hears from exactly as many peers as it
sends to. The others are the graphs later work found mix best per byte sent: the one-peer
exponential graph (Ying et al., NeurIPS 2021), the hypercube, the 2-D torus and random
regular graphs. Then the two shapes of the parallel-RL systems PALA grew out of: the star (one hub,
a parameter server that also learns) and the k-ary tree. Weights are uniform over self and the
round's in-peers (the PALA update), so every matrix here is row-stochastic, and doubly stochastic
where each round is regular (the star and the tree are not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from .errors import TopologyError, _integer

_REGULAR_TRIES = 1000  # pairing-model draws before random-regular gives up on a (n, degree)


def _log2_floor(m: int) -> int:
    """int(log2(m)) exactly; SGP's int(math.log(m, 2)) is the same wherever floats round right."""
    return m.bit_length() - 1


def _forward_backward(n: int, offsets, passive_backward_first: bool) -> list[list[int]]:
    """A phone book from (offset) steps: forward peer then backward peer, duplicates and self dropped.

    In GALA's bipartite graphs the passive (even) ranks list the backward peer first; that is
    what makes rank 0 and rank n-1 pair up in round 0 instead of both sending to rank 1.
    """
    book = []
    for rank in range(n):
        group: list[int] = []
        backward_first = passive_backward_first and rank % 2 == 0
        for o in offsets:
            f, b = (rank + o) % n, (rank - o) % n
            for peer in (b, f) if backward_first else (f, b):
                if peer != rank and peer not in group:
                    group.append(peer)
        book.append(group)
    return book


def phone_book(name: str, n: int) -> list[list[int]]:
    """Each rank's ordered out-peer list in GALA's/SGP's graph ``name`` (see docs/topologies.md)."""
    if name not in PHONE_BOOK_FAMILIES:
        raise TopologyError(f"{name!r} has no phone book; these do: {', '.join(PHONE_BOOK_FAMILIES)}")
    n = _integer(n, "n")
    if n < 1:
        raise TopologyError(f"n must be >= 1 (the number of agents), got {n}")
    if name.startswith("bipartite") and n % 2:
        raise TopologyError(f"{name} needs an even number of agents (even ranks only talk to odd ones), got n={n}")
    if n == 1:
        return [[]]
    top = _log2_floor(n - 1)
    if name == "gala-exponential":  # DynamicDirectedExponentialGraph
        return _forward_backward(n, [2**i for i in range(top + 1)], False)
    if name == "bipartite-exponential":  # DynamicBipartiteExponentialGraph: odd offsets 1, 1 + 2^i
        return _forward_backward(n, [1] + [1 + 2**i for i in range(1, top + 1)], True)
    if name in ("directed-linear", "static-linear"):  # DynamicDirectedLinearGraph: odd offsets
        return _forward_backward(n, range(1, n, 2), False)
    return _forward_backward(n, range(1, n, 2), True)  # DynamicBipartiteLinearGraph: offsets changing parity


def _from_adjacency(sends: np.ndarray) -> np.ndarray:
    """Uniform weights over self and in-peers from ``sends[i, j]`` (i sends to j)."""
    hears = sends.T.astype(float)
    np.fill_diagonal(hears, 1.0)
    return hears / hears.sum(axis=1, keepdims=True)


def _phone_book_rounds(name: str, n: int, options: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
    book = phone_book(name, n)
    size = len(book[0])
    normalized = {}
    k = 1
    if "peers_per_round" in options:
        k = _integer(options["peers_per_round"], "peers_per_round")
        if not 1 <= k <= max(size, 1):
            raise TopologyError(
                f"peers_per_round must be from 1 to {size} (the phone book's length) for {name} with n={n}, got {k}"
            )
        normalized["peers_per_round"] = k
    if size == 0:
        return [np.eye(1)], normalized
    period = 1 if name == "static-linear" else size // math.gcd(size, k)
    rounds = []
    for r in range(period):
        sends = np.zeros((n, n), dtype=bool)
        for g in range(k):
            slot = (r * k + g) % size
            sends[np.arange(n), [peers[slot] for peers in book]] = True
        rounds.append(_from_adjacency(sends))
    return rounds, normalized


def _one_peer_exponential(n: int, options: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
    """Round t: i sends to i + 2^(t mod ceil(log2 n)), weight 1/2 each (Ying et al. 2021)."""
    if n == 1:
        return [np.eye(1)], {}
    rounds = []
    for t in range(_log2_floor(n - 1) + 1):
        sends = np.zeros((n, n), dtype=bool)
        sends[np.arange(n), (np.arange(n) + 2**t) % n] = True
        rounds.append(_from_adjacency(sends))
    return rounds, {}


def _hypercube(n: int, options: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
    """i <-> i XOR 2^b: log2 n neighbours; time-varying, one dimension per round, it averages
    exactly after log2 n rounds with one letter per agent per round."""
    if n & (n - 1):
        raise TopologyError(f"hypercube needs n to be a power of two (1, 2, 4, 8, ...), got n={n}")
    normalized, time_varying = _flag(options, "time_varying")
    dims = [1 << b for b in range(_log2_floor(n))] if n > 1 else []
    ranks = np.arange(n)
    groups = [[d] for d in dims] if time_varying and len(dims) > 1 else [dims]
    rounds = []
    for group in groups:
        sends = np.zeros((n, n), dtype=bool)
        for d in group:
            sends[ranks, ranks ^ d] = True
        rounds.append(_from_adjacency(sends))
    return rounds, normalized


def _torus(n: int, options: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
    """rows x cols grid with wrap-around, four neighbours (fewer where a side is 1 or 2)."""
    normalized = {}
    if "rows" in options:
        rows = _integer(options["rows"], "rows")
        if rows < 1 or n % rows:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            raise TopologyError(f"rows must divide n={n} (one of {', '.join(map(str, divisors))}), got {rows}")
        normalized["rows"] = rows
    else:
        rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    cols = n // rows
    r, c = np.divmod(np.arange(n), cols)
    sends = np.zeros((n, n), dtype=bool)
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        sends[np.arange(n), ((r + dr) % rows) * cols + (c + dc) % cols] = True
    np.fill_diagonal(sends, False)
    return [_from_adjacency(sends)], normalized


def _random_regular(n: int, options: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
    """A connected simple d-regular graph drawn by the pairing model, redrawn until simple and
    connected; the same (n, degree, seed) gives the same graph on every host."""
    normalized = {}
    degree = min(3, n - 1)
    if "degree" in options:
        degree = _integer(options["degree"], "degree")
        normalized["degree"] = degree
    seed = 0
    if "seed" in options:
        seed = _integer(options["seed"], "seed")
        normalized["seed"] = seed
    if not 1 <= degree <= n - 1 or (n * degree) % 2:
        raise TopologyError(
            f"degree must be from 1 to {n - 1} with n * degree even (every edge has two ends), "
            f"got degree={degree} for n={n}"
        )
    if n == 1:
        return [np.eye(1)], normalized
    rng = np.random.default_rng(seed)
    for _ in range(_REGULAR_TRIES):
        stubs = rng.permutation(np.repeat(np.arange(n), degree)).reshape(-1, 2)
        a, b = stubs[:, 0], stubs[:, 1]
        if (a == b).any():
            continue
        sends = np.zeros((n, n), dtype=bool)
        sends[a, b] = sends[b, a] = True
        if sends.sum() == n * degree and _connected(sends):
            return [_from_adjacency(sends)], normalized
    raise TopologyError(
        f"no connected simple {degree}-regular graph on {n} agents in {_REGULAR_TRIES} draws "
        f"with seed {seed}; try another seed or a degree far from n - 1"
    )


def _star(n: int, options: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
    """The hub exchanges with every leaf, leaves only with the hub: the parameter-server shape of
    A3C, DPPO and Gorila, with the server as one more learner. With uniform weights the hub takes
    1/n of each agent and each leaf half its own and half the hub's: row- but not doubly
    stochastic, so consensus lands near, not on, the plain mean; the hub's links carry n - 1
    letters a round each way."""
    normalized = {}
    hub = 0
    if "hub" in options:
        hub = _integer(options["hub"], "hub")
        if not 0 <= hub < n:
            raise TopologyError(f"hub must be a rank from 0 to {n - 1}, got {hub}")
        normalized["hub"] = hub
    sends = np.zeros((n, n), dtype=bool)
    sends[hub, :] = sends[:, hub] = True
    np.fill_diagonal(sends, False)
    return [_from_adjacency(sends)], normalized


def _tree(n: int, options: Mapping[str, Any]) -> tuple[list[np.ndarray], dict]:
    """A complete k-ary tree in rank order (rank i's parent is (i - 1) // k): every agent
    exchanges with its parent and its children, the layout of hierarchical parameter servers and
    tree all-reduce. Letters cross the tree in about 2 log_k n rounds."""
    normalized = {}
    arity = 2
    if "arity" in options:
        arity = _integer(options["arity"], "arity")
        if arity < 1:
            raise TopologyError(f"arity must be >= 1 (children per agent; 1 is a line), got {arity}")
        normalized["arity"] = arity
    sends = np.zeros((n, n), dtype=bool)
    child = np.arange(1, n)
    parent = (child - 1) // arity
    sends[child, parent] = sends[parent, child] = True
    return [_from_adjacency(sends)], normalized


def _connected(sym: np.ndarray) -> bool:
    seen = np.zeros(len(sym), dtype=bool)
    seen[0] = True
    frontier = np.array([0])
    while frontier.size:
        new = sym[frontier].any(axis=0) & ~seen
        seen |= new
        frontier = np.flatnonzero(new)
    return bool(seen.all())


def _flag(options: Mapping[str, Any], key: str) -> tuple[dict, bool]:
    value = options.get(key, False)
    if not isinstance(value, (bool, np.bool_)):
        raise TopologyError(f"{key} must be True or False, got {value!r}")
    return ({key: bool(value)} if key in options else {}), bool(value)


def metropolis_hastings(adjacency: np.ndarray) -> np.ndarray:
    """Metropolis-Hastings weights of an undirected graph: w_ij = 1 / (1 + max(d_i, d_j)) on each
    edge, the rest on self. Symmetric, hence doubly stochastic on any degree sequence, so gossip
    lands on the exact mean where uniform weights would favour the well-connected agents."""
    a = np.asarray(adjacency) != 0
    np.fill_diagonal(a, False)
    if not (a == a.T).all():
        i, j = np.argwhere(a != a.T)[0]
        raise TopologyError(
            f"Metropolis-Hastings weights need an undirected graph, but the edge between "
            f"{min(i, j)} and {max(i, j)} goes one way only"
        )
    degree = a.sum(axis=1)
    w = np.where(a, 1.0 / (1.0 + np.maximum.outer(degree, degree)), 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


Builder = Callable[[int, Mapping[str, Any]], "tuple[list[np.ndarray], dict]"]
PHONE_BOOK_FAMILIES = (
    "gala-exponential",
    "bipartite-exponential",
    "bipartite-linear",
    "directed-linear",
    "static-linear",
)
FAMILIES: dict[str, tuple[tuple[str, ...], Builder]] = {
    **{name: (("peers_per_round",), partial(_phone_book_rounds, name)) for name in PHONE_BOOK_FAMILIES},
    "one-peer-exponential": ((), _one_peer_exponential),
    "hypercube": (("time_varying",), _hypercube),
    "torus": (("rows",), _torus),
    "random-regular": (("degree", "seed"), _random_regular),
    "star": (("hub",), _star),
    "tree": (("arity",), _tree),
}
