"""Gossip topologies: who mixes with whom, and with what weights (PALA / GALA).

A topology is the row-stochastic mixing matrix P that every agent applies after each
optimizer step, x_i <- sum_j P[i, j] x_j. Row i is agent i's own business (the weights it
gives to what it received), so row-stochastic is all the algorithm needs; agent j is an
in-peer of i (edge j -> i, j sends to i) exactly when j != i and P[i, j] > 0.

The package imports nothing but numpy and the standard library, so the broker, the
clients, the config tools and offline analysis all share the same graph maths without
pulling in zmq or torch. Build topologies with :func:`make`, :func:`from_matrix` or
:func:`from_dict`; each validates, so a :class:`Topology` in hand always satisfies the
convergence conditions of GALA's proof (row-stochastic, strongly connected).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .diagnostics import MAX_DENSE_N, Diagnostics, check_size, diagnose, summary_lines
from .errors import TopologyError, _integer, did_you_mean
from .families import FAMILIES, metropolis_hastings, phone_book

__all__ = [
    "MAX_DENSE_N",
    "NAMES",
    "Diagnostics",
    "Topology",
    "TopologyError",
    "from_dict",
    "from_matrix",
    "from_spec",
    "make",
    "metropolis",
    "options",
    "phone_book",
]

NAMES = ("ring", "sparse", "full", *FAMILIES)
_OPTIONS = {
    "ring": (),
    "sparse": ("peers", "time_varying"),
    "full": (),
    **{name: options for name, (options, _) in FAMILIES.items()},
}
_DICT_KEYS = ("name", "n", "options", "matrix", "digest")
_ROW_SUM_ATOL = 1e-6
_DIGEST_DECIMALS = 12
_MAX_SHOWN = 16  # describe() prints the full matrix up to this many agents
_MAX_PEER_LINES = 64  # ... and every rank's peers up to this many; the first and last few beyond
_ZERO = 1e-12  # eigenvalue moduli below this are numerical noise, not slow modes


class Topology:
    """An immutable, validated mixing topology, static or periodic in the gossip round.

    Immutable because the broker and every client must agree on it for the whole run (they
    compare :meth:`digest`); a time-varying topology is a fixed cycle of static graphs, one
    per round, which :meth:`at` hands out.
    """

    __slots__ = ("_name", "_n", "_options", "_rounds", "_views", "_slem")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("build a Topology with topologies.make(), from_matrix() or from_dict(), which validate it")

    @classmethod
    def _build(
        cls,
        name: str,
        rounds: Sequence[np.ndarray],
        options: Mapping[str, Any],
        views: Sequence[Topology] | None = None,
    ) -> Topology:
        """Assemble from already validated read-only matrices (one per round of the period)."""
        self = object.__new__(cls)
        for slot, value in (
            ("_name", name),
            ("_n", int(rounds[0].shape[0])),
            ("_options", dict(options)),
            ("_rounds", tuple(rounds)),
            ("_views", None if views is None else tuple(views)),
            ("_slem", None),
        ):
            object.__setattr__(self, slot, value)
        return self

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"Topology is immutable (tried to set {key!r}); build a new one with make()")

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickle (multiprocessing, copy) through to_dict/from_dict: slots plus the immutability
        guard defeat the default protocol, and this way an unpickled topology is re-validated."""
        return from_dict, (self.to_dict(),)

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self._options.items())
        return f"Topology({self._name!r}, n={self._n}{opts})"

    # ------------------------------------------------------------------ structure
    @property
    def name(self) -> str:
        return self._name

    @property
    def n(self) -> int:
        return self._n

    @property
    def matrix(self) -> np.ndarray:
        """P at round 0 (read-only); a time-varying topology's other rounds come from :meth:`at`."""
        return self._rounds[0]

    @property
    def time_varying(self) -> bool:
        """True when the graph changes with the round; a one-round cycle (e.g. sparse, n <= 2) is static."""
        return self._views is not None

    @property
    def period(self) -> int:
        return len(self._rounds)

    def at(self, round: int = 0) -> Topology:
        """The static graph in force at gossip round ``round`` (rounds cycle with the period)."""
        t = _integer(round, "round")
        if t < 0:
            raise TopologyError(f"round must be >= 0 (gossip rounds count from 0), got {t}")
        return self if self._views is None else self._views[t % len(self._views)]

    def in_peers(self, i: int, round: int = 0) -> tuple[int, ...]:
        """Ranks whose parameters agent ``i`` mixes in at that round (sorted, never ``i``)."""
        i = self._rank(i)
        row = self.at(round).matrix[i]
        return tuple(int(j) for j in np.flatnonzero(row > 0) if j != i)

    def out_peers(self, i: int, round: int = 0) -> tuple[int, ...]:
        """Ranks that mix in agent ``i``'s parameters at that round, i.e. where ``i`` must send."""
        i = self._rank(i)
        column = self.at(round).matrix[:, i]
        return tuple(int(j) for j in np.flatnonzero(column > 0) if j != i)

    def weights(self, i: int, round: int = 0) -> dict[int, float]:
        """Row ``i``: weight per in-peer, plus ``i`` itself (present even when its weight is 0,
        so a mixer can always look up its own share)."""
        i = self._rank(i)
        row = self.at(round).matrix[i]
        return {j: float(row[j]) for j in sorted((*self.in_peers(i, round), i))}

    def without(self, gone: Iterable[int]) -> Topology:
        """The topology the survivors use when the agents in ``gone`` are dead: each dead agent is
        bypassed, its in-peers wired straight to its out-peers.

        Agent i's weight on a dead d goes to what d itself would have mixed: d's in-peers, in
        the proportions of d's row (d's own share dropped). A directed ring thus becomes the
        ring of the survivors with the same 1/2 weights, rows stay stochastic, and since every
        path through d is replaced by a direct edge the survivors stay strongly connected.
        A dead agent keeps only itself (weight 1) and no peers. Rank numbers do not change.
        """
        dead = sorted({self._rank(d) for d in gone})
        if not dead:
            return self
        rounds = [_bypass(p, dead) for p in self._rounds]
        name = f"{self._name} without {_ranges(dead, braces=True)}"
        views = None
        if self._views is not None:
            views = [
                Topology._build(f"{view.name} without {_ranges(dead, braces=True)}", (p,), self._options)
                for view, p in zip(self._views, rounds)
            ]
        return Topology._build(name, rounds, self._options, views)

    def _rank(self, i: int) -> int:
        rank = _integer(i, "rank")
        if not 0 <= rank < self._n:
            raise TopologyError(f"rank {rank} out of range: this topology has ranks 0..{self._n - 1}")
        return rank

    # ------------------------------------------------------------------ spectrum
    @property
    def slem(self) -> float:
        """Per-round contraction of the disagreement between agents (0 = exact in one round, 1 = never).

        For a time-varying topology one period's product is what is applied repeatedly, so its
        SLEM is taken and converted back to a per-round factor with the 1/period root.
        """
        if self._slem is None:
            check_size(self._n, "the spectrum (slem)")
            product = self._rounds[0]
            for p in self._rounds[1:]:
                product = p @ product
            object.__setattr__(self, "_slem", _second_modulus(product) ** (1.0 / self.period))
        return self._slem

    @property
    def spectral_gap(self) -> float:
        return 1.0 - self.slem

    def diagnostics(self, shrink: float = 100.0) -> Diagnostics:
        """Per-period contraction, rounds to shrink disagreement ``shrink``-fold, exact averaging."""
        return diagnose(list(self._rounds), shrink)

    @property
    def doubly_stochastic(self) -> bool:
        """Whether columns also sum to 1, i.e. consensus lands on the plain average of the agents
        rather than on a weighted one that favours well-listened-to agents."""
        return all(bool(np.allclose(p.sum(axis=0), 1.0, rtol=0.0, atol=_ROW_SUM_ATOL)) for p in self._rounds)

    # ------------------------------------------------------------------ identity and transport
    def digest(self) -> str:
        """Short content hash (n and one period of matrices) so processes can check they agree;
        rounding to 12 decimals makes it survive a text round trip of the matrix."""
        h = hashlib.sha256(f"n={self._n}".encode())
        for p in self._rounds:
            # + 0.0 turns -0.0 into 0.0, which would otherwise hash differently
            h.update((np.round(p, _DIGEST_DECIMALS) + 0.0).astype("<f8").tobytes())
        return h.hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """JSON/msgpack-able form for config files and the wire.

        Named topologies are rebuilt from (name, n, options), so ``matrix`` (round 0) is for
        people reading the config; ``digest`` lets :func:`from_dict` prove it rebuilt the same thing.
        """
        return {
            "name": self._name,
            "n": self._n,
            "options": dict(self._options),
            "matrix": self.matrix.tolist(),
            "digest": self.digest(),
        }

    # ------------------------------------------------------------------ human view
    def describe(self) -> str:
        """Everything needed to judge a topology before a run: the graph, and how fast it mixes."""
        lines = [self._headline()]
        for r, view in enumerate(self._views or (self,)):
            if self.time_varying:
                lines.append(f"round {r} (every round t with t % {self.period} == {r}):")
            lines += view._matrix_lines() + view._peer_lines()
        if self._n > MAX_DENSE_N:
            lines.append(
                f"spectrum and consensus diagnostics skipped: they need dense n x n algebra, done up to "
                f"n={MAX_DENSE_N} agents"
            )
        else:
            per = " per round (from the product over one period)" if self.time_varying else ""
            lines.append(f"slem {self.slem:.4f}, spectral gap {self.spectral_gap:.4f}{per}")
            lines += summary_lines(self.diagnostics())
        if self.doubly_stochastic:
            lines.append("doubly stochastic: yes (agents converge to the exact average)")
        else:
            lines.append("doubly stochastic: no (agents converge to a weighted average, not the plain mean)")
        if self._n <= MAX_DENSE_N:
            lines.append(self._interpretation())
        return "\n".join(lines)

    def _headline(self) -> str:
        kind = f"time-varying, period {self.period}" if self.time_varying else "static"
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"topology {self._name!r}: n={self._n} agents, {kind}" + (f", options: {opts}" if opts else "")

    def _matrix_lines(self) -> list[str]:
        n = self._n
        if n > _MAX_SHOWN:
            return [f"  matrix: {n}x{n}, too large to show (more than {_MAX_SHOWN} agents); peer lists below"]
        label = len(str(n - 1))
        width = max(5, label)
        header = " " * (label + 3) + " ".join(f"{j:>{width}}" for j in range(n))
        rows = [f"  {i:>{label}} " + " ".join(f"{_cell(x):>{width}}" for x in self.matrix[i]) for i in range(n)]
        return ["  matrix (row i = the weights agent i gives to agent j; '.' = 0):", header, *rows]

    def _peer_lines(self) -> list[str]:
        n = self._n
        label = len(str(n - 1))
        shown = range(n) if n <= _MAX_PEER_LINES else [*range(8), n - 2, n - 1]
        lines = ["  peers (in = hears from, out = sends to):"] + [
            f"    rank {i:>{label}}: in {_ranges(self.in_peers(i)) or '-'} | out {_ranges(self.out_peers(i)) or '-'}"
            for i in shown
        ]
        if n > _MAX_PEER_LINES:
            lines.insert(9, f"    ... ranks 8-{n - 3} not shown (more than {_MAX_PEER_LINES} agents)")
        return lines

    def _interpretation(self) -> str:
        s = self.slem
        if self._n == 1:
            return "a single agent: nothing to mix"
        if s >= 1.0 - 1e-9:
            return (
                "consensus error never shrinks (slem 1): the matrix is periodic (e.g. zero diagonal), "
                "so agents oscillate; give every agent some weight on itself"
            )
        if s < 1e-9:
            after = f"one period ({self.period} rounds)" if self.time_varying else "one round"
            return f"consensus is exact after {after}"
        rounds = math.ceil(math.log(100.0) / -math.log(s))
        return f"consensus error shrinks by ~{s:.3f}x per round; ~{rounds} rounds to shrink it 100x"


