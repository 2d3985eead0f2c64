"""The broker: PALA's data proxy around the turn locks, on one ZMQ ROUTER socket.

The lock logic (mailboxes, parked requests, rewiring around gone agents) is the socket-free
state machine in gossiprl.comms.turnlocks. This module is what surrounds it, in the order a message
meets it: the poll loop, the checks (cheapest first: header, registration, then the tensor
schema), registration, and sending the replies the locks release. Payload frames are stored
and forwarded as the zmq frames that arrived, never copied in Python.
"""

from __future__ import annotations

import logging
import math
import operator
import secrets
import threading
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import recv_monitor_message

import topologies

from . import keys, wire
from .dataplane import check_plane
from .turnlocks import Letter, Reply, TurnLocks

log = logging.getLogger("gossiprl.comms.broker")

MAX_QUEUED_REPLIES = 64
"""Replies queued for one peer (ZMQ_SNDHWM) before it counts as no longer reading and is treated as gone."""
MAX_QUEUED_BYTES = 256 << 20
"""Letter bytes in DELIVERs not yet handed to the kernel for one peer, past which (beyond the one
DELIVER always allowed) it counts as no longer reading: what the broker holds for a peer is bounded
in bytes as well as in replies."""
RECEIVE_QUEUE = 16
"""Messages ZeroMQ queues from one peer before TCP pushes back on it (ZMQ_RCVHWM)."""
MAX_HELLO_BYTES = 4096
"""The largest header an unregistered peer can make the broker parse; its payload frames are never read."""
HANDSHAKE_MS = 5000
"""A connection that has not finished its ZMTP (or CURVE) handshake by then is closed."""
REFUSALS = (
    zmq.EVENT_ACCEPT_FAILED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
"""Socket events that mean a peer could not connect: counted and logged."""


@dataclass
class Agent:
    """Who holds a rank on the socket: the connection side; the lock side is in TurnLocks."""

    rank: int
    identity: bytes | None = None
    queued: deque = field(default_factory=deque)
    """(tracker, bytes) of the DELIVERs zmq still holds for this peer."""
    key: str | None = None
    """The CURVE public key (Z85) the rank is held with: only the same key may take it over."""
    last_seen: float = 0.0
    registrations: int = 0


class Broker:
    """Data proxy + turn locks for one gossip swarm.

    ``Broker(topology).start()`` serves in a background thread; ``serve_forever()`` in the
    calling one. ``address`` is the bound endpoint with the port resolved, ready for clients.
    If the serving thread ever dies, ``failure`` holds its traceback (``gossiprl broker`` then
    exits non-zero with it) rather than the process lingering, answering no one.

    ``curve=(secret_file, allow_dir)`` makes the socket a CurveZMQ server that admits only the
    agents whose public keys are in ``allow_dir`` (see gossiprl.comms.keys). A bind that is not
    loopback needs ``curve`` or an explicit ``insecure=True``.
    """

    def __init__(
        self,
        topology,
        bind: str = "tcp://127.0.0.1:0",
        *,
        mode: str = "sync",
        max_staleness: int | None = None,
        peer_timeout: float = 60.0,
        max_payload_bytes: int = wire.DEFAULT_MAX_PAYLOAD_BYTES,
        max_queued_replies: int = MAX_QUEUED_REPLIES,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
        context: zmq.Context | None = None,
        curve=None,
        insecure: bool = False,
        data_plane: str = "broker",
    ):
        if (
            isinstance(peer_timeout, bool)
            or not isinstance(peer_timeout, (int, float))
            or not (math.isfinite(peer_timeout) and peer_timeout > 0)
        ):
            raise ValueError(f"peer_timeout must be a finite number of seconds > 0, got {peer_timeout!r}")
        self.data_plane = check_plane(data_plane)
        self.locks = TurnLocks(topology, mode, max_staleness, open_letter=self._open_letter)
        self.topology = topology
        self._digest = topology.digest()
        self._welcome_topology = _wire_topology(topology)
        self.mode = mode
        self.max_staleness = max_staleness
        self.peer_timeout = peer_timeout
        self.max_payload_bytes = max_payload_bytes
        self.max_queued_bytes = max_queued_bytes
        self.instance = uuid.uuid4().hex[:16]
        """Sent in every reply: a client that sees it change knows for certain the broker restarted."""
        self.fetch_token = secrets.token_hex(16) if self.data_plane in ("direct", "auto") else None
        """Handed to registered agents in WELCOME: letter servers answer only FETCHes that carry it."""
        self._relay_edges: set[tuple[int, int]] = set()
        """Edges (writer, reader) whose reader cannot reach the writer's data plane: relayed here."""
        keys.check_bind(bind, curve is not None, insecure)
        raise_fd_limit()
        self._curve = keys.CurveServer(*curve, context=context) if curve is not None else None
        self._ctx = self._curve.context if self._curve else (context or zmq.Context.instance())
        self._sock = self._ctx.socket(zmq.ROUTER)
        if self._curve is not None:
            self._curve.apply(self._sock)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_payload_bytes + wire.MAX_HEADER_BYTES)
        self._sock.setsockopt(zmq.SNDHWM, max_queued_replies)
        self._sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        self._sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        self._monitor = self._sock.get_monitor_socket(REFUSALS)
        try:
            self._sock.bind(bind.replace(":0", ":*") if bind.startswith("tcp://") and bind.endswith(":0") else bind)
        except BaseException:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
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
        self._served = threading.Event()
        """Set when serve_forever has closed the sockets. Trusted over Thread.is_alive(), which on
        Python 3.11 reads False while the thread still runs once a join() was cut short by a
        signal (the CLI's SIGTERM, as Slurm sends it), and close() then shut the sockets under it."""
        self._closed = False
        self._agents = {r: Agent(r) for r in range(topology.n)}
        self._said_bye: set[int] = set()
        """Ranks whose last word was BYE: they finished (or were stopped) rather than vanished."""
        self._by_identity: dict[bytes, Agent] = {}
        self._schema: tuple | None = None
        """The tensor schema of the registered agents' letters: set by the first PUBLISH, forgotten
        when the last agent leaves, so one stray publisher cannot bind later swarms."""
        self.errors: dict[str, int] = {}
        self.events: dict[str, int] = {}
        self.failure: str | None = None
        self.started = time.time()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Broker:
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
        if self._thread is not None and not self._served.is_set():
            self._tell(b"stop")
            self._served.wait()
        else:
            self._close_sockets()
        if self._curve is not None:
            self._curve.close()

    def _close_sockets(self) -> None:
        if not self._sock.closed:
            self._sock.disable_monitor()
            self._sock.close(linger=0)
        self._monitor.close(linger=0)
        self._control.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the serving thread to end; True while it still serves."""
        if self._thread is None:
            return False
        return not self._served.wait(timeout)

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(timeout=self._poll_timeout_ms()))
                if self._control in events:
                    order = self._control.recv()
                    if order == b"stop":
                        return
                    self._guarded(self._declared_gone, int(order))
                if self._monitor in events:
                    self._connection_refused()
                if self._sock in events:
                    for _ in range(256):  # drain a burst, but keep expiring peers under load
                        try:
                            frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._handle(frames)
                self._guarded(self._expire_silent_agents)
        except BaseException:
            self.failure = traceback.format_exc()
            log.critical("broker: the serving thread died; no agent is served any more:\n%s", self.failure)
            raise
        finally:
            self._close_sockets()
            self._served.set()

    def _guarded(self, fn, *args) -> None:
        """Run one step of housekeeping: a bug in it is logged and counted, and serving goes on."""
        try:
            fn(*args)
        except Exception:
            log.exception("broker: internal error in %s", fn.__name__)
            self._count("internal")

    def declare_gone(self, rank: int) -> None:
        """Treat ``rank`` as dead now (its process crashed, say), without waiting for peer_timeout.

        Safe from any thread: the request travels to the broker's thread over an inproc socket.
        """
        try:
            rank = None if isinstance(rank, bool) else operator.index(rank)  # numpy ints too, not 1.0 or "1"
        except TypeError:
            rank = None
        if rank is None or not 0 <= rank < self.topology.n:
            raise ValueError(f"rank must be an int from 0 to {self.topology.n - 1}")
        self._tell(str(rank).encode())

    def _tell(self, order: bytes) -> None:
        push = self._ctx.socket(zmq.PUSH)
        push.connect(self._control_addr)
        push.send(order)
        push.close(linger=1000)

    def _poll_timeout_ms(self) -> int:
        return int(max(0.05, min(1.0, self.peer_timeout / 4)) * 1000)

    def _connection_refused(self) -> None:
        """Say in the log why peers cannot connect (out of file descriptors, a failed handshake)."""
        while True:
            try:
                event = recv_monitor_message(self._monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            what = "accept failed" if event["event"] == zmq.EVENT_ACCEPT_FAILED else "handshake failed"
            self._note("connections-refused")
            log.warning(
                "broker: %s on %s (errno %s: %s)",
                what,
                event["endpoint"].decode(errors="replace"),
                event["value"],
                zmq.strerror(event["value"]),
            )

    # ------------------------------------------------------------ dispatch

    def _handle(self, frames: list) -> None:
        """One message, checked cheapest first: header, registration, then the tensor schema.
        Nothing is stored until every check has passed; no exception leaves this method."""
        identity, body = frames[0].bytes, frames[1:]
        seq = None
        try:
            if sum(len(f) for f in body) > self.max_payload_bytes + wire.MAX_HEADER_BYTES:
                raise wire.WireError(f"message over the {self.max_payload_bytes}-byte payload limit", "too-large")
            if identity not in self._by_identity and body and len(body[0]) > MAX_HELLO_BYTES:
                raise wire.WireError(
                    f"not registered: send HELLO first (until then, headers over {MAX_HELLO_BYTES} bytes are not read)",
                    "not-registered",
                )
            msg = wire.decode_header(body, self.max_payload_bytes)
            seq = msg.get("seq")
            if msg.cmd not in wire.CLIENT_COMMANDS:
                raise wire.WireError(
                    f"{msg.cmd} is a broker reply, not a request; valid requests: {', '.join(wire.CLIENT_COMMANDS)}",
                    "unknown-command",
                )
            if msg.cmd == wire.HELLO:
                self._on_hello(identity, msg, self._key_of(body[0]))
                return
            agent = self._by_identity.get(identity)
            if agent is None:
                raise wire.WireError("not registered: send HELLO first", "not-registered")
            agent.last_seen = time.monotonic()
            if msg.cmd == wire.PUBLISH:
                self._on_publish(agent, msg)
            elif msg.cmd == wire.COLLECT:
                self._on_collect(agent, msg)
            elif msg.cmd == wire.PING:
                self._reply(identity, wire.PONG, {"seq": seq})
            else:
                self._said_bye.add(agent.rank)
                self._leave(agent, "said BYE", logging.INFO)
        except wire.WireError as err:
            self._count(err.code)
            self._reply(
                identity, wire.ERROR, {"seq": seq if seq is not None else err.seq, "code": err.code, "reason": str(err)}
            )
        except Exception:  # a bug here must not take the whole swarm down
            log.exception("broker: internal error while handling a message")
            self._count("internal")
            self._reply(identity, wire.ERROR, {"seq": seq, "code": "internal", "reason": "internal broker error"})

    def _reply(self, identity: bytes, cmd: str, fields: dict, frames=()) -> bool:
        """Send without blocking: a peer that never reads its replies fills its queue (SNDHWM), and
        a blocking send would then freeze the broker for everyone. A registered peer whose queue is
        full has stopped reading: it is treated as gone, so the broker holds nothing more for it."""
        try:
            self._sock.send_multipart(
                [identity, *wire.encode(cmd, {**fields, "broker": self.instance}, frames)],
                flags=zmq.NOBLOCK,
                copy=False,
            )
            return True
        except zmq.Again:
            self._note("undeliverable")
            agent = self._by_identity.get(identity)
            if agent is not None:
                self._note("stopped-reading")
                self._leave(agent, f"stopped reading its replies ({self._sock.getsockopt(zmq.SNDHWM)} queued)")
            return False
        except zmq.ZMQError:  # the peer went away (ROUTER_MANDATORY)
            self._note("undeliverable")
            return False

    def _send(self, replies: list[Reply]) -> None:
        for r in replies:
            agent = self._agents[r.rank]
            if agent.identity is None:
                continue
            if r.cmd == wire.ACK and (relay := self._relays(r.rank)):
                r.fields["relay"] = relay
            if not r.payload:
                self._reply(agent.identity, r.cmd, r.fields)
                continue
            while agent.queued and agent.queued[0][0].done:
                agent.queued.popleft()
            held = sum(nbytes for _, nbytes in agent.queued)
            if held and held + sum(len(f) for f in r.payload) > self.max_queued_bytes:
                self._note("stopped-reading")
                self._leave(agent, f"stopped reading its replies ({held} bytes of letters unread)")
                continue
            frames = [zmq.Frame(f.buffer if isinstance(f, zmq.Frame) else f, track=True) for f in r.payload]
            if self._reply(agent.identity, r.cmd, r.fields, frames):
                agent.queued.append((zmq.MessageTracker(*frames), sum(len(f) for f in frames)))

    def _count(self, code: str) -> None:
        """A refused request, by its ERROR code (PROTOCOL.md section 4)."""
        self.errors[code] = self.errors.get(code, 0) + 1

    def _note(self, event: str) -> None:
        """Something that happened to the swarm and is no one's error: an agent expired, a reply
        that could not be delivered, a letter dropped by rewiring."""
        self.events[event] = self.events.get(event, 0) + 1

    # ------------------------------------------------------------ registration

    def _key_of(self, frame) -> str | None:
        """The CURVE key a message came with (the User-Id our ZAP handler set), None without CURVE."""
        return frame.get("User-Id") if self._curve is not None else None

    def _on_hello(self, identity: bytes, msg: wire.Message, key: str | None) -> None:
        rank, n = msg["rank"], msg.get("n")
        if not 0 <= rank < self.topology.n:
            raise wire.WireError(
                f"rank {rank} out of range; this swarm has ranks 0..{self.topology.n - 1}", "rank-range"
            )
        granted = self._curve.grants.get(key) if key is not None else None
        if granted is not None and rank not in granted:
            raise wire.WireError(
                f"this agent's key may hold ranks {_ranges(granted)}, not rank {rank} "
                "(the ranks line of its .key file in the broker's allow directory)",
                "rank-forbidden",
            )
        if n is not None and n != self.topology.n:
            raise wire.WireError(
                f"client expects {n} agents, the broker's topology has {self.topology.n}", "topology-mismatch"
            )
        digest = msg.get("topology")
        if digest is not None and digest != self._digest:
            raise wire.WireError("client's topology differs from the broker's (digest mismatch)", "topology-mismatch")
        agent = self._agents[rank]
        now = time.monotonic()
        if agent.identity not in (None, identity) and now - agent.last_seen < self.peer_timeout:
            if msg.get("takeover") is not True:
                raise wire.WireError(f"rank {rank} is already registered by a live agent", "rank-taken")
            if key != agent.key:
                raise wire.WireError(
                    f"rank {rank} is held with another key: only the same key may take it over", "rank-taken"
                )
        if agent.identity is not None:
            self._by_identity.pop(agent.identity, None)
            agent.queued.clear()
            if agent.identity != identity:
                for parked in self.locks.cancel(rank):
                    self._reply(
                        agent.identity,
                        wire.ERROR,
                        {
                            "seq": parked.seq,
                            "code": "taken-over",
                            "reason": f"rank {rank} was registered again by another connection; "
                            "this request will never be answered",
                        },
                    )
        agent.identity, agent.key, agent.last_seen = identity, key, now
        agent.registrations += 1
        self._said_bye.discard(rank)
        self._by_identity[identity] = agent
        self._reply(
            identity,
            wire.WELCOME,
            {
                "seq": msg.get("seq"),
                "rank": rank,
                "n": self.topology.n,
                "round": self.locks.ranks[rank].round,
                "mode": self.mode,
                "max_staleness": self.max_staleness,
                "peer_timeout": self.peer_timeout,
                "max_payload": self.max_payload_bytes,
                "topology": self._welcome_topology,
                **({"data_plane": self.data_plane} if self.data_plane != "broker" else {}),
                **({"fetch_token": self.fetch_token} if self.fetch_token else {}),
            },
        )
        if rank in self.locks.gone_ranks:
            log.warning("broker: agent %d is back; rewiring the topology to include it", rank)
        self._send(self.locks.rejoin(rank, now))

    def _leave(self, agent: Agent, why: str, level: int = logging.WARNING) -> None:
        """Unbind a rank from its socket, mark it gone and rewire the survivors around it."""
        log.log(level, "broker: agent %d %s; rewiring the topology around it", agent.rank, why)
        self._by_identity.pop(agent.identity, None)
        agent.identity = None
        agent.queued.clear()
        self._send(self.locks.gone(agent.rank, time.monotonic()))
        if not self._by_identity:  # the swarm is empty: the next one may bring another schema
            self._schema = None
            self.locks.drop_letters()

    def _declared_gone(self, rank: int) -> None:
        if rank not in self.locks.gone_ranks:
            self._note("declared-gone")
            self._leave(self._agents[rank], "was declared gone")

    def _expire_silent_agents(self) -> None:
        deadline = time.monotonic() - self.peer_timeout
        for agent in list(self._by_identity.values()):
            if agent.last_seen < deadline:
                self._note("expired")
                self._leave(agent, f"was silent for {self.peer_timeout:g}s")

    # ------------------------------------------------------------ letters

    def _on_publish(self, agent: Agent, msg: wire.Message) -> None:
        """Check the letter against the swarm's schema before it is kept, then hand it to the locks."""
        wire.decode_payload(msg, self.max_payload_bytes)
        key = tuple(spec.schema_key for spec in msg.specs)
        if self._schema is not None and key != self._schema:
            raise wire.WireError(
                f"tensor schema {_describe(key)} differs from the swarm's {_describe(self._schema)} "
                "(names, dtypes and shapes must match)",
                "schema-mismatch",
            )
        self._schema = key
        nbytes = sum(spec.nbytes for spec in msg.specs) if msg.frames else 0  # a reference alone moves no bytes here
        header = {"tensors": msg["tensors"], **({"ref": msg["ref"]} if "ref" in msg.header else {})}
        self._send(
            self.locks.publish(agent.rank, msg["seq"], msg["round"], header, msg.frames, nbytes, time.monotonic())
        )

    def _on_collect(self, agent: Agent, msg: wire.Message) -> None:
        """A reader that could not open some writers' references names them: those edges are relayed
        from now on (their writers are told in their ACKs to send the bytes along). Only writers it
        reads from count: one COLLECT naming every rank made every writer upload every letter."""
        for j in msg.get("unreachable", ()):
            if (j, agent.rank) in self._relay_edges:
                continue
            if j < self.topology.n and j != agent.rank and self.locks.reads_from(agent.rank, j):
                self._relay_edges.add((j, agent.rank))
                self._note("data-plane-fallbacks")
            else:
                self._note("relay-requests-ignored")
        self._send(self.locks.collect(agent.rank, msg["seq"], msg["round"], time.monotonic()))

    def _open_letter(self, letter: Letter, reader: int) -> tuple[dict, list, int]:
        """What ``reader`` is handed of a letter (the TurnLocks hook): a reference-only letter, or one
        the reader can open itself, goes without its frames; a relayed edge gets the bytes too."""
        if "ref" not in letter.header:
            return letter.header, letter.payload, letter.nbytes
        relayed = bool(letter.payload) and (letter.sender, reader) in self._relay_edges
        if relayed:
            return {**letter.header, "relayed": True}, letter.payload, letter.nbytes
        return {**letter.header, "relayed": False}, [], 0

    def _relays(self, writer: int) -> list[int]:
        """Readers that cannot open ``writer``'s references, registered and still reading it as wired
        now: its ACK tells it to send the bytes along (no bytes are uploaded for a reader that left)."""
        letter = self.locks.ranks[writer].last_letter
        if letter is None or "ref" not in letter.header:
            return []
        return sorted(
            i
            for j, i in self._relay_edges
            if j == writer and self._agents[i].identity is not None and self.locks.reads_from(i, writer)
        )

    # ------------------------------------------------------------ introspection

    def swarm_done(self) -> bool:
        """Whether every rank has registered and then left with BYE: the swarm has finished.

        A rank that vanished without BYE (crashed, killed) may still come back with --resume,
        so it keeps the swarm unfinished; so does a rank that never came."""
        said_bye = set(self._said_bye)
        return all(a.registrations and a.identity is None and a.rank in said_bye for a in list(self._agents.values()))

    def stats(self) -> dict:
        """Per-agent counters and lock waits, plus error counts: a snapshot safe to call from any thread."""
        agents = {}
        for a, r in zip(list(self._agents.values()), self.locks.ranks):
            agents[a.rank] = {
                "registered": a.identity is not None,
                "round": r.round,
                "publishes": r.publishes,
                "collects": r.collects,
                "bytes_in": r.bytes_in,
                "bytes_out": r.bytes_out,
                "publish_wait_s": round(r.publish_wait_s, 6),
                "collect_wait_s": round(r.collect_wait_s, 6),
                "waited_on": {j: round(s, 6) for j, s in dict(r.waited_on).items()},
                "registrations": a.registrations,
                "gone": a.rank in self.locks.gone_ranks,
                "said_bye": a.rank in self._said_bye,
                "parked": [k for k in ("publish", "collect") if getattr(r, k) is not None],
            }
        return {
            "mode": self.mode,
            "address": self.address,
            "n": self.topology.n,
            "instance": self.instance,
            "uptime_s": round(time.time() - self.started, 3),
            "errors": dict(self.errors),
            "events": {**self.events, **self.locks.events},
            "agents": agents,
        }


