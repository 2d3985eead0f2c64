"""Who holds which rank: the broker's peers as records with an expiry, and the swarm's tensor schema.

This is the Majordomo broker's worker table, kept apart from the socket as the turn locks are: HELLO
binds a rank to a connection after PROTOCOL.md's checks 9-12 (rank range, the key's granted
ranks, the swarm's size and topology, and a live holder that only a takeover with the same key
may displace); any message keeps its sender alive; a peer silent for ``peer_timeout`` is
expired; the first letter pins the swarm's schema until the last peer leaves. No sockets and no
clock: the broker passes ``now`` in, so every registration story is testable on its own.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from .wire import Message, WireError, decode_payload


@dataclass
class Peer:
    """Who holds a rank on the socket: the connection side; the lock side is in TurnLocks."""

    rank: int
    identity: bytes | None = None
    key: str | None = None
    """The CURVE public key (Z85) the rank is held with: only the same key may take it over."""
    last_seen: float = 0.0
    registrations: int = 0
    queued: deque = field(default_factory=deque)
    """What the broker's socket still holds for this peer (opaque here): emptied when the rank is unbound."""


class Registry:
    """The ranks of one swarm and the connections that hold them."""

    SLACK = 16384
    """Header bytes a request may have beyond the letter that set the schema: its seq and round, a
    data-plane ``ref`` (at most 16 fields of 256 characters) and a command's own small fields."""
    TENSOR_SLACK = 32
    """Header bytes one tensor's spec may differ by between agents (a codec's dtype and ``as``)."""

    def __init__(self, n: int, digest: str, peer_timeout: float):
        if (
            isinstance(peer_timeout, bool)
            or not isinstance(peer_timeout, (int, float))
            or not (math.isfinite(peer_timeout) and peer_timeout > 0)
        ):
            raise ValueError(f"peer_timeout must be a finite number of seconds > 0, got {peer_timeout!r}")
        self.n = n
        self.digest = digest
        self.peer_timeout = peer_timeout
        self.peers = [Peer(r) for r in range(n)]
        self.by_identity: dict[bytes, Peer] = {}
        self.said_bye: set[int] = set()
        """Ranks whose last word was BYE: they finished (or were stopped) rather than vanished."""
        self.schema: tuple | None = None
        """The tensor schema of the registered peers' letters: set by the first letter, forgotten
        when the last peer leaves, so one stray publisher cannot bind later swarms."""
        self.letter_header = 0
        """The header bytes of the letter that set the schema: what a request of this swarm may need."""

    def rank(self, value) -> int:
        """``value`` as one of this swarm's ranks (numpy ints too, not 1.0, "1" or True), else ValueError."""
        try:
            rank = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            rank = None
        if rank is None or not 0 <= rank < self.n:
            raise ValueError(f"rank must be an int from 0 to {self.n - 1}")
        return rank

    def hello(
        self,
        identity: bytes,
        hello: Mapping,
        now: float,
        *,
        key: str | None = None,
        granted: Collection[int] | None = None,
    ) -> bytes | None:
        """Bind the rank a HELLO asks for to ``identity``, or raise the WireError that refuses it;
        nothing changes on a refusal. ``hello`` is the checked header (``rank``, and optionally ``n``,
        ``topology``, ``takeover``); ``key`` the connection's CURVE key, ``granted`` the ranks it may hold.

        Returns the identity of another connection that held the rank until now (its parked requests
        will never be answered: the broker tells it so), else None."""
        rank, n, digest = hello["rank"], hello.get("n"), hello.get("topology")
        if not 0 <= rank < self.n:
            raise WireError(f"rank {rank} out of range; this swarm has ranks 0..{self.n - 1}", "rank-range")
        if granted is not None and rank not in granted:
            raise WireError(
                f"this agent's key may hold ranks {ranges(granted)}, not rank {rank} "
                "(the ranks line of its .key file in the broker's allow directory)",
                "rank-forbidden",
            )
        if n is not None and n != self.n:
            raise WireError(f"client expects {n} agents, the broker's topology has {self.n}", "topology-mismatch")
        if digest is not None and digest != self.digest:
            raise WireError("client's topology differs from the broker's (digest mismatch)", "topology-mismatch")
        peer = self.peers[rank]
        if peer.identity not in (None, identity) and now - peer.last_seen < self.peer_timeout:
            if hello.get("takeover") is not True:
                raise WireError(f"rank {rank} is already registered by a live agent", "rank-taken")
            if key != peer.key:
                raise WireError(
                    f"rank {rank} is held with another key: only the same key may take it over", "rank-taken"
                )
        displaced = peer.identity if peer.identity not in (None, identity) else None
        self._unbind(peer)
        peer.identity, peer.key, peer.last_seen = identity, key, now
        peer.registrations += 1
        self.said_bye.discard(rank)
        self.by_identity[identity] = peer
        return displaced

    def seen(self, identity: bytes, now: float) -> Peer:
        """The peer a message came from, kept alive by it; a stranger is refused with not-registered."""
        peer = self.by_identity.get(identity)
        if peer is None:
            raise WireError("not registered: send HELLO first", "not-registered")
        peer.last_seen = now
        return peer

    def leave(self, peer: Peer, *, bye: bool = False) -> bool:
        """Unbind a peer's rank (``bye``: it said goodbye). True when no peer is left: the schema is then
        forgotten, and the caller drops whatever letters the last swarm left behind."""
        if bye:
            self.said_bye.add(peer.rank)
        self._unbind(peer)
        if self.by_identity:
            return False
        self.schema, self.letter_header = None, 0
        return True

    def _unbind(self, peer: Peer) -> None:
        self.by_identity.pop(peer.identity, None)
        peer.identity = None
        peer.queued.clear()

    def registered(self, rank: int) -> bool:
        return self.peers[rank].identity is not None

    def expired(self, now: float) -> list[Peer]:
        """Registered peers silent for longer than ``peer_timeout``: the caller lets them go."""
        deadline = now - self.peer_timeout
        return [p for p in list(self.by_identity.values()) if p.last_seen < deadline]

    def pin_schema(self, schema: tuple, header_bytes: int) -> None:
        """Accept a letter's schema only if it is the swarm's (the first letter's): names, dtypes, shapes."""
        if self.schema is not None and schema != self.schema:
            raise WireError(
                f"tensor schema {describe(schema)} differs from the swarm's {describe(self.schema)} "
                "(names, dtypes and shapes must match)",
                "schema-mismatch",
            )
        if self.schema is None:
            self.schema, self.letter_header = schema, header_bytes

    def check_letter(self, msg: Message, max_payload_bytes: int) -> None:
        """A PUBLISH's tensors against the swarm's schema, cheapest first: their count before their
        specs are parsed, then the frames against the specs, then the schema the first letter pinned."""
        tensors = msg.get("tensors")
        if isinstance(tensors, list):
            self.check_tensor_count(len(tensors))
        decode_payload(msg, max_payload_bytes)
        self.pin_schema(tuple(spec.schema_key for spec in msg.specs), msg.header_bytes)

    def check_tensor_count(self, count: int) -> None:
        """A letter must carry the swarm's number of tensors: refused before its schema is parsed."""
        if self.schema is not None and count != len(self.schema):
            raise WireError(
                f"tensor schema of {count} tensors differs from the swarm's {describe(self.schema)}",
                "schema-mismatch",
            )

    def header_limit(self) -> int | None:
        """The largest header a member of this swarm needs, once its schema is set (None before): the
        letter that set it, plus what a letter's fields may add (SLACK bytes, TENSOR_SLACK per tensor
        for another codec's spec, 9 per rank for a COLLECT's ``unreachable``). A registered peer's
        larger header is refused before it is decoded: 4,096-spec PUBLISHes cost the broker 37 ms of
        decoding and parsing each."""
        if self.schema is None:
            return None
        return self.letter_header + self.TENSOR_SLACK * len(self.schema) + 9 * self.n + self.SLACK

    def done(self) -> bool:
        """Whether every rank has registered and then left with BYE: the swarm has finished.

        A rank that vanished without BYE (crashed, killed) may still come back with --resume,
        so it keeps the swarm unfinished; so does a rank that never came. Safe from any thread."""
        said_bye = set(self.said_bye)
        return all(p.registrations and p.identity is None and p.rank in said_bye for p in list(self.peers))

    def stats(self, locks) -> dict[int, dict]:
        """Per rank: its connection's side from here, its counters and waits from ``locks`` (TurnLocks)."""
        agents = {}
        for p, r in zip(list(self.peers), locks.ranks):
            agents[p.rank] = {
                "registered": p.identity is not None,
                "round": r.round,
                "publishes": r.publishes,
                "collects": r.collects,
                "bytes_in": r.bytes_in,
                "bytes_out": r.bytes_out,
                "publish_wait_s": round(r.publish_wait_s, 6),
                "collect_wait_s": round(r.collect_wait_s, 6),
                "waited_on": {j: round(s, 6) for j, s in dict(r.waited_on).items()},
                "registrations": p.registrations,
                "gone": p.rank in locks.gone_ranks,
                "said_bye": p.rank in self.said_bye,
                "parked": [k for k in ("publish", "collect") if getattr(r, k) is not None],
            }
        return agents


def ranges(ranks) -> str:
    """0-3,7 for {0, 1, 2, 3, 7}."""
    out, ordered = [], sorted(ranks)
    for k, r in enumerate(ordered):
        if k and r == ordered[k - 1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)


def describe(schema: tuple) -> str:
    """A schema for an error message: the first few tensors as name:dtype[shape], and how many in all."""
    shown = ", ".join(f"{name}:{dtype}{list(shape)}" for name, dtype, shape in schema[:3])
    return f"[{shown}{', ...' if len(schema) > 3 else ''}] ({len(schema)} tensors)"