# ---------------------------------------------------------------------- constructors
def options(name: str) -> tuple[str, ...]:
    """The options :func:`make` accepts for ``name``."""
    if name not in _OPTIONS:
        raise TopologyError(f"unknown topology {name!r}; valid names: {', '.join(NAMES)}")
    return _OPTIONS[name]


def make(name: str, n: int, **options: Any) -> Topology:
    """Build a named topology.

    ``ring``: directed ring, i sends to (i + 1) % n (the paper's topology).
    ``sparse``: directed exponential graph, i sends to (i + 2**k) % n for k < ``peers``
    (default ceil(log2 n)), duplicates and self dropped; with ``time_varying=True`` it sends
    to one of those per round, (i + 2**(t mod K)) % n, so the period K is the number of
    distinct offsets (ceil(log2 n) by default).
    ``full``: everyone hears everyone, uniform 1/n.
    ``gala-exponential``, ``bipartite-exponential``, ``bipartite-linear``, ``directed-linear``,
    ``static-linear``: GALA's and SGP's graphs, ``peers_per_round`` entries of each rank's phone
    book per round (see :mod:`topologies.families` and docs/topologies.md).
    ``one-peer-exponential``, ``hypercube`` (``time_varying``), ``torus`` (``rows``),
    ``random-regular`` (``degree``, ``seed``): the graphs later work found to mix best per byte.
    ``star`` (``hub``) and ``tree`` (``arity``): the parameter-server and hierarchical shapes.
    Weights are uniform over self and in-peers, the PALA update (x_i + sum m_j) / (1 + |N_in|).
    """
    if not isinstance(name, str) or name not in NAMES:
        raise TopologyError(
            f"unknown topology {name!r}; valid names: {', '.join(NAMES)} (or from_matrix() for a matrix of your own)"
            + did_you_mean(name, NAMES)
        )
    n = _integer(n, "n")
    if n < 1:
        raise TopologyError(f"n must be >= 1 (the number of agents), got {n}")
    valid = _OPTIONS[name]
    for key in options:
        if key not in valid:
            raise TopologyError(
                f"unknown option {key!r} for {name!r}; valid options: {', '.join(valid) or 'none'}"
                + did_you_mean(key, valid)
            )
    if name == "ring":
        return Topology._build(name, (_shift_matrix(n, _offsets(n, [1])),), {})
    if name == "full":
        return Topology._build(name, (_read_only(np.full((n, n), 1.0 / n)),), {})
    if name == "sparse":
        return _sparse(n, options)
    rounds, normalized = FAMILIES[name][1](n, options)
    return _periodic(name, [_read_only(p) for p in rounds], normalized)


