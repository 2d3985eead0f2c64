"""Gossip mixing: turn the letters a client collected into x_i <- sum_j p_ij x_j, in place.

This is the layer between the transport (GossipClient) and the learner: it knows about
parameters (numpy arrays, or torch tensors on any device) but not about sockets. torch is
used only when the caller hands torch objects in; importing this module does not import it.
"""
from __future__ import annotations

import logging
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .client import BrokerUnavailable, GossipClient, GossipTimeout
from .wire import is_torch

log = logging.getLogger("gossiprl.gossip")


@dataclass
class MixResult:
    peers: int
    """How many in-peers' letters were mixed in."""
    dropped: list[int]
    """Peers whose letters were refused (non-finite values, or names/shapes that do not match ours)."""
    consensus_distance: float
    """L2 distance between our parameters and the weighted mean of the letters mixed, before
    mixing; NaN when no letter was mixed."""


def _named_tensors(params: Any) -> Mapping[str, Any]:
    """A dict of name -> tensor/array for a dict, or for a torch module's parameters."""
    if isinstance(params, Mapping):
        return params
    if hasattr(params, "named_parameters"):
        return {name: p.data for name, p in params.named_parameters()}
    raise TypeError(f"expected a dict of arrays/tensors or a torch module, got {type(params).__name__}")


def _as_torch(array: np.ndarray, like):
    torch = sys.modules["torch"]
    with warnings.catch_warnings():  # the letter is read-only, and torch only reads it here
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).to(device=like.device, dtype=like.dtype, non_blocking=True)


def _valid_letter(letter: Mapping[str, np.ndarray], own: Mapping[str, Any], check_finite: bool) -> bool:
    if letter.keys() != own.keys():
        return False
    for name, arr in letter.items():
        if tuple(arr.shape) != tuple(own[name].shape):
            return False
        if check_finite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return False
    return True


def mix(params: Any, msgs: Mapping[int, Mapping[str, np.ndarray]], weights: Mapping[int, float], rank: int,
        *, check_finite: bool = True) -> MixResult:
    """x_rank <- w_rank x_rank + sum_j w_j m_j, in place, over the letters that arrived.

    ``weights`` is this rank's row of the mixing matrix (GossipClient.weights). When some
    in-peers sent nothing (async mode) or sent something unusable, the weights of the
    letters used and of ``rank`` itself are renormalised to sum to 1, so the update stays a
    convex combination. Letters with non-finite values are dropped, so one diverged agent
    cannot poison its neighbours.
    """
    own = _named_tensors(params)
    usable, dropped = {}, []
    for peer, letter in msgs.items():
        if peer == rank or peer not in weights:
            dropped.append(peer)
        elif _valid_letter(letter, own, check_finite):
            usable[peer] = letter
        else:
            dropped.append(peer)
    if dropped:
        log.warning("rank %d: dropped letters from %s (non-finite or wrong schema)", rank, dropped)
    if not usable:  # nothing to compare with: NaN, not 0.0, which would read as perfect agreement
        return MixResult(0, dropped, float("nan"))
    total = weights[rank] + sum(weights[j] for j in usable)
    w_self = weights[rank] / total
    w_peers = {j: weights[j] / total for j in usable}
    w_nbr = 1.0 - w_self
    sq_dist = 0.0
    for name, x in own.items():
        if is_torch(x):
            acc = None
            for j, w in w_peers.items():
                m = _as_torch(usable[j][name], x)
                acc = m * w if acc is None else acc.add_(m, alpha=w)  # never write into a letter
            sq_dist += float((acc / w_nbr - x).float().pow(2).sum())
            x.mul_(w_self).add_(acc)
        else:
            acc = sum(w * usable[j][name] for j, w in w_peers.items())
            sq_dist += float(np.square(acc / w_nbr - x, dtype=np.float64).sum())
            np.multiply(x, w_self, out=x, casting="unsafe")
            np.add(x, acc, out=x, casting="unsafe")
    return MixResult(len(usable), dropped, sq_dist ** 0.5)


def load_tensors(target: Any, arrays: Mapping[str, np.ndarray]) -> None:
    """Copy received arrays into a torch module's parameters or a dict of tensors/arrays, on their devices."""
    own = _named_tensors(target)
    missing = own.keys() - arrays.keys()
    if missing:
        raise KeyError(f"arrays lack {sorted(missing)}; have {sorted(arrays)}")
    for name, x in own.items():
        if tuple(arrays[name].shape) != tuple(x.shape):
            raise ValueError(f"{name}: shape {tuple(arrays[name].shape)} != {tuple(x.shape)}")
    for name, x in own.items():
        if is_torch(x):
            x.copy_(_as_torch(arrays[name], x))
        else:
            np.copyto(x, arrays[name], casting="unsafe")


class Gossip:
    """The hook a training loop calls after each optimizer step: publish, collect, mix.

    If the broker is unreachable the agent keeps training on its own. Finding that out costs
    the client's liveness window, so after a failure gossip is not tried again for ``backoff``
    seconds (doubling up to ``max_backoff`` while it keeps failing): local training goes on
    at full speed, and gossip resumes once a broker answers on the same address (the client
    registers again by itself; see PROTOCOL.md, Reliability).
    """

    def __init__(self, client: GossipClient, name: str = "params", check_finite: bool = True,
                 backoff: float = 1.0, max_backoff: float = 30.0):
        self.client = client
        self.name = name
        self.check_finite = check_finite
        self.backoff, self.max_backoff = backoff, max_backoff
        self.failures = 0
        self.skipped = 0
        self.dropped = 0
        self._retry_at = 0.0
        self._next_backoff = backoff

    def exchange(self, params: Any) -> dict[str, float]:
        t0 = time.perf_counter()
        result = MixResult(0, [], float("nan"))
        msgs = None
        if time.monotonic() < self._retry_at:
            self.skipped += 1
        else:
            try:
                msgs = self.client.exchange({self.name: params})
                self._next_backoff = self.backoff
            except (BrokerUnavailable, GossipTimeout) as err:
                self.failures += 1
                self._retry_at = time.monotonic() + self._next_backoff
                log.warning("rank %d: gossip off for %.1fs: %s", self.client.rank, self._next_backoff, err)
                self._next_backoff = min(2 * self._next_backoff, self.max_backoff)
        t1 = time.perf_counter()
        if msgs is not None:
            result = mix({self.name: params}, msgs, self.client.last_weights, self.client.rank,
                         check_finite=self.check_finite)
            self.dropped += len(result.dropped)
        t2 = time.perf_counter()
        return {"gossip/wait_s": t1 - t0, "gossip/mix_s": t2 - t1, "gossip/round": float(self.client.round),
                "gossip/peers": float(result.peers), "gossip/dropped": float(self.dropped),
                "gossip/consensus_distance": result.consensus_distance,
                "gossip/failures": float(self.failures), "gossip/skipped": float(self.skipped)}

    def adopt(self, params: Any) -> int:
        """Start from the in-peers' parameters instead of our own: their mean, written into ``params``.

        For an agent that rejoins a running swarm with nothing of its own (no checkpoint):
        a fresh initialisation mixed in would set its neighbours back. Returns how many
        letters were averaged (0: nothing usable came, ``params`` are left as they were).
        """
        msgs = self.client.collect()
        weights = {self.client.rank: 0.0, **{j: 1.0 for j in msgs}}  # mix renormalises over the usable ones
        return mix({self.name: params}, msgs, weights, self.client.rank, check_finite=self.check_finite).peers

    def close(self) -> None:
        self.client.close()
