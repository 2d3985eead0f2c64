"""The broker: PALA's data proxy around the turn locks, on one ZMQ ROUTER socket.

It is shaped as ZeroMQ's Majordomo broker: one poll loop that reads a message, dispatches it to
the handler of its command, and each pass expires silent peers. The state lives in socket-free
parts: the turn locks (gossiprl.comms.turnlocks: mailboxes, parked requests, rewiring around
gone agents), the registry (gossiprl.comms.registry: who holds which rank, expiry, the swarm's
schema) and the broker's end of the data plane (gossiprl.comms.dataplane.BrokerPlane: what a
reader is handed, which edges are relayed). This module is what surrounds them, in the order a
message meets it: the poll loop, the checks (cheapest first: header, registration, then the
tensor schema), the handlers, and sending the replies the locks release. Payload frames are
stored and forwarded as the zmq frames that arrived, never copied in Python.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from collections import Counter

import zmq
from zmq.utils.monitor import recv_monitor_message

import topologies

from . import keys, wire
from .dataplane import BrokerPlane
from .registry import Peer, Registry
from .settings import PEER_TIMEOUT_S
from .turnlocks import Reply, TurnLocks

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
        peer_timeout: float = PEER_TIMEOUT_S,
        max_payload_bytes: int = wire.DEFAULT_MAX_PAYLOAD_BYTES,
        max_queued_replies: int = MAX_QUEUED_REPLIES,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
        context: zmq.Context | None = None,
        curve=None,
        insecure: bool = False,
        data_plane: str = "broker",
    ):
        self.registry = Registry(topology.n, topology.digest(), peer_timeout)
        self.plane = BrokerPlane(data_plane)
        self.locks = TurnLocks(topology, mode, max_staleness, open_letter=self.plane.open_letter)
        self.topology = topology
        self._welcome = _welcome(topology, mode, max_staleness, peer_timeout, max_payload_bytes, self.plane)
        self.mode, self.max_staleness, self.peer_timeout = mode, max_staleness, peer_timeout
        self.max_payload_bytes = max_payload_bytes
        self.instance = uuid.uuid4().hex[:16]
        """Sent in every reply: a client that sees it change knows for certain the broker restarted."""
        self._sockets = _Sockets(bind, curve, insecure, context, max_payload_bytes, max_queued_replies)
        self._curve = self._sockets.curve
        self._outbox = _Outbox(self._sockets.router, self.instance, max_queued_bytes)
        self.address = self._sockets.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._thread: threading.Thread | None = None
        self._served = threading.Event()
        """Set when serve_forever has closed the sockets. Trusted over Thread.is_alive(), which on
        Python 3.11 reads False while the thread still runs once a join() was cut short by a
        signal (the CLI's SIGTERM, as Slurm sends it), and close() then shut the sockets under it."""
        self._closed = False
        self.errors: Counter[str] = Counter()
        """Refused requests, by their ERROR code (PROTOCOL.md section 4)."""
        self.events: Counter[str] = Counter()
        """What happened to the swarm and is no one's error: an agent expired or stopped reading."""
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
            self._sockets.tell(b"stop")
            self._served.wait()
        else:
            self._sockets.close()
        if self._curve is not None:
            self._curve.close()

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
        poll_ms = int(max(0.05, min(1.0, self.peer_timeout / 4)) * 1000)
        try:
            while True:
                order, refused, readable = self._sockets.poll(poll_ms)
                if order == b"stop":
                    return
                if order is not None:
                    self._guarded(self._declared_gone, int(order))
                if refused:
                    self.events["connections-refused"] += refused
                for frames in self._sockets.burst() if readable else ():
                    self._handle(frames)
                self._guarded(self._expire_silent_peers)
        except BaseException:
            self.failure = traceback.format_exc()
            log.critical("broker: the serving thread died; no agent is served any more:\n%s", self.failure)
            raise
        finally:
            self._sockets.close()
            self._served.set()

    def _guarded(self, fn, *args) -> None:
        """Run one step of housekeeping: a bug in it is logged and counted, and serving goes on."""
        try:
            fn(*args)
        except Exception:
            log.exception("broker: internal error in %s", fn.__name__)
            self.errors["internal"] += 1

    def declare_gone(self, rank: int) -> None:
        """Treat ``rank`` as dead now (its process crashed, say), without waiting for peer_timeout.
        Safe from any thread: the request travels to the broker's thread over an inproc socket."""
        self._sockets.tell(str(self.registry.rank(rank)).encode())

    # ------------------------------------------------------------ dispatch

    def _handle(self, frames: list) -> None:
        """One message, checked cheapest first: header, registration, then the tensor schema.
        Nothing is stored until every check has passed; no exception leaves this method."""
        identity, body = frames[0].bytes, frames[1:]
        seq = None
        try:
            registered = identity in self.registry.by_identity
            limit = self.registry.header_limit() if registered else MAX_HELLO_BYTES
            msg = _request(body, registered, limit, self.max_payload_bytes)
            seq = msg.get("seq")
            if msg.cmd == wire.HELLO:
                key = body[0].get("User-Id") if self._curve is not None else None  # set by our ZAP handler
                self._on_hello(identity, msg, key)
            else:
                self._HANDLERS[msg.cmd](self, self.registry.seen(identity, time.monotonic()), msg)
        except wire.WireError as err:
            self.errors[err.code] += 1
            self._reply(
                identity, wire.ERROR, {"seq": seq if seq is not None else err.seq, "code": err.code, "reason": str(err)}
            )
        except Exception:  # a bug here must not take the whole swarm down
            log.exception("broker: internal error while handling a message")
            self.errors["internal"] += 1
            self._reply(identity, wire.ERROR, {"seq": seq, "code": "internal", "reason": "internal broker error"})

    def _reply(self, identity: bytes, cmd: str, fields: dict, payload=(), queued=None) -> None:
        """Send without blocking (see _Outbox); a registered peer that stopped reading is let go."""
        why = self._outbox.send(identity, cmd, fields, payload, queued)
        peer = self.registry.by_identity.get(identity)
        if why is not None and peer is not None:
            self.events["stopped-reading"] += 1
            self._leave(peer, f"stopped reading its replies ({why})")

    def _send(self, replies: list[Reply]) -> None:
        """The replies the locks released, to the ranks still registered, with what the data plane adds to each."""
        for r in replies:
            peer = self.registry.peers[r.rank]
            if peer.identity is None:
                continue
            r.fields.update(self.plane.reply_fields(r.rank, r.cmd, self.locks, self.registry.registered))
            self._reply(peer.identity, r.cmd, r.fields, r.payload, peer.queued)

    # ------------------------------------------------------------ handlers

    def _on_hello(self, identity: bytes, msg: wire.Message, key: str | None) -> None:
        rank, now = msg["rank"], time.monotonic()
        granted = self._curve.grants.get(key) if key is not None else None
        displaced = self.registry.hello(identity, msg.header, now, key=key, granted=granted)
        self.plane.end_session(self.locks)  # a process that registers holds no part of a session
        if displaced is not None:
            for parked in self.locks.cancel(rank):
                reason = f"rank {rank} was registered again by another connection; this request will never be answered"
                self._reply(displaced, wire.ERROR, {"seq": parked.seq, "code": "taken-over", "reason": reason})
        here = {"seq": msg.get("seq"), "rank": rank, "n": self.topology.n, "round": self.locks.ranks[rank].round}
        self._reply(identity, wire.WELCOME, {**here, **self._welcome})
        if rank in self.locks.gone_ranks:
            log.warning("broker: agent %d is back; rewiring the topology to include it", rank)
        self._send(self.locks.rejoin(rank, now))

    def _on_publish(self, peer: Peer, msg: wire.Message) -> None:
        """Check the letter against the swarm's schema before it is kept, then hand it to the locks."""
        self.registry.check_letter(msg, self.max_payload_bytes)
        nbytes = sum(spec.nbytes for spec in msg.specs) if msg.frames else 0  # a reference alone moves no bytes here
        header = {"tensors": msg["tensors"], **({"ref": msg["ref"]} if "ref" in msg.header else {})}
        self.plane.published(peer.rank, header, msg["round"], self)
        replies = self.locks.publish(peer.rank, msg["seq"], msg["round"], header, msg.frames, nbytes, time.monotonic())
        self._send(replies)

    def _on_collect(self, peer: Peer, msg: wire.Message) -> None:
        """A reader that could not open some writers' references names them: the data plane relays those edges."""
        self.plane.unreachable(peer.rank, msg.get("unreachable", ()), self.locks)
        taken = msg.get("taken", ())
        self._send(self.locks.collect(peer.rank, msg["seq"], msg["round"], time.monotonic(), skip=taken))

    def _on_ping(self, peer: Peer, msg: wire.Message) -> None:
        """PONG says which session is in force and which of the ranks a waiting agent names are gone."""
        gone = [r for r in msg.get("about", ()) if r in self.locks.gone_ranks]
        self._reply(peer.identity, wire.PONG, {"seq": msg.get("seq"), "session": self.plane.session, "gone": gone})

    def _on_bye(self, peer: Peer, msg: wire.Message) -> None:
        self._leave(peer, "said BYE", logging.INFO, bye=True)

    _HANDLERS = {wire.PUBLISH: _on_publish, wire.COLLECT: _on_collect, wire.PING: _on_ping, wire.BYE: _on_bye}
    """What a registered peer's request does, by command; HELLO, the one a stranger may send, is checked first."""

    # ------------------------------------------------------------ leaving

    def _leave(self, peer: Peer, why: str, level: int = logging.WARNING, *, bye: bool = False) -> None:
        """Unbind a rank from its socket, mark it gone and rewire the survivors around it."""
        log.log(level, "broker: agent %d %s; rewiring the topology around it", peer.rank, why)
        empty = self.registry.leave(peer, bye=bye)
        self.plane.end_session(self.locks)
        self._send(self.locks.gone(peer.rank, time.monotonic()))
        if empty:  # the swarm is empty: the next one may bring another schema
            self.locks.drop_letters()

    def _declared_gone(self, rank: int) -> None:
        if rank not in self.locks.gone_ranks:
            self.events["declared-gone"] += 1
            self._leave(self.registry.peers[rank], "was declared gone")

    def _expire_silent_peers(self) -> None:
        for peer in self.registry.expired(time.monotonic()):
            self.events["expired"] += 1
            self._leave(peer, f"was silent for {self.peer_timeout:g}s")

    # ------------------------------------------------------------ introspection

    def swarm_done(self) -> bool:
        """Whether every rank has registered and then left with BYE: the swarm has finished (Registry.done)."""
        return self.registry.done()

    def stats(self) -> dict:
        """Per-agent counters and lock waits, plus error counts: a snapshot safe to call from any thread."""
        return {
            "mode": self.mode,
            "address": self.address,
            "n": self.topology.n,
            "instance": self.instance,
            "uptime_s": round(time.time() - self.started, 3),
            "errors": dict(self.errors),
            "events": {**self.events, **self._outbox.events, **self.plane.events, **self.locks.events},
            "agents": self.registry.stats(self.locks),
        }


class _Sockets:
    """The broker's three sockets: the ROUTER the agents reach, bound with its limits (and its CURVE
    server, ``curve``, when given key files); a monitor of the connections it refused; and the inproc
    control socket, the one way other threads reach the serving thread (b"stop", or a rank declared
    gone). A bind other hosts could reach is refused without keys or ``insecure``; nothing is left
    open if the bind fails."""

    def __init__(self, bind: str, curve, insecure: bool, context, max_payload_bytes: int, max_queued_replies: int):
        keys.check_bind(bind, curve is not None, insecure)
        raise_fd_limit()
        self.curve = curve = keys.CurveServer(*curve, context=context) if curve is not None else None
        self._ctx = ctx = curve.context if curve else (context or zmq.Context.instance())
        self.router = sock = ctx.socket(zmq.ROUTER)
        if curve is not None:
            curve.apply(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A frame is a header or one tensor: a larger one drops its connection before ZeroMQ buffers it.
        sock.setsockopt(zmq.MAXMSGSIZE, max(max_payload_bytes, wire.MAX_HEADER_BYTES))
        sock.setsockopt(zmq.SNDHWM, max_queued_replies)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        self.monitor = sock.get_monitor_socket(REFUSALS)
        try:
            sock.bind(bind.replace(":0", ":*") if bind.startswith("tcp://") and bind.endswith(":0") else bind)
        except BaseException:
            sock.disable_monitor()
            self.monitor.close(linger=0)
            sock.close(linger=0)
            if curve is not None:
                curve.close()
            raise
        self._control_addr = f"inproc://gossiprl-broker-control-{uuid.uuid4().hex}"  # id(self) is reused
        self.control = ctx.socket(zmq.PULL)
        self.control.bind(self._control_addr)
        self._poller = zmq.Poller()
        for s in (self.router, self.control, self.monitor):
            self._poller.register(s, zmq.POLLIN)

    def poll(self, timeout_ms: int) -> tuple[bytes | None, int, bool]:
        """Wait for any socket: one control order (or None), how many connections were refused (each
        logged with why: out of file descriptors, a failed handshake), and whether the ROUTER has
        messages to read."""
        events = dict(self._poller.poll(timeout=timeout_ms))
        order = self.control.recv() if self.control in events else None
        refused = 0
        while self.monitor in events:
            try:
                event = recv_monitor_message(self.monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            refused += 1
            what = "accept failed" if event["event"] == zmq.EVENT_ACCEPT_FAILED else "handshake failed"
            endpoint, errno = event["endpoint"].decode(errors="replace"), event["value"]
            log.warning("broker: %s on %s (errno %s: %s)", what, endpoint, errno, zmq.strerror(errno))
        return order, refused, self.router in events

    def burst(self, most: int = 256):
        """The messages waiting on the ROUTER, at most ``most``: drain a burst, but keep expiring peers under load."""
        for _ in range(most):
            try:
                yield self.router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return

    def tell(self, order: bytes) -> None:
        """Hand the serving thread an order, from any thread."""
        push = self._ctx.socket(zmq.PUSH)
        push.connect(self._control_addr)
        push.send(order)
        push.close(linger=1000)

    def close(self) -> None:
        if not self.router.closed:
            self.router.disable_monitor()
            self.router.close(linger=0)
        self.monitor.close(linger=0)
        self.control.close(linger=0)


class _Outbox:
    """What the broker holds for each peer, bounded. Nothing is sent blocking: a peer that never
    reads its replies fills its own queue (SNDHWM), and a blocking send would then freeze the broker
    for everyone. Letters are also bounded in bytes: ``queued`` holds (tracker, bytes) of the
    DELIVERs ZeroMQ still holds for a peer, and past ``max_queued_bytes`` (beyond the one DELIVER
    always allowed) the peer has stopped reading as surely as with a full queue."""

    def __init__(self, router: zmq.Socket, instance: str, max_queued_bytes: int):
        self.router, self.instance, self.max_queued_bytes = router, instance, max_queued_bytes
        self.events: Counter[str] = Counter()

    def send(self, identity: bytes, cmd: str, fields: dict, payload=(), queued=None) -> str | None:
        """Send one reply, its payload frames as they arrived (never copied in Python); None, or why
        the peer counts as no longer reading. A reply to a peer that went away is counted and dropped."""
        if payload:
            while queued and queued[0][0].done:
                queued.popleft()
            held = sum(nbytes for _, nbytes in queued)
            if held and held + sum(len(f) for f in payload) > self.max_queued_bytes:
                return f"{held} bytes of letters unread"
            payload = [zmq.Frame(f.buffer if isinstance(f, zmq.Frame) else f, track=True) for f in payload]
        try:
            frames = [identity, *wire.encode(cmd, {**fields, "broker": self.instance}, payload)]
            self.router.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.events["undeliverable"] += 1
            return f"{self.router.getsockopt(zmq.SNDHWM)} queued"
        except zmq.ZMQError:  # the peer went away (ROUTER_MANDATORY)
            self.events["undeliverable"] += 1
            return None
        if payload:
            queued.append((zmq.MessageTracker(*payload), sum(len(f) for f in payload)))
        return None


def _request(body: list, registered: bool, header_limit: int | None, max_payload_bytes: int) -> wire.Message:
    """A request's header, after PROTOCOL.md's checks 1-8, cheapest first: nothing of an unregistered
    peer's is read past a small header, nor of a member's past what the swarm's letters need
    (``header_limit``, None before they set it), and no payload frame is looked at here."""
    if sum(len(f) for f in body) > max_payload_bytes + wire.MAX_HEADER_BYTES:
        raise wire.WireError(f"message over the {max_payload_bytes}-byte payload limit", "too-large")
    if body and header_limit is not None and len(body[0]) > header_limit:
        if not registered:
            raise wire.WireError(
                f"not registered: send HELLO first (until then, headers over {MAX_HELLO_BYTES} bytes are not read)",
                "not-registered",
            )
        raise wire.WireError(
            f"header of {len(body[0])} bytes; this swarm's requests need at most {header_limit}", "too-large"
        )
    msg = wire.decode_header(body, max_payload_bytes)
    if msg.cmd not in wire.CLIENT_COMMANDS:
        err = wire.WireError(
            f"{msg.cmd} is a broker reply, not a request; valid requests: {', '.join(wire.CLIENT_COMMANDS)}",
            "unknown-command",
        )
        err.seq = msg.get("seq")
        raise err
    return msg


def _welcome(topology, mode: str, max_staleness, peer_timeout: float, max_payload_bytes: int, plane) -> dict:
    """WELCOME's fields that are the same for every agent, built once. A named topology travels as
    its recipe (name, n, options, digest), so a HELLO costs the same at n = 4,096 as at n = 2; only
    a matrix of the user's own travels whole."""
    wired = topology.to_dict()
    if topology.name in topologies.NAMES:
        del wired["matrix"]
    return {
        "mode": mode,
        "max_staleness": max_staleness,
        "peer_timeout": peer_timeout,
        "max_payload": max_payload_bytes,
        "topology": wired,
        **plane.welcome(),
    }


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