def _sparse(n: int, options: Mapping[str, Any]) -> Topology:
    normalized: dict[str, Any] = {}
    if "peers" in options:
        peers = _integer(options["peers"], "peers")
        if n == 1:
            raise TopologyError("sparse with n=1 has no other agent to send to; leave peers unset")
        if not 1 <= peers <= n - 1:
            raise TopologyError(f"peers must be from 1 to {n - 1} (n - 1) for sparse with n={n}, got {peers}")
        normalized["peers"] = peers
    else:
        peers = max(1, (n - 1).bit_length())  # ceil(log2 n)
    time_varying = options.get("time_varying", False)
    if not isinstance(time_varying, (bool, np.bool_)):
        raise TopologyError(f"time_varying must be True or False, got {time_varying!r}")
    if "time_varying" in options:
        normalized["time_varying"] = bool(time_varying)
    offsets = _offsets(n, [pow(2, k, n) for k in range(peers)])
    if not time_varying or len(offsets) <= 1:
        return Topology._build("sparse", (_shift_matrix(n, offsets),), normalized)
    return _periodic("sparse", [_shift_matrix(n, [o]) for o in offsets], normalized)


def _periodic(name: str, rounds: Sequence[np.ndarray], options: Mapping[str, Any]) -> Topology:
    """A topology cycling through ``rounds``; one round is a static topology."""
    if len(rounds) == 1:
        return Topology._build(name, rounds, options)
    views = [Topology._build(_round_name(name, r), (p,), options) for r, p in enumerate(rounds)]
    return Topology._build(name, rounds, options, views)