def stats_line(stats: dict) -> str:
    """``stats()`` as one short line for a person watching a terminal (the JSON runs to a kilobyte)."""
    agents = stats["agents"].values()
    registered = sum(a["registered"] for a in agents)
    left = sum(a["said_bye"] for a in agents)
    gone = sum(a["gone"] and not a["said_bye"] for a in agents)
    rounds = [a["round"] for a in agents if a["registrations"]]
    letters = sum(a["publishes"] for a in agents)
    moved = sum(a["bytes_in"] + a["bytes_out"] for a in agents)
    errors = sum(stats["errors"].values())
    return (
        f"broker: {registered}/{stats['n']} agents registered, {left} left (BYE), {gone} gone; "
        f"rounds {f'{min(rounds)}-{max(rounds)}' if rounds else 'none yet'}; {letters:,} letters, "
        f"{_megabytes(moved)} through the broker; {errors} error(s)"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(stats['errors'].items()))})" if errors else "")
        + f"; up {stats['uptime_s']:.0f}s"
    )


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.1f} MB"


def _ranges(ranks) -> str:
    """0-3,7 for {0, 1, 2, 3, 7}."""
    out, ordered = [], sorted(ranks)
    for k, r in enumerate(ordered):
        if k and r == ordered[k - 1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)


def _wire_topology(topology) -> dict:
    """The topology as WELCOME carries it, built once: a named topology travels as its recipe
    (name, n, options, digest), so a HELLO costs the same at n = 4,096 as at n = 2; only a
    matrix of the user's own travels whole."""
    d = topology.to_dict()
    if topology.name in topologies.NAMES:
        del d["matrix"]
    return d


def _describe(schema: tuple) -> str:
    """A schema for an error message: the first few tensors as name:dtype[shape], and how many in all."""
    shown = ", ".join(f"{name}:{dtype}{list(shape)}" for name, dtype, shape in schema[:3])
    return f"[{shown}{', ...' if len(schema) > 3 else ''}] ({len(schema)} tensors)"


def raise_fd_limit() -> None:
    """Each peer costs a file descriptor: lift the soft limit to the hard one, so a few hundred idle
    connections cannot lock agents out of a broker started with the common default of 1,024."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("broker: could not raise the open-file limit from %s to %s: %s", soft, hard, exc)
