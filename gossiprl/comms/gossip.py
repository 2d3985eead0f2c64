"""Gossip mixing: turn the letters a client collected into x_i <- sum_j p_ij x_j, in place.

This is the layer between the transport (GossipClient) and the learner: it knows about
parameters (numpy arrays, or torch tensors on any device) but not about sockets. What it
does to a torch tensor, ``tensors`` does, so importing this module does not import torch.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .client import BrokerUnavailable, GossipClient, GossipStopped, GossipTimeout
from .tensors import (
    accumulator,
    as_like,
    assign,
    copy_of,
    dtype_name,
    flat_view,
    inner,
    is_floating,
    named_tensors,
    sorted_stack,
    squared_norm,
)

log = logging.getLogger("gossiprl.comms.gossip")


AGGREGATES = ("mean", "trimmed-mean", "median")
"""How letters are combined with our own parameters: the mixing matrix's weighted mean (PALA), or a
coordinate-wise robust statistic over our parameters and the letters, each counted once."""

CHUNK = 1 << 17
"""Elements per block of the fused mean (512 KiB of float32): a block of ours and of each letter
stays in the core's L2 cache between the finite check, the distances and the update."""


DEFAULT_DEVIATION_BOUND = 10.0
"""Gossip's default DeviationBound factor: a letter 10x farther than the recent ones is dropped."""


class MixError(TypeError):
    """Parameters that gossip cannot mix (integer tensors); the message names the tensor."""


@dataclass
class MixResult:
    peers: int
    """How many in-peers' letters were mixed in."""
    dropped: list[int]
    """Peers whose letters were refused: non-finite values, names/shapes/dtypes that do not match
    ours, or a distance from our parameters beyond the deviation bound."""
    consensus_distance: float
    """L2 distance between our parameters and the weighted mean of the letters mixed, before
    mixing; NaN when no letter was mixed."""
    refused: bool = False
    """Our own parameters were already non-finite: nothing was mixed, no peer was blamed."""
    pull: float = 1.0
    """The share of the letters' pull that was mixed in: below 1 when the drift cap cut it (DeviationBound)."""
    checked: bool = False
    """Our parameters as the mix found them are finite: it read every one of them with check_finite on
    and mixed (a NaN or infinity in one makes its distance to every letter non-finite)."""