def metropolis(source: Any) -> Topology:
    """A static topology with Metropolis-Hastings weights on an undirected graph of your own.

    ``source`` is an adjacency matrix (array-like, .npy or .csv; nonzero off the diagonal =
    edge, which must go both ways). The weights are doubly stochastic whatever the degrees,
    so consensus is on the exact mean; uniform weights would favour the best-connected agents.
    """
    if isinstance(source, (str, os.PathLike)):
        source = _load(Path(source))
    try:
        adjacency = np.asarray(source, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TopologyError(f"adjacency must be a square 2-D array of numbers: {exc}") from exc
    if adjacency.ndim != 2 or adjacency.shape[0] != adjacency.shape[1] or adjacency.shape[0] < 1:
        raise TopologyError(f"adjacency must be a non-empty square 2-D array (n x n), got shape {adjacency.shape}")
    p = _checked_matrix(metropolis_hastings(adjacency))
    _check_strongly_connected([p])
    return Topology._build("metropolis", (p,), {})


def from_spec(spec: str, n: int | None = None, **options: Any) -> Topology:
    """The topology a command line or a config names: a family with its options, or a matrix file.

    Options given as None or False are the family's defaults, so a caller can pass every flag it
    has without knowing which family uses which; an option the family lacks is refused by make().
    """
    given = {key: value for key, value in options.items() if value is not None and value is not False}
    if spec in NAMES:
        if n is None:
            raise TopologyError(f"{spec!r} needs the number of agents")
        return make(spec, n, **given)
    if not Path(spec).is_file():
        raise TopologyError(
            f"{spec!r} is neither a topology ({', '.join(NAMES)}) nor an existing .npy/.csv file "
            "holding a row-stochastic matrix" + did_you_mean(spec, NAMES)
        )
    if given:
        raise TopologyError(
            f"options {', '.join(sorted(given))} are for named topologies, not for the matrix in {spec}"
        )
    topo = from_matrix(spec)
    if n is not None and topo.n != n:
        raise TopologyError(f"{spec} is a {topo.n}x{topo.n} matrix but the swarm has {n} agents")
    return topo


def from_matrix(source: Any) -> Topology:
    """A static topology from your own mixing matrix: an array-like, or a .npy / .csv file path.

    The matrix is taken as given (no renormalisation), so what you wrote is what is mixed.
    """
    if isinstance(source, (str, os.PathLike)):
        source = _load(Path(source))
    p = _checked_matrix(source)
    _check_strongly_connected([p])
    return Topology._build("matrix", (p,), {})


def from_dict(d: Mapping[str, Any]) -> Topology:
    """Inverse of :meth:`Topology.to_dict`, strict so a hand-edited config cannot drift silently.

    Named topologies are rebuilt with :func:`make`; a ``matrix`` or ``digest`` present must
    agree with the rebuilt one. Other names are built from ``matrix``.
    """
    if not isinstance(d, Mapping):
        raise TopologyError(
            f"a topology dict must be a mapping with keys {', '.join(_DICT_KEYS)}; got {type(d).__name__}"
        )
    for key in d:
        if key not in _DICT_KEYS:
            raise TopologyError(f"unknown key {key!r} in topology dict; valid keys: {', '.join(_DICT_KEYS)}")
    if "name" not in d:
        raise TopologyError(f"topology dict needs a 'name' (one of {', '.join(NAMES)}, or any name with a 'matrix')")
    name, options = d["name"], d.get("options") or {}
    if not isinstance(name, str):
        raise TopologyError(f"topology name must be a string, got {name!r}")
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise TopologyError(f"topology options must be a mapping of option name to value, got {options!r}")
    base, round_ = _split_round_name(name)
    if base in NAMES:
        if "n" not in d:
            raise TopologyError(f"topology dict for {base!r} needs 'n' (the number of agents)")
        topology = make(base, d["n"], **options)
        if round_ is not None:
            if round_ >= topology.period:
                raise TopologyError(f"{name!r}: {base!r} with these options has rounds 0..{topology.period - 1}")
            topology = topology.at(round_)
        if "matrix" in d:
            _check_same_matrix(d["matrix"], topology)
    else:
        if "matrix" not in d:
            raise TopologyError(
                f"unknown topology {name!r}: valid names are {', '.join(NAMES)}; any other name needs its 'matrix'"
            )
        if options:
            raise TopologyError(
                f"options are only meaningful for the named topologies ({', '.join(NAMES)}); "
                f"{name!r} is defined by its matrix alone"
            )
        p = _checked_matrix(d["matrix"])
        _check_strongly_connected([p])
        if "n" in d and d["n"] != p.shape[0]:
            raise TopologyError(f"topology dict says n={d['n']!r} but its matrix is {p.shape[0]}x{p.shape[0]}")
        topology = Topology._build(name, (p,), {})
    if "digest" in d and d["digest"] != topology.digest():
        raise TopologyError(
            f"digest mismatch: the dict says {d['digest']!r} but it rebuilds to "
            f"{topology.digest()!r}; the dict was edited or comes from another version"
        )
    return topology


# ---------------------------------------------------------------------- helpers
def _round_name(name: str, r: int) -> str:
    """Name of round r's static graph: readable in logs and parseable back by from_dict."""
    return f"{name}@{r}"


def _split_round_name(name: str) -> tuple[str, int | None]:
    base, sep, r = name.rpartition("@")
    if sep and base in NAMES and r.isdigit():
        return base, int(r)
    return name, None


def _check_same_matrix(given: Any, topology: Topology) -> None:
    try:
        m = np.asarray(given, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TopologyError(f"the dict's 'matrix' is not a numeric n x n array: {exc}") from exc
    if m.shape != topology.matrix.shape or not np.allclose(m, topology.matrix, rtol=0.0, atol=1e-9):
        raise TopologyError(
            f"the dict's 'matrix' does not match {topology.name!r} with n={topology.n} and "
            "its options; fix it or drop it (named topologies are rebuilt from name, n, options)"
        )


def _offsets(n: int, offsets: Iterable[int]) -> list[int]:
    """Distinct shifts mod n in first-seen order (the order time-varying rounds use), self dropped."""
    return [o for o in dict.fromkeys(o % n for o in offsets) if o != 0]


def _shift_matrix(n: int, offsets: Sequence[int]) -> np.ndarray:
    """Circulant P where i hears from (i - o) % n for each offset o, uniform over self and peers."""
    p = np.zeros((n, n))
    rows = np.arange(n)
    w = 1.0 / (1 + len(offsets))
    p[rows, rows] = w
    for o in offsets:
        p[rows, (rows - o) % n] = w
    return _read_only(p)


def _bypass(p: np.ndarray, dead: Sequence[int]) -> np.ndarray:
    """Eliminate each dead agent in turn (see Topology.without); exact for any row-stochastic P."""
    p = np.array(p, dtype=float)
    for d in dead:
        share = p[:, d].copy()
        share[d] = 0.0
        p[:, d] = 0.0
        row = p[d].copy()
        row[d] = 0.0
        spread = row.sum()
        for i in np.flatnonzero(share > 0):
            if spread > _ZERO:
                p[i] += share[i] * row / spread
            else:  # d heard from nobody alive: i keeps the weight itself
                p[i, i] += share[i]
        p[d] = 0.0
        p[d, d] = 1.0
    return _read_only(p)


def _read_only(p: np.ndarray) -> np.ndarray:
    p.setflags(write=False)
    return p


def _load(path: Path) -> np.ndarray:
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".csv"):
        raise TopologyError(f"matrix file must end in .npy or .csv (comma separated), got {str(path)!r}")
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise TopologyError(f"cannot read a matrix from {str(path)!r}: {exc}") from exc


def _checked_matrix(source: Any) -> np.ndarray:
    """A validated read-only float64 copy: square, finite, nonnegative, rows summing to 1."""
    try:
        raw = np.asarray(source)
    except (TypeError, ValueError) as exc:
        raise TopologyError(f"matrix must be a square 2-D array of numbers: {exc}") from exc
    if raw.dtype.kind not in "iuf":
        raise TopologyError(f"matrix entries must be real numbers, got dtype {raw.dtype}")
    if raw.ndim != 2:
        raise TopologyError(f"matrix must be 2-D (n x n), got shape {raw.shape}")
    if raw.shape[0] != raw.shape[1]:
        raise TopologyError(f"matrix must be square (n x n), got shape {raw.shape}")
    if raw.shape[0] < 1:
        raise TopologyError("matrix is empty (0x0): n must be >= 1 (at least one agent)")
    p = raw.astype(np.float64, copy=True)
    bad = np.argwhere(~np.isfinite(p))
    if bad.size:
        i, j = bad[0]
        raise TopologyError(f"matrix entry [{i}, {j}] is {p[i, j]}: all entries must be finite numbers")
    bad = np.argwhere(p < 0)
    if bad.size:
        i, j = bad[0]
        raise TopologyError(f"matrix entry [{i}, {j}] is negative ({p[i, j]}): weights must be >= 0")
    sums = p.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > _ROW_SUM_ATOL)
    if bad.size:
        i = bad[0]
        raise TopologyError(
            f"row {i} sums to {sums[i]:.9g}, but every row must sum to 1 (within "
            f"{_ROW_SUM_ATOL:g}): row i is how agent i splits its weight over the agents"
        )
    return _read_only(p)


