"""The broker: PALA's data proxy and the keeper of the turn locks, on one ZMQ ROUTER socket.

Every directed edge j -> i of the topology is a one-slot mailbox. In sync mode (PALA's
Algorithm 2) a PUBLISH from j is written into the slot j -> i only once i has consumed
the previous letter (the writer waits), and a COLLECT from i is answered only once every
in-peer's slot is full (the reader waits). Waiting costs nothing: a request that cannot
proceed is parked, and is re-examined only when a slot it waits on changes. In async mode
(GALA-style) a PUBLISH skips full slots and a COLLECT returns what is there, unless an
edge has been empty ``max_staleness`` collects in a row.

All lock logic is in the section "Turn locks" below; the rest is registration,
bookkeeping and the poll loop. Payload frames are stored and forwarded as the zmq frames
that arrived, never copied in Python.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import zmq

from . import keys, wire
from .dataplane import check_plane

log = logging.getLogger("gossiprl.broker")

MODES = ("sync", "async")


@dataclass
class Letter:
    """One published parameter set sitting in a mailbox (shared by all of its sender's out-edges)."""

    sender: int
    round: int
    schema: list
    frames: list
    nbytes: int
    written_to: set[int] = field(default_factory=set)
    """Readers whose slot this letter was put in: after a rewiring, a new reader that missed it gets it."""
    ref: dict | None = None
    """Where the bytes wait when they stay with the writer (PROTOCOL.md section 10); opaque here."""


@dataclass
class Parked:
    """A PUBLISH or COLLECT that cannot be answered yet, with the peers it still waits on."""

    seq: int
    round: int
    since: float
    waiting_on: set[int]
    letter: Letter | None = None
    written: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


@dataclass
class Agent:
    """What the broker knows about one rank: who it is on the socket, and its counters."""

    rank: int
    identity: bytes | None = None
    last_seen: float = 0.0
    round: int = 0
    publish: Parked | None = None
    last_letter: Letter | None = None
    collect: Parked | None = None
    stale: dict[int, int] = field(default_factory=dict)
    publishes: int = 0
    collects: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    publish_wait_s: float = 0.0
    collect_wait_s: float = 0.0
    waited_on: dict[int, float] = field(default_factory=dict)
    registrations: int = 0


class Broker:
    """Data proxy + turn locks for one gossip swarm.

    ``Broker(topology).start()`` serves in a background thread; ``serve_forever()`` in the
    calling one. ``address`` is the bound endpoint with the port resolved, ready for clients.

    ``curve=(secret_file, allow_dir)`` makes the socket a CurveZMQ server that admits only the
    agents whose public keys are in ``allow_dir`` (see gossiprl.keys). A bind that is not
    loopback needs ``curve`` or an explicit ``insecure=True``.
    """

    def __init__(self, topology, bind: str = "tcp://127.0.0.1:0", *, mode: str = "sync",
                 max_staleness: int | None = None, peer_timeout: float = 60.0,
                 max_payload_bytes: int = wire.DEFAULT_MAX_PAYLOAD_BYTES,
                 context: zmq.Context | None = None, curve=None, insecure: bool = False,
                 data_plane: str = "broker"):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if max_staleness is not None and max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 or None, got {max_staleness}")
        self.topology = topology
        self.mode = mode
        self.max_staleness = max_staleness
        self.peer_timeout = peer_timeout
        self.max_payload_bytes = max_payload_bytes
        self.data_plane = check_plane(data_plane)
        self._relay_edges: set[tuple[int, int]] = set()
        """Edges (writer, reader) whose reader cannot reach the writer's data plane: relayed here."""
        keys.check_bind(bind, curve is not None, insecure)
        self._curve = keys.CurveServer(*curve, context=context) if curve is not None else None
        self._ctx = self._curve.context if self._curve else (context or zmq.Context.instance())
        self._sock = self._ctx.socket(zmq.ROUTER)
        if self._curve is not None:
            self._curve.apply(self._sock)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_payload_bytes + wire.MAX_HEADER_BYTES)
        try:
            self._sock.bind(bind.replace(":0", ":*") if bind.startswith("tcp://") and bind.endswith(":0") else bind)
        except BaseException:
            self._sock.close(linger=0)
            if self._curve is not None:
                self._curve.close()
            raise
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        # Other threads talk to the serving thread only here: b"stop", or a rank declared gone.
        self._control_addr = f"inproc://gossiprl-broker-control-{uuid.uuid4().hex}"  # id(self) is reused
        self._control = self._ctx.socket(zmq.PULL)
        self._control.bind(self._control_addr)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._gone: set[int] = set()
        """Ranks that left (BYE), went silent past peer_timeout, or were declared dead: the survivors
        are rewired around them until they register again. A rank that never registered is not
        gone: it is waited for."""
        self._bypassed: dict[frozenset, object] = {frozenset(): topology}
        """Topology.without(gone) for each set of gone agents met so far."""
        self._rewire_pending = False
        self._agents = {r: Agent(r) for r in range(topology.n)}
        self._by_identity: dict[bytes, Agent] = {}
        self._mailbox: dict[tuple[int, int], Letter] = {}
        self._schema: tuple | None = None
        self.errors: dict[str, int] = {}
        self.events: dict[str, int] = {}
        self.started = time.time()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "Broker":
        if self._thread is not None or self._closed:
            raise RuntimeError("a Broker serves once: start() was already called, or it is closed")
        self._thread = threading.Thread(target=self.serve_forever, name="gossiprl-broker", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the socket. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._tell(b"stop")
            self._thread.join()
        else:
            self._sock.close(linger=0)
            self._control.close(linger=0)
        if self._curve is not None:
            self._curve.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(timeout=self._poll_timeout_ms()))
                if self._control in events:
                    order = self._control.recv()
                    if order == b"stop":
                        return
                    self._declared_gone(int(order))
                if self._sock in events:
                    for _ in range(256):  # drain a burst, but keep expiring peers under load
                        try:
                            frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._handle(frames)
                self._expire_silent_agents()
        finally:
            self._sock.close(linger=0)
            self._control.close(linger=0)

    def declare_gone(self, rank: int) -> None:
        """Treat ``rank`` as dead now (its process crashed, say), without waiting for peer_timeout.

        Safe from any thread: the request travels to the broker's thread over an inproc socket.
        """
        if not 0 <= rank < self.topology.n:
            raise ValueError(f"rank {rank} out of range; this swarm has ranks 0..{self.topology.n - 1}")
        self._tell(str(rank).encode())

    def _tell(self, order: bytes) -> None:
        push = self._ctx.socket(zmq.PUSH)
        push.connect(self._control_addr)
        push.send(order)
        push.close(linger=1000)

    def _poll_timeout_ms(self) -> int:
        return int(max(0.05, min(1.0, self.peer_timeout / 4)) * 1000)

    # ------------------------------------------------------------ dispatch

    def _handle(self, frames: list) -> None:
        identity, body = frames[0].bytes, frames[1:]
        seq = None
        try:
            msg = wire.decode(body, self.max_payload_bytes)
            seq = msg.get("seq")
            handler = {wire.HELLO: self._on_hello, wire.PUBLISH: self._on_publish,
                       wire.COLLECT: self._on_collect, wire.PING: self._on_ping,
                       wire.BYE: self._on_bye}.get(msg.cmd)
            if handler is None:
                raise wire.WireError(f"{msg.cmd} is a broker reply, not a request", "unknown-command")
            if msg.cmd == wire.HELLO:
                handler(identity, msg)
                return
            agent = self._by_identity.get(identity)
            if agent is None:
                raise wire.WireError("not registered: send HELLO first", "not-registered")
            agent.last_seen = time.monotonic()
            handler(agent, msg)
        except wire.WireError as err:
            self._count(err.code)
            seq = seq if seq is not None else err.seq
            self._reply(identity, wire.ERROR, {"seq": seq, "code": err.code, "reason": str(err)})
        except Exception:  # a bug here must not take the whole swarm down
            log.exception("broker: internal error while handling a message")
            self._count("internal")
            self._reply(identity, wire.ERROR, {"seq": seq, "code": "internal", "reason": "internal broker error"})

    def _reply(self, identity: bytes, cmd: str, fields: dict, frames=()) -> bool:
        """Send without blocking: a peer that never reads its replies fills its queue (SNDHWM), and
        a blocking send would then freeze the broker for everyone. Its replies are dropped instead."""
        try:
            self._sock.send_multipart([identity, *wire.encode(cmd, fields, frames)], flags=zmq.NOBLOCK,
                                      copy=False)
            return True
        except zmq.ZMQError:  # the peer went away (ROUTER_MANDATORY) or its queue is full
            self._note("undeliverable")
            return False

    def _count(self, code: str) -> None:
        """A refused request, by its ERROR code (PROTOCOL.md section 4)."""
        self.errors[code] = self.errors.get(code, 0) + 1

    def _note(self, event: str) -> None:
        """Something that happened to the swarm and is no one's error: an agent expired, a reply
        that could not be delivered, a letter dropped by rewiring."""
        self.events[event] = self.events.get(event, 0) + 1

    # ------------------------------------------------------------ registration

    def _on_hello(self, identity: bytes, msg: wire.Message) -> None:
        rank, n = msg["rank"], msg.get("n")
        if not 0 <= rank < self.topology.n:
            raise wire.WireError(f"rank {rank} out of range; this swarm has ranks 0..{self.topology.n - 1}",
                                 "rank-range")
        if n is not None and n != self.topology.n:
            raise wire.WireError(f"client expects {n} agents, the broker's topology has {self.topology.n}",
                                 "topology-mismatch")
        digest = msg.get("topology")
        if digest is not None and digest != self.topology.digest():
            raise wire.WireError("client's topology differs from the broker's (digest mismatch)",
                                 "topology-mismatch")
        agent = self._agents[rank]
        now = time.monotonic()
        if (agent.identity not in (None, identity)
                and now - agent.last_seen < self.peer_timeout and msg.get("takeover") is not True):
            raise wire.WireError(f"rank {rank} is already registered by a live agent", "rank-taken")
        if agent.identity is not None:
            self._by_identity.pop(agent.identity, None)
        agent.identity, agent.last_seen = identity, now
        agent.publish = agent.collect = None
        agent.registrations += 1
        self._by_identity[identity] = agent
        self._reply(identity, wire.WELCOME, {
            "seq": msg.get("seq"), "rank": rank, "n": self.topology.n, "round": agent.round,
            "mode": self.mode, "max_staleness": self.max_staleness, "peer_timeout": self.peer_timeout,
            "topology": self.topology.to_dict(),
            **({"data_plane": self.data_plane} if self.data_plane != "broker" else {}),
        })
        if rank in self._gone:
            log.warning("broker: agent %d is back; rewiring the topology to include it", rank)
            agent.last_letter = None  # the parameters of the process that died
            self._gone.discard(rank)
            self._rewire()

    def _on_bye(self, agent: Agent, msg: wire.Message) -> None:
        self._leave(agent, "said BYE", logging.INFO)

    def _on_ping(self, agent: Agent, msg: wire.Message) -> None:
        self._reply(agent.identity, wire.PONG, {"seq": msg.get("seq")})

    def _leave(self, agent: Agent, why: str, level: int = logging.WARNING) -> None:
        """Unbind a rank from its socket, mark it gone and rewire the survivors around it."""
        log.log(level, "broker: agent %d %s; rewiring the topology around it", agent.rank, why)
        self._by_identity.pop(agent.identity, None)
        agent.identity = None
        agent.publish = agent.collect = None
        self._gone.add(agent.rank)
        self._rewire()

    def _declared_gone(self, rank: int) -> None:
        agent = self._agents[rank]
        if rank not in self._gone:
            self._note("declared-gone")
            self._leave(agent, "was declared gone")

    def _expire_silent_agents(self) -> None:
        deadline = time.monotonic() - self.peer_timeout
        for agent in list(self._by_identity.values()):
            if agent.last_seen < deadline:
                self._note("expired")
                self._leave(agent, f"was silent for {self.peer_timeout:g}s")

    # ------------------------------------------------------------ the topology in force

    def _row(self, i: int):
        """The topology agent i mixes by now: the broker's, with the gone agents bypassed.

        A gone agent's last letter still counts: while it waits unread in slot (d, i), d stays
        in i's row, so a swarm whose agents finish one by one mixes exactly as the matrix says
        to the last round. Only once i has read it is d bypassed in i's row.
        """
        if not self._gone:
            return self.topology
        gone = frozenset(d for d in self._gone if (d, i) not in self._mailbox)
        if gone not in self._bypassed:
            self._bypassed[gone] = self.topology.without(gone)
        return self._bypassed[gone]

    def _in_peers(self, i: int, round: int) -> set[int]:
        return set(self._row(i).in_peers(i, round))

    def _out_peers(self, j: int, round: int) -> set[int]:
        if not self._gone:
            return set(self.topology.out_peers(j, round))
        return {i for i in range(self.topology.n) if i != j and j in self._in_peers(i, round)}

    def _rewire(self) -> None:
        """Re-judge every slot and parked request after an agent left or came back.

        Letters in slots that are no longer edges (to a gone agent, or a bypass edge made
        obsolete by a return) are dropped: no one would ever read them, and a writer must
        not wait on them. Parked requests get their peer sets recomputed, so a COLLECT that
        waited on a dead in-peer now waits on the in-peers that replace it.
        """
        period = self.topology.period
        stale = [(j, i) for (j, i) in self._mailbox
                 if not any(j in self._in_peers(i, r) for r in range(period))]
        for key in stale:
            del self._mailbox[key]
            self._note("letters-dropped-by-rewiring")
        work = []
        for agent in self._agents.values():
            # A letter sent while a reader's row was changing may have found no reader at all
            # (its new reader was still finishing a gone agent's last letter). Its sender now
            # waits on that reader while the reader waits on it: give each new reader the
            # sender's latest letter, so no rewiring can deadlock a cycle of agents.
            letter = agent.last_letter
            if (letter is not None and agent.rank not in self._gone
                    and (agent.publish is None or agent.publish.letter is not letter)):
                for reader in self._out_peers(agent.rank, letter.round) - letter.written_to:
                    if (agent.rank, reader) not in self._mailbox:
                        self._mailbox[(agent.rank, reader)] = letter
                        letter.written_to.add(reader)
            if agent.publish is not None:
                p = agent.publish
                p.waiting_on = self._out_peers(agent.rank, p.round) - set(p.written)
                work.append(("publish", agent))
            if agent.collect is not None:
                agent.collect.waiting_on = self._in_peers(agent.rank, agent.collect.round)
                work.append(("collect", agent))
        self._settle(*work)

    # ------------------------------------------------------------ turn locks

    def _on_publish(self, agent: Agent, msg: wire.Message) -> None:
        key = tuple(spec.schema_key for spec in msg.specs)
        if self._schema is None:
            self._schema = key
        elif key != self._schema:
            raise wire.WireError("tensor schema differs from the swarm's (names, dtypes and shapes must match)",
                                 "schema-mismatch")
        nbytes = sum(spec.nbytes for spec in msg.specs) if msg.frames else 0  # a reference alone moves no bytes here
        letter = Letter(agent.rank, msg["round"], msg["tensors"], msg.frames, nbytes, ref=msg.get("ref"))
        agent.last_letter = letter
        agent.round = msg["round"]
        agent.publishes += 1
        agent.bytes_in += nbytes
        out_peers = self._out_peers(agent.rank, msg["round"])
        agent.publish = Parked(msg["seq"], msg["round"], time.monotonic(), out_peers, letter)
        self._settle(("publish", agent))

    def _on_collect(self, agent: Agent, msg: wire.Message) -> None:
        for j in msg.get("unreachable", ()):
            if (j, agent.rank) not in self._relay_edges and 0 <= j < self.topology.n:
                self._relay_edges.add((j, agent.rank))
                self._note("data-plane-fallbacks")
        in_peers = self._in_peers(agent.rank, msg["round"])
        agent.collect = Parked(msg["seq"], msg["round"], time.monotonic(), in_peers)
        self._settle(("collect", agent))

    def _settle(self, *first: tuple[str, Agent]) -> None:
        """Re-examine parked requests until nothing more can move.

        Answering one request changes slots another may wait on (a COLLECT empties slots
        that writers wait for; a PUBLISH fills slots that readers wait for), so the
        requests touched are queued here rather than advanced recursively.
        """
        work = deque(first)
        while work:
            kind, agent = work.popleft()
            if kind == "publish" and agent.publish is not None:
                work.extend(("collect", r) for r in self._advance_publish(agent))
            elif kind == "collect" and agent.collect is not None:
                work.extend(("publish", w) for w in self._advance_collect(agent))
        if self._rewire_pending:
            self._rewire_pending = False
            self._rewire()

    def _advance_publish(self, agent: Agent) -> list[Agent]:
        """Write the parked letter into every out-edge whose slot is empty; ACK once none is left.

        Sync: a full slot means the receiver has not read the previous letter, so wait.
        Async: a full slot is skipped (the receiver will read the older letter).
        Returns the readers whose slots were filled.
        """
        parked, now, touched = agent.publish, time.monotonic(), []
        for dst in sorted(parked.waiting_on):
            if (agent.rank, dst) in self._mailbox:
                if self.mode == "async":
                    parked.skipped.append(dst)
                    parked.waiting_on.discard(dst)
                continue
            self._mailbox[(agent.rank, dst)] = parked.letter
            parked.letter.written_to.add(dst)
            parked.written.append(dst)
            parked.waiting_on.discard(dst)
            agent.waited_on[dst] = agent.waited_on.get(dst, 0.0) + now - parked.since
            touched.append(self._agents[dst])
        if not parked.waiting_on:
            agent.publish = None
            agent.publish_wait_s += now - parked.since
            relay = sorted(i for j, i in self._relay_edges if j == agent.rank) if parked.letter.ref else []
            self._reply(agent.identity, wire.ACK, {"seq": parked.seq, "round": parked.round,
                                                   "written": parked.written, "skipped": parked.skipped,
                                                   **({"relay": relay} if relay else {})})
        return touched

    def _advance_collect(self, agent: Agent) -> list[Agent]:
        """Answer the parked COLLECT when its turn has come, emptying the slots it reads.

        Sync: every in-peer's slot must be full. Async: answer with whatever is there, except
        that an in-edge empty for ``max_staleness`` collects in a row must be waited for.
        Returns the writers whose slots were emptied.
        """
        parked = agent.collect
        full = {j for j in parked.waiting_on if (j, agent.rank) in self._mailbox}
        if self.mode == "sync" and full != parked.waiting_on:
            return []
        if self.mode == "async" and self.max_staleness is not None and any(
                agent.stale.get(j, 0) + 1 >= self.max_staleness for j in parked.waiting_on - full):
            return []
        now = time.monotonic()
        weights = [[j, w] for j, w in self._row(agent.rank).weights(agent.rank, parked.round).items()]
        header, frames, released = [], [], []
        for j in sorted(parked.waiting_on):
            letter = self._mailbox.pop((j, agent.rank), None)
            if letter is None:
                agent.stale[j] = agent.stale.get(j, 0) + 1
                continue
            agent.stale[j] = 0
            agent.waited_on[j] = agent.waited_on.get(j, 0.0) + now - parked.since
            entry = {"rank": j, "round": letter.round, "tensors": letter.schema}
            if letter.ref is not None:
                entry["ref"] = letter.ref
                entry["relayed"] = bool(letter.frames) and (j, agent.rank) in self._relay_edges
            if letter.ref is None or entry["relayed"]:
                frames.extend(letter.frames)
                agent.bytes_out += letter.nbytes
            header.append(entry)
            released.append(self._agents[j])
            self._rewire_pending |= j in self._gone  # a gone agent's last letter read: bypass it now
        agent.collect = None
        agent.collects += 1
        agent.collect_wait_s += now - parked.since
        self._reply(agent.identity, wire.DELIVER, {"seq": parked.seq, "round": parked.round, "messages": header,
                                                   "weights": weights}, frames)
        return released

    # ------------------------------------------------------------ introspection

    def stats(self) -> dict:
        """Per-agent counters and lock waits, plus error counts: a snapshot safe to call from any thread."""
        agents = {}
        for a in list(self._agents.values()):
            agents[a.rank] = {
                "registered": a.identity is not None, "round": a.round, "publishes": a.publishes,
                "collects": a.collects, "bytes_in": a.bytes_in, "bytes_out": a.bytes_out,
                "publish_wait_s": round(a.publish_wait_s, 6), "collect_wait_s": round(a.collect_wait_s, 6),
                "waited_on": {j: round(s, 6) for j, s in dict(a.waited_on).items()},
                "registrations": a.registrations, "gone": a.rank in self._gone,
                "parked": [k for k in ("publish", "collect") if getattr(a, k) is not None],
            }
        return {"mode": self.mode, "address": self.address, "n": self.topology.n,
                "uptime_s": round(time.time() - self.started, 3), "errors": dict(self.errors), "events": dict(self.events), "agents": agents}