class DeviationBound:
    """What letters may do to our parameters: one far off is dropped, and all of them together
    may drag us only as far as our own learning moves us.

    **Drop.** A letter at L2 distance d from our parameters is dropped when
    ``d > factor * max(median(recent), FLOOR * S)``, where ``recent`` are the distances of the
    last ``window`` letters accepted and S = max(|x|, UNIT * sqrt(n)): the norm of our own n
    parameters, or that of n parameters of a typical initialisation's size if it is larger.
    Until ``warmup`` letters have been accepted the scale is S itself (two independent
    initialisations lie about sqrt(2) |x| apart), so a first letter of 1e30 is refused as surely
    as a later one. S is never our norm alone: an agent whose parameters are all zero, or tiny,
    would otherwise drop every honest letter, and, since only accepted letters end the warm-up,
    drop them for good. The floor means a letter within ``factor * FLOOR * S`` is never an
    outlier. Without it a swarm near consensus, whose recent distances are one optimizer step,
    refuses the first larger honest step; the two agents then drift apart without mixing, every
    later letter is farther still, and they never mix again (with a floor of 1e-3 |x|, two A2C
    agents on Pong dropped 316 letters in 40 s). Drops are counted in ``gossip/dropped``.

    **Drift cap.** Judging each letter on its own cannot stop a peer that stays inside the drop
    bound: one pulling a tenth of |x| every round in one direction dragged a swarm 8,360 |x|,
    and an all-zero one collapsed its neighbours towards zero, with nothing dropped (the recent
    distances it is judged by are its own). So the bound also keeps the trailing sum of what
    mixing did to us, M <- M + delta (delta: this mix's displacement; M decays by 1 - 1/WINDOW
    per mix), and cuts a round's pull (every letter's alike, ``MixResult.pull``) so that |M| stays within DRIFT times
    our own recent step: the median distance our own updates moved us between mixes, measured
    on SAMPLE coordinates. Honest mixing pulls to and fro, undoing what the agents' noisy steps
    spread apart, so M stays a few steps long; a steady pull fills it and then moves us by at
    most DRIFT / WINDOW of our own steps per round (half, by default), whatever the peers send.
    The scale is our own learning pace, which no peer sets; not the distances peers send, which
    a patient one trains, nor the norm of our parameters. Before our first step is known the
    cap is FLOOR * S. Cut mixes are counted in ``gossip/clipped``.
    """

    FLOOR = 0.1
    UNIT = 0.1
    """The RMS of a typical initialisation (PyTorch's for a layer 64 wide is about 0.07)."""
    NORM_EVERY = 64
    """After warm-up |x| only sets the floor, so it is measured once every this many mixes."""
    WINDOW = 256
    """Rounds the trailing sum of pulls remembers (its decay is 1 - 1/WINDOW per mix)."""
    DECAY_EVERY = 16
    """The decay is applied as (1 - 1/WINDOW)^16 once every 16 mixes, so that in between a mix adds its
    displacement to M as it is, block by block with our parameters, with no multiply of its own."""
    DRIFT = 128.0
    """How many of our own steps long the trailing sum of pulls may grow. Honest agents' sums reached
    19-20 steps at the median and 54 at most (a ring of 4 on CartPole, up to 625 rounds each); this leaves
    them room and holds a steady pull to half a step per round."""
    SAMPLE = 4096
    """Coordinates our own step is measured on: a few thousand estimate a dense step's length well."""
    STILL = 1e-4
    """An agent whose own steps are shorter than STILL * S (one that does not learn) still mixes, slowly."""

    def __init__(self, factor: float = DEFAULT_DEVIATION_BOUND, window: int = 32, warmup: int = 4):
        if not (factor > 1 and math.isfinite(factor)):
            raise ValueError(f"deviation bound factor must be a finite number > 1, got {factor!r}")
        self.factor = factor
        self.warmup = warmup
        self.recent: deque[float] = deque(maxlen=window)
        self.steps: deque[float] = deque(maxlen=window)
        self.own_norm = 0.0
        self.numel = 0
        self.clipped = 0
        self.trail: dict[str, Any] | None = None
        """M, the trailing sum of pulls, one accumulator per tensor (in at least float32)."""
        self.trail_sq = 0.0
        """|M|^2."""
        self._mixes = 0
        self._since_decay = 0
        self._shapes: dict[str, tuple] = {}
        self._last: dict[str, Any] | None = None
        """The sampled coordinates of our parameters as the last mix left them."""
        self._weights: dict[str, float] = {}
        self.stride = 1
        self._swept: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._stepped = False

    def wants_norm(self) -> bool:
        self._mixes += 1
        return len(self.recent) < self.warmup or self._mixes % self.NORM_EVERY == 1

    def _scale(self) -> float:
        return max(self.own_norm, self.UNIT * math.sqrt(self.numel), 1e-30)

    def limit(self, own_norm: float | None) -> float:
        if own_norm is not None:
            self.own_norm = own_norm
        scale = statistics.median(self.recent) if len(self.recent) >= self.warmup else self._scale()
        return self.factor * max(scale, self.FLOOR * self._scale())

    def accept(self, distances: Sequence[float]) -> None:
        self.recent.extend(distances)

    def begin(self, own: Mapping[str, Any], views: Mapping[str, np.ndarray] | None = None) -> None:
        """Before a mix: start afresh on parameters of another schema, decay the trailing sum when it
        is due, and note how far our own update moved us since the last mix. With ``views`` (the
        fused mean's flat arrays) that is left to the sweep, which samples each block in cache."""
        shapes = {name: tuple(x.shape) for name, x in own.items()}
        if shapes != self._shapes:
            self._shapes, self.numel = shapes, sum(math.prod(s) for s in shapes.values())
            self.trail, self.trail_sq, self._last, self._since_decay = None, 0.0, None, 0
            self.steps.clear()
            self.stride = max(1, self.numel // self.SAMPLE)
            self._weights = {
                name: math.prod(s) / len(range(0, math.prod(s), self.stride)) for name, s in shapes.items()
            }
            """Each sampled coordinate stands for this many of its tensor's."""
            self._swept = None
        if self.trail is None:
            self.trail = {name: accumulator(x) for name, x in own.items()}
        self._since_decay += 1
        if self._since_decay == self.DECAY_EVERY:
            decay = (1 - 1 / self.WINDOW) ** self.DECAY_EVERY
            for m in self.trail.values():
                view = flat_view(m)  # numpy's multiply where there is one: torch's may wake its thread pool
                if view is None:
                    m *= decay
                else:
                    view *= decay
            self.trail_sq *= decay * decay
            self._since_decay = 0
        self._stepped = False
        if views is None:
            self.note_step(self._sample(own))

    def sweep_samples(self, views: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Buffers the sweep fills with our sampled coordinates before and after its update."""
        if self._swept is None:
            count = {name: len(range(0, x.size, self.stride)) for name, x in views.items()}
            self._swept = {
                name: (np.empty(count[name], x.dtype), np.empty(count[name], x.dtype)) for name, x in views.items()
            }
        return self._swept

    def note_step(self, before: Mapping[str, Any]) -> None:
        """Our parameters' sample before this mix: how far our own update moved us since the last one."""
        self._stepped = True
        last = self._last
        if last is not None and all(type(before[name]) is type(last[name]) for name in self._weights):
            sq = sum(w * squared_norm(before[name] - last[name]) for name, w in self._weights.items())
            self.steps.append(sq**0.5)

    def end(self, own: Mapping[str, Any], swept: bool = False) -> None:
        """After a mix (or a round whose letters were all dropped): remember where it left us, from
        the sweep's samples when its update stands as it wrote it (``swept``), else sampled afresh."""
        if swept:
            self._last = {name: after.copy() for name, (_, after) in self._swept.items()}
            return
        sample = self._sample(own)
        if not self._stepped:  # a fused mix that wrote nothing: we are where the update left us
            self.note_step(sample)
        self._last = sample

    def _sample(self, own: Mapping[str, Any]) -> dict[str, Any]:
        """Every stride-th coordinate of each tensor, copied (a few thousand in all)."""
        return {name: copy_of(x.reshape(-1)[:: self.stride]) for name, x in own.items()}

    def cap(self) -> float:
        """How long the trailing sum of pulls may grow: DRIFT of our own recent steps."""
        if not self.steps:
            return self.FLOOR * self._scale()
        return self.DRIFT * max(statistics.median(self.steps), self.STILL * self._scale())

    def pull(self, cross: float, delta_sq: float) -> float:
        """The largest share t in [0, 1] of this round's displacement delta that keeps the trailing
        sum M + t delta within the cap, ``cross`` = <M, delta> (when M is already longer, a pull may
        only shorten it). Commits |M|^2 for that share."""
        limit_sq = max(self.cap() ** 2, self.trail_sq)
        t = 1.0
        if delta_sq > 0 and self.trail_sq + 2 * cross + delta_sq > limit_sq:
            disc = max(0.0, cross * cross - delta_sq * (self.trail_sq - limit_sq))
            t = min(1.0, max(0.0, (-cross + math.sqrt(disc)) / delta_sq))
            self.clipped += 1
        self.trail_sq = max(0.0, self.trail_sq + 2 * t * cross + t * t * delta_sq)  # >= 0 whatever rounding did
        return t


def refuse_integers(own: Mapping[str, Any]) -> None:
    """Mixing integer tensors would truncate (7 and 9 average to 7, all-ones become zeros): refuse them."""
    for name, x in own.items():
        if not is_floating(x):
            raise MixError(
                f"tensor {name!r} has dtype {dtype_name(x)}; gossip mixes only "
                "floating-point tensors: cast it to float32 (and round after mixing if it must stay whole)"
            )


def _same_schema(letter: Mapping[str, np.ndarray], own: Mapping[str, Any]) -> bool:
    return letter.keys() == own.keys() and all(
        arr.dtype.kind == "f" and tuple(arr.shape) == tuple(own[name].shape) for name, arr in letter.items()
    )


def _flat_numpy(own: Mapping[str, Any]) -> list[tuple[str, np.ndarray]] | None:
    """Writable flat numpy views of our tensors (CPU torch tensors included), or None when one has none."""
    views = []
    for name, x in own.items():
        view = flat_view(x)
        if view is None:
            return None
        views.append((name, view))
    return views


@dataclass
class _Pass:
    """What one attempt at mixing found: squared distances per letter, and who spoiled it."""

    sq: dict[int, float]
    consensus_sq: float = 0.0
    own_sq: float = 0.0
    """|x|^2, measured by the measure-first path (the fused one asks DeviationBound.wants_norm)."""
    cross: float = 0.0
    """<(1 - 1/WINDOW) M, delta>: how this mix's displacement lines up with the trailing sum of pulls."""
    pull: float = 1.0
    bad: list[int] = field(default_factory=list)
    own_bad: bool = False


def mix(
    params: Any,
    msgs: Mapping[int, Mapping[str, np.ndarray]],
    weights: Mapping[int, float],
    rank: int,
    *,
    check_finite: bool = True,
    aggregate: str = "mean",
    bound: DeviationBound | None = None,
) -> MixResult:
    """x_rank <- w_rank x_rank + sum_j w_j m_j, in place, over the letters that arrived.

    ``weights`` is this rank's row of the mixing matrix (GossipClient.weights). When some
    in-peers sent nothing (async mode) or sent something unusable, the weights of the
    letters used and of ``rank`` itself are renormalised to sum to 1, so the update stays a
    convex combination. Letters with non-finite values, or beyond ``bound``, are dropped, so
    one diverged or hostile agent cannot poison its neighbours, and ``bound`` caps how far the
    letters kept may drag us over the rounds (``MixResult.pull``); if our own parameters are
    already non-finite nothing is mixed (``refused``). ``aggregate`` "trimmed-mean" and
    "median" replace the weighted mean by a coordinate-wise statistic over our parameters and
    the letters, each counted once (the weights are then not used): the median of three
    values, or the mean after dropping the max(1, n // 4) largest and smallest of n >= 3,
    ignores one outlier per coordinate. Integer tensors raise MixError.
    """
    if aggregate not in AGGREGATES:
        raise ValueError(f"unknown aggregate {aggregate!r}; valid: {', '.join(AGGREGATES)}")
    own = named_tensors(params)
    refuse_integers(own)
    usable, dropped = {}, []
    for peer, letter in msgs.items():
        if peer != rank and peer in weights and _same_schema(letter, own):
            usable[peer] = letter
        else:
            dropped.append(peer)
    views = _flat_numpy(own) if aggregate == "mean" and weights.get(rank, 0.0) > 0 else None
    result = MixResult(0, dropped, float("nan"))  # NaN, not 0.0, which would read as perfect agreement
    flat = dict(views) if views is not None else None
    if bound is not None:
        bound.begin(own, flat)
    swept = False
    while usable:
        total = weights[rank] + sum(weights[j] for j in usable)
        w_self, w_peers = weights[rank] / total, {j: weights[j] / total for j in usable}
        if views is not None:
            found = _fused_mean(views, usable, w_self, w_peers, check_finite, bound)
        else:
            found = _careful(own, usable, w_self, w_peers, check_finite, aggregate, bound)
        if found.own_bad:
            log.warning("rank %d: own parameters are non-finite; mix refused, %d letter(s) unused", rank, len(usable))
            return MixResult(0, dropped, float("nan"), refused=True)
        if not found.bad:
            if bound is not None:
                bound.accept([found.sq[j] ** 0.5 for j in usable])
            result = MixResult(
                len(usable), dropped, found.consensus_sq**0.5 / (1.0 - w_self), pull=found.pull, checked=check_finite
            )
            swept = flat is not None and found.pull == 1
            break
        dropped.extend(found.bad)
        usable = {j: m for j, m in usable.items() if j not in found.bad}
    if bound is not None:
        bound.end(flat if flat is not None else own, swept)
    if dropped:
        log.warning(
            "rank %d: dropped letters from %s (non-finite, beyond the deviation bound, of another schema, "
            "or from a rank outside this round's row)",
            rank,
            dropped,
        )
    return result


def _beyond(found: _Pass, bound: DeviationBound | None) -> list[int]:
    if bound is None:
        return []
    limit = bound.limit(found.own_sq**0.5)
    return [j for j, sq in found.sq.items() if sq**0.5 > limit]


def _fused_mean(
    views, letters, w_self: float, w_peers: dict[int, float], check_finite: bool, bound: DeviationBound | None
) -> _Pass:
    """The weighted mean in one sweep over memory: x += sum_j w_j (m_j - x), block by block.

    Each block of ours and of the letters is read once from memory; the finite check, the
    distances and the update run on it while it sits in cache, and a block is written only
    once every letter's distance so far is finite and within the bound. The bound's trailing sum
    of pulls is added to in the same sweep. A letter refused at a later block was already mixed
    into the blocks before, where it was close to ours: those are restored from the letters,
    x = (x' - sum_j w_j m_j) / w_self, exact up to rounding; a pull beyond the drift cap is cut
    back the same way. That costs a second sweep, but only when a letter is refused or a pull cut.
    """
    found = _Pass({j: 0.0 for j in letters})
    limit_sq = math.inf
    trail = samples = None
    if bound is not None:
        norm = math.sqrt(sum(float(np.dot(x, x)) for _, x in views)) if bound.wants_norm() else None
        limit_sq = bound.limit(norm) ** 2
        trail = {name: flat_view(m) for name, m in bound.trail.items()}
        samples = (bound.stride, bound.sweep_samples(dict(views)))
    done: list[tuple[str, int, int]] = []
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is how a letter of 1e30 shows itself
        _sweep(views, letters, w_peers, check_finite, limit_sq, found, done, trail, samples)
    if found.bad or found.own_bad:
        _restore(views, letters, done, w_self, w_peers, trail)
    elif bound is not None:
        bound.note_step({name: before for name, (before, _) in samples[1].items()})
        found.cross -= found.consensus_sq  # <M + delta, delta> - |delta|^2
        found.pull = bound.pull(found.cross, found.consensus_sq)
        if found.pull < 1:
            _restore(views, letters, done, w_self, w_peers, trail, keep=found.pull)
    return found


def _sweep(views, letters, w_peers, check_finite, limit_sq: float, found: _Pass, done: list, trail, samples) -> None:
    for name, x in views:
        step = np.empty(min(CHUNK, x.size), np.promote_types(x.dtype, np.float32))
        total = np.empty_like(step) if len(letters) > 1 else None
        flat = [(j, w, letters[j][name].reshape(-1)) for j, w in w_peers.items()]
        for a in range(0, x.size, CHUNK):
            b = min(a + CHUNK, x.size)
            xc, d = x[a:b], step[: b - a]
            for i, (j, w, m) in enumerate(flat):
                np.subtract(m[a:b], xc, out=d)
                q = float(np.dot(d, d))
                if check_finite and not math.isfinite(q):
                    found.own_bad = not np.isfinite(xc).all()
                    found.bad = [] if found.own_bad else [j]
                    return
                found.sq[j] += q
                if found.sq[j] > limit_sq:
                    found.bad = [j]
                    return
                if total is None:  # one letter: the consensus distance is its distance
                    found.consensus_sq += w * w * q
                    np.multiply(d, w, out=d)
                elif i == 0:
                    np.multiply(d, w, out=total[: b - a])
                else:
                    np.multiply(d, w, out=d)
                    np.add(total[: b - a], d, out=total[: b - a])
            delta = d if total is None else total[: b - a]
            if total is not None:
                found.consensus_sq += float(np.dot(delta, delta))
            if samples is not None:  # our sampled coordinates before and after, while the block is in cache
                stride, (before, after) = samples[0], samples[1][name]
                first = -a % stride
                k = (a + first) // stride
                sampled = xc[first::stride]
                before[k : k + sampled.size] = sampled
            np.add(xc, delta, out=xc, casting="unsafe")
            if samples is not None:
                after[k : k + sampled.size] = sampled
            if trail is not None:
                mc = trail[name][a:b]
                np.add(mc, delta, out=mc)
                found.cross += float(np.dot(mc, delta))  # <M + delta, delta>, on blocks still in cache
            done.append((name, a, b))


def _restore(views, letters, done, w_self: float, w_peers: dict[int, float], trail, keep: float = 0.0) -> None:
    """Undo the sweep on the blocks it wrote, trailing sum included; or, with ``keep`` > 0, keep
    that share of the pull: x = x_old + keep * delta."""
    xs = dict(views)
    for name, a, b in done:
        xc = xs[name][a:b]
        delta = xc.copy()
        for j, w in w_peers.items():
            xc -= w * letters[j][name].reshape(-1)[a:b]
        xc /= w_self
        np.subtract(delta, xc, out=delta)
        if keep:
            xc += keep * delta
        if trail is not None:
            trail[name][a:b] -= (1 - keep) * delta


def _careful(
    own: Mapping[str, Any],
    letters,
    w_self: float,
    w_peers: dict[int, float],
    check_finite: bool,
    aggregate: str,
    bound: DeviationBound | None,
) -> _Pass:
    """Any aggregate, on any device: measure every letter first, write only if all are usable.

    Used for CUDA and bfloat16 tensors, the robust aggregates, and adopt (no weight of our
    own); the letters are copied to our tensors' device once each.
    """
    found = _Pass({j: 0.0 for j in letters})
    moved = {}
    for name, x in own.items():
        moved[name] = {j: as_like(letter[name], x) for j, letter in letters.items()}
        found.own_sq += squared_norm(x)
        mean_step = 0.0
        for j, w in w_peers.items():
            d = moved[name][j] - x
            found.sq[j] += squared_norm(d)
            mean_step = mean_step + w * d
        found.consensus_sq += squared_norm(mean_step)
    if check_finite and not math.isfinite(found.own_sq):
        found.own_bad = True
        return found
    found.bad = [j for j, sq in found.sq.items() if check_finite and not math.isfinite(sq)] or _beyond(found, bound)
    if found.bad:
        return found
    deltas = {}
    for name, x in own.items():
        ms = moved[name]
        if aggregate == "mean":
            value = x * w_self
            for j, w in w_peers.items():
                value = value + w * ms[j]
        else:
            value = _robust(aggregate, [x, *ms.values()])
        deltas[name] = value - x
    if bound is not None:
        cross = sum(inner(bound.trail[name], d) for name, d in deltas.items())
        found.pull = bound.pull(cross, sum(squared_norm(d) for d in deltas.values()))
        for name, d in deltas.items():
            bound.trail[name] += found.pull * d
    for name, x in own.items():
        assign(x, x + found.pull * deltas[name])
    return found


def _robust(aggregate: str, values: list):
    """Coordinate-wise median or trimmed mean of our tensor and the letters' (numpy or torch alike)."""
    n = len(values)
    ordered = sorted_stack(values)
    if aggregate == "median":
        return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    cut = max(1, n // 4) if n >= 3 else 0
    return ordered[cut : n - cut].mean(0)


def load_tensors(target: Any, arrays: Mapping[str, np.ndarray]) -> None:
    """Copy received arrays into a torch module's parameters or a dict of tensors/arrays, on their devices."""
    own = named_tensors(target)
    missing = own.keys() - arrays.keys()
    if missing:
        raise KeyError(f"arrays lack {sorted(missing)}; have {sorted(arrays)}")
    for name, x in own.items():
        if tuple(arrays[name].shape) != tuple(x.shape):
            raise ValueError(f"{name}: shape {tuple(arrays[name].shape)} != {tuple(x.shape)}")
    for name, x in own.items():
        assign(x, as_like(arrays[name], x))


class Gossip:
    """The hook a training loop calls after each optimizer step: publish, collect, mix.

    Blocking (``overlap=False``, PALA's Algorithm 2): ``exchange`` publishes this round's
    parameters, waits for the in-peers' letters of the same round and mixes them in before it
    returns; the learner sits idle while they travel.

    Overlapped (``overlap=True``, ``gossiprl run --gossip-overlap``): ``exchange`` copies the
    parameters the update left, mixes in the letters of the *previous* round, which travelled
    while the learner rolled out and updated, then hands the copy to a thread of its own that
    publishes it and collects the next round's letters. The learner waits only when an in-peer is more than one
    round behind. Every letter is still mixed exactly once, in round order, and the turn locks
    still hold on every edge (a letter is read before the next is written), so the delay is
    one round, bounded: the condition of docs/algorithm.md's convergence argument. The stale mix
    advances the swarm's mean by only 2 / (2 - p_ii) of each update, which is why it is not the
    default (docs/algorithm.md). ``flush`` mixes the last round in flight after the final update.

    If the broker is unreachable the agent keeps training on its own. Finding that out costs
    the client's liveness window, so after a failure gossip is not tried again for ``backoff``
    seconds (doubling up to ``max_backoff`` while it keeps failing): local training goes on
    at full speed, and gossip resumes once a broker answers on the same address (the client
    registers again by itself; see PROTOCOL.md, Reliability).

    What a peer sends can never stop the agent: letters that are non-finite, of another schema
    or beyond the deviation bound (``deviation_bound``: see DeviationBound; None turns it off)
    are dropped and counted (``gossip/dropped``), and a mix is refused when our own parameters
    are already non-finite (``gossip/refused``). ``aggregate`` chooses mean | trimmed-mean | median.
    """

    def __init__(
        self,
        client: GossipClient,
        name: str = "params",
        check_finite: bool = True,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        aggregate: str = "mean",
        deviation_bound: float | None = DEFAULT_DEVIATION_BOUND,
        overlap: bool = False,
    ):
        if aggregate not in AGGREGATES:
            raise ValueError(f"unknown aggregate {aggregate!r}; valid: {', '.join(AGGREGATES)}")
        self.client = client
        self.name = name
        self.check_finite = check_finite
        self.aggregate = aggregate
        self.bound = DeviationBound(deviation_bound) if deviation_bound is not None else None
        self.backoff, self.max_backoff = backoff, max_backoff
        self.overlap = overlap
        self.failures = 0
        self.skipped = 0
        self.dropped = 0
        self.refused = 0
        self._retry_at = 0.0
        self._next_backoff = backoff
        self._outbox = None
        """Overlapped: the copy of our parameters the gossip thread is sending (ours change meanwhile)."""
        self._in_flight: Future | None = None
        """Overlapped: the round the gossip thread is publishing and collecting; its result is the letters."""
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gossip") if overlap else None

    @property
    def self_weight(self) -> float:
        """This agent's own weight p_ii in the mixing matrix this round (what an overlapped round
        keeps of its own update at once: docs/algorithm.md)."""
        return self.client.weights[self.client.rank]

    def exchange(self, params: Any) -> dict[str, float]:
        refuse_integers({self.name: params})  # before anything is sent: peers could not mix it either
        if not self.overlap:
            t0 = time.perf_counter()
            collected = self._round(params)
            return self._mix(params, collected, time.perf_counter() - t0)[0]
        t0 = time.perf_counter()
        collected = self._take_in_flight() or (None, self.client.round)
        wait_s = time.perf_counter() - t0
        # The letter is our parameters as the update left them, copied before the mix (as PALA sends
        # x_i and GALA writes its message before aggregating): a letter carrying the mix would hand
        # each in-peer back a share of its own stale parameters next round and drag it backwards.
        self._outbox = copy_of(params, into=self._outbox)
        stats, checked = self._mix(params, collected, wait_s)
        # A mix that found our parameters finite vouches for the letter, their copy: the client need not
        # read it all again before sending it (issue 18: that check was a fifth of the gossip thread's CPU).
        self._in_flight = self._thread.submit(self._round, self._outbox, checked)
        return stats

    def flush(self, params: Any) -> dict[str, float] | None:
        """Mix in the round still in flight (overlapped mode; None when there is none). Called
        once after the last update, so the final parameters hold every letter received."""
        t0 = time.perf_counter()
        collected = self._take_in_flight()
        return None if collected is None else self._mix(params, collected, time.perf_counter() - t0)[0]

    def _take_in_flight(self) -> tuple[dict[int, dict] | None, int] | None:
        """The round in flight's result, waiting for it; None when none is in flight. A round that
        failed raises here once, and the next exchange starts afresh."""
        in_flight, self._in_flight = self._in_flight, None
        return None if in_flight is None else in_flight.result()

    def _round(self, params: Any, checked: bool = False) -> tuple[dict[int, dict] | None, int]:
        """Publish ``params`` and collect this round's letters (None while the broker is unreachable),
        with the client's round count after the collect: the round those letters close. ``checked``:
        ``params`` are known to be finite."""
        if time.monotonic() < self._retry_at:
            self.skipped += 1
            return None, self.client.round
        try:
            msgs = self.client.exchange({self.name: params}, checked=checked)
        except GossipStopped:  # the agent is ending: this round is given up, and nothing is wrong
            return None, self.client.round
        except (BrokerUnavailable, GossipTimeout) as err:
            self.failures += 1
            self._retry_at = time.monotonic() + self._next_backoff
            log.warning("rank %d: gossip off for %.1fs: %s", self.client.rank, self._next_backoff, err)
            self._next_backoff = min(2 * self._next_backoff, self.max_backoff)
            return None, self.client.round
        self._next_backoff = self.backoff
        return msgs, self.client.round

    def _mix(
        self, params: Any, collected: tuple[dict[int, dict] | None, int], wait_s: float
    ) -> tuple[dict[str, float], bool]:
        """Mix the letters of one collected round in; the round's figures, with ``gossip/round``
        the round they close (overlapped: one less than the client has collected by now), and
        whether the mix found ``params`` finite as they were before it (``MixResult.checked``)."""
        t1 = time.perf_counter()
        msgs, round_ = collected
        result = MixResult(0, [], float("nan"))
        if msgs is not None:
            result = mix(
                {self.name: params},
                msgs,
                self.client.last_weights,
                self.client.rank,
                check_finite=self.check_finite,
                aggregate=self.aggregate,
                bound=self.bound,
            )
            self.dropped += len(result.dropped)
            self.refused += result.refused
        stats = {
            "gossip/wait_s": wait_s,
            "gossip/mix_s": time.perf_counter() - t1,
            "gossip/round": float(round_),
            "gossip/peers": float(result.peers),
            "gossip/dropped": float(self.dropped),
            "gossip/refused": float(self.refused),
            "gossip/clipped": float(self.bound.clipped if self.bound else 0),
            "gossip/consensus_distance": result.consensus_distance,
            "gossip/failures": float(self.failures),
            "gossip/skipped": float(self.skipped),
        }
        return stats, result.checked

    def adopt(self, params: Any) -> int:
        """Start from the in-peers' parameters instead of our own: their mean, written into ``params``.

        For an agent that rejoins a running swarm with nothing of its own (no checkpoint):
        a fresh initialisation mixed in would set its neighbours back. Returns how many
        letters were averaged (0: nothing usable came, or the client's stop was set while it
        waited: ``params`` are left as they were, and the agent, ending, learns nothing with them).
        An unreachable broker or neighbours silent past the timeout count as a failed round (no
        back-off: the next round is the agent's first), and the agent starts from its own parameters,
        which its rounds then mix as any agent's: it failed here instead, before it trained at all.
        """
        if self._in_flight is not None:
            raise RuntimeError("adopt() while a gossip round is in flight: call it before the first exchange")
        try:
            msgs = self.client.collect()
        except GossipStopped:  # as in a round: the agent is ending, and nothing is wrong
            return 0
        except (BrokerUnavailable, GossipTimeout) as err:
            self.failures += 1
            log.warning("rank %d: no neighbour's parameters to start from: %s", self.client.rank, err)
            return 0
        weights = {self.client.rank: 0.0, **{j: 1.0 for j in msgs}}  # mix renormalises over the usable ones
        return mix({self.name: params}, msgs, weights, self.client.rank, check_finite=self.check_finite).peers

    def close(self) -> None:
        """Let the round in flight finish (its publish may still be read), then leave the swarm."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        self.client.close()