def _check_strongly_connected(rounds: Sequence[np.ndarray]) -> None:
    """GALA's convergence proof needs every agent to hear, eventually, from every other one;
    for a time-varying topology the union over one period is what must be connected."""
    hears = np.zeros(rounds[0].shape, dtype=bool)  # hears[i, j]: edge j -> i
    for p in rounds:
        hears |= p > 0
    np.fill_diagonal(hears, False)
    reached = _reachable(hears, 0)  # who hears from agent 0, eventually
    if reached.all():
        reached = _reachable(hears.T, 0)  # whom agent 0 hears from, eventually
        if reached.all():
            return
        deaf, silent = reached, ~reached
    else:
        deaf, silent = ~reached, reached
    raise TopologyError(
        f"not strongly connected: agents {_ranges(np.flatnonzero(deaf), braces=True)} can never "
        f"hear from agents {_ranges(np.flatnonzero(silent), braces=True)}, so gossip cannot "
        "reach consensus (edge j -> i exists where matrix[i, j] > 0)"
    )


def _reachable(hears: np.ndarray, start: int) -> np.ndarray:
    """Breadth-first over a dense boolean matrix; each agent enters the frontier once, so O(n^2)."""
    seen = np.zeros(hears.shape[0], dtype=bool)
    seen[start] = True
    frontier = np.array([start])
    while frontier.size:
        new = hears[:, frontier].any(axis=1) & ~seen
        seen |= new
        frontier = np.flatnonzero(new)
    return seen


def _second_modulus(m: np.ndarray) -> float:
    if m.shape[0] == 1:
        return 0.0
    moduli = np.sort(np.abs(np.linalg.eigvals(m)))[::-1]
    second = float(moduli[1])
    return 0.0 if second < _ZERO else min(1.0, second)


def _ranges(ranks: Iterable[int], braces: bool = False, limit: int = 20) -> str:
    """'0-3, 5, 6, 9': rank sets stay one readable line even for large swarms."""
    runs: list[list[int]] = []
    for r in sorted(int(x) for x in ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    parts = [f"{a}-{b}" if b - a >= 2 else ", ".join(map(str, range(a, b + 1))) for a, b in runs[:limit]]
    if len(runs) > limit:
        parts.append(f"... ({len(runs) - limit} more runs)")
    text = ", ".join(parts)
    return "{" + text + "}" if braces else text


def _cell(x: float) -> str:
    if x == 0:
        return "."
    return "<.001" if x < 0.0005 else f"{x:.3f}"
