"""The agent's side of the wire: a DEALER socket with publish / collect.

The API says what to send and what to receive, not where the bytes travel: today both go
through the broker (PALA's data proxy). A call blocks until the broker answers; while it
waits the client pings every ``heartbeat`` seconds, so a parked request (a turn lock that
has not opened yet) is told apart from a dead broker. ``liveness`` silent heartbeats in a
row mean the broker is gone: the call raises BrokerUnavailable, the socket is rebuilt,
and the next call registers again (ZeroMQ restores connections, not registrations).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zmq

import topologies

from . import dataplane, keys, shmlocks, wire
from .settings import HEARTBEAT_S, LIVENESS
from .tensors import CudaStager, finite, pack


class GossipError(RuntimeError):
    """The broker refused a request; ``code`` is the ERROR code from PROTOCOL.md."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"{reason} [{code}]")
        self.code = code


class BrokerUnavailable(ConnectionError):
    """No sign of life from the broker within the liveness window."""


class GossipTimeout(TimeoutError):
    """The broker is alive, but the turn lock did not open within the call's timeout."""


class GossipStopped(Exception):
    """The client's ``stop`` was set while a call waited on the broker: the caller is ending."""


class _BrokerRestarted(Exception):
    """A reply carried another broker instance id: everything that broker knew about us is lost."""


@dataclass
class PublishResult:
    round: int
    written: list[int]
    skipped: list[int]


class GossipClient:
    """One agent's connection to the broker.

    ``timeout`` bounds how long one call may wait for a turn lock (None: as long as the
    broker is alive). ``codec`` compresses floating tensors on the wire ("bf16", "fp16").
    ``curve=(secret_file, broker_public_file)`` authenticates to a CURVE broker (gossiprl.comms.keys).
    The broker counts as gone after ``liveness`` heartbeats waited out in silence, and never before
    ``broker_grace`` seconds of it: a broker that is a thread of a busy process (``gossiprl run``'s
    launcher) pauses with that process, and its pauses are not its death. ``stop`` (an Event) ends
    a wait on the broker within a heartbeat, raising GossipStopped: an agent told to stop must not
    wait out that grace for a broker that died with its launcher.
    """

    def __init__(
        self,
        address: str,
        rank: int,
        *,
        n: int | None = None,
        topology=None,
        timeout: float | None = None,
        heartbeat: float = HEARTBEAT_S,
        liveness: int = LIVENESS,
        codec: str = "raw",
        check_finite: bool = True,
        takeover: bool = False,
        context: zmq.Context | None = None,
        curve=None,
        broker_grace: float = 0.0,
        stop=None,
    ):
        keys.check_endpoint(address)
        if codec not in wire.CODECS:
            raise ValueError(f"unknown codec {codec!r}; valid: {', '.join(wire.CODECS)}")
        if heartbeat <= 0 or liveness < 1:
            raise ValueError("heartbeat must be > 0 seconds and liveness >= 1")
        self.address, self.rank, self.codec = address, rank, codec
        self.timeout, self.heartbeat, self.liveness = timeout, heartbeat, liveness
        self.broker_grace, self._stop = broker_grace, stop
        self._expect_n = n
        self._expect_digest = topology.digest() if topology is not None else None
        self._ctx = context or zmq.Context.instance()
        self._curve = keys.client_options(*curve) if curve is not None else None
        self._curve_files = curve
        self._plane: dataplane.AgentPlane | None = None
        """Where letters' bytes go when the broker's swarm uses a data plane (WELCOME says which)."""
        self._watch: keys.HandshakeWatch | None = None
        self._seq = itertools.count(1)
        self._stager = CudaStager()
        self._sock: zmq.Socket | None = None
        self.topology = None
        self.mode = None
        self.round = 0
        self.broker: str | None = None
        """The broker's instance id, from WELCOME: a reply with another id means it restarted."""
        self.max_payload: int | None = None
        self._max_header = wire.MAX_HEADER_BYTES
        """The largest reply header read: a DELIVER carries one schema (under 1 MiB) per letter."""
        self.check_finite = check_finite
        self._takeover = takeover
        self.last_rounds: dict[int, int] = {}
        self.last_weights: dict[int, float] = {}
        """Weights to mix the last collect's letters with: this rank's row of the mixing matrix the
        broker had in force (dead peers rewired around), self included."""
        self._grant: dict | None = None
        """The broker's latest session grant (ACK and DELIVER ``session``, PROTOCOL.md 10.6)."""
        self._turns: shmlocks.Turns | None = None
        """Our edges' turn locks in shared memory, from the session's first round on (shmlocks)."""
        self._last_heard = time.monotonic()
        self.register()

    # ------------------------------------------------------------ connection

    def _connect(self) -> None:
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDTIMEO, int(self.heartbeat * self.liveness * 1000))
        for option, value in (self._curve or {}).items():
            self._sock.setsockopt(option, value)
        self._watch = keys.HandshakeWatch(self._sock, curve=self._curve is not None)
        self._sock.connect(self.address)

    def _unavailable(self, silent_s: float) -> BrokerUnavailable:
        """Reset the socket and say why the broker seems gone, with what the handshake events tell."""
        why = self._watch.diagnose() if self._watch is not None else None
        self._reset()
        return BrokerUnavailable(
            f"rank {self.rank}: broker at {self.address} silent for {silent_s:.3g}s" + (f"; {why}" if why else "")
        )

    def _reset(self) -> None:
        """Drop the socket (and anything queued on it); the next call reconnects and registers."""
        if self._watch is not None:
            self._watch.close()
        if self._sock is not None:
            self._sock.close(linger=0)
        self._sock = None
        self.topology = None
        self._stager.reset()

    def register(self) -> None:
        """HELLO -> WELCOME: bind this rank, learn the topology, mode and the round to continue from."""
        if self._sock is None:
            self._connect()
        fields = {"rank": self.rank, "n": self._expect_n, "topology": self._expect_digest, "takeover": self._takeover}
        previous, self.broker = self.broker, None  # whichever broker answers is the one this registration is with
        (welcome,) = self._request([(wire.HELLO, fields, ())], register=False)
        # Registering again later (after a reset or a broker restart) is this same agent
        # coming back, so it may take over a registration the broker still holds for it.
        self._takeover = True
        self.topology = topologies.from_dict(welcome["topology"])
        self.mode = welcome["mode"]
        # A restarted broker knows no rounds (it says 0): this agent's own count goes on.
        self.round = max(self.round, welcome["round"])
        self.broker = welcome.get("broker")
        self.max_payload = welcome.get("max_payload")
        self._max_header = wire.MAX_HEADER_BYTES * (self.topology.n + 1)  # n - 1 letters, weights, envelope
        self._set_plane(
            welcome.get("data_plane", "broker"),
            restarted=previous not in (None, self.broker),
            token=welcome.get("fetch_token"),
        )

    def _set_plane(self, plane: str, restarted: bool, token: str | None) -> None:
        """Follow the data plane the broker's WELCOME names. The segment and letter server are this
        agent's own, so the references they hand out outlive a broker restart; what the new broker
        lacks is which edges need a relay, so the writers this agent cannot reach are reported again,
        and its fetch token is the one letter servers take from now on."""
        if self._plane is not None and self._plane.plane != plane:
            self._plane.close()
            self._plane = None
        if self._plane is None and plane != "broker":
            self._plane = dataplane.AgentPlane(
                plane,
                self.address,
                self.mode,
                self._curve_files,
                fetch_timeout=self.heartbeat * self.liveness,
                n=self.topology.n,
            )
        if self._plane is not None:
            self._plane.set_token(token)
            if restarted:
                self._plane.report_again()

    def close(self) -> None:
        """Say BYE (so the rank is free at once) and close. Safe to call twice."""
        if self._turns is not None:
            self._turns.leave()  # neighbours waiting on our turns see it at once, before the broker does
            self._turns.close()
            self._turns = None
        if self._plane is not None:
            self._plane.close()
            self._plane = None
        if self._sock is not None:
            try:
                self._sock.send_multipart(wire.encode(wire.BYE, {"seq": next(self._seq)}), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            if self._watch is not None:
                self._watch.close()
            self._sock.close(linger=100)
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ topology view

    @property
    def weights(self) -> dict[int, float]:
        """This rank's row of the mixing matrix for the current round, self included."""
        return self._topology().weights(self.rank, round=self.round)

    @property
    def in_peers(self) -> tuple[int, ...]:
        return self._topology().in_peers(self.rank, round=self.round)

    @property
    def out_peers(self) -> tuple[int, ...]:
        return self._topology().out_peers(self.rank, round=self.round)

    def _topology(self):
        if self.topology is None:
            self.register()
        return self.topology

    # ------------------------------------------------------------ gossip

    def publish(self, tensors: Mapping[str, Any], timeout: float | None = None) -> PublishResult:
        """Send this round's tensors to every out-peer; returns once the broker has written them
        (sync: after each out-peer read the previous round's letter), so the caller may then
        modify the tensors again."""
        self._topology()
        turns = self._session()
        if turns is not None:
            return self._turn_publish(turns, tensors, self._deadline(timeout))
        (ack,) = self._request([self._publish_request(tensors)], timeout)
        self._note_ack(ack)
        return PublishResult(ack["round"], ack["written"], ack["skipped"])

    def collect(self, timeout: float | None = None) -> dict[int, dict]:
        """The in-peers' letters for this round as {peer rank: {name: read-only array}}, then
        advance the round. Sync: waits for every in-peer; async: whatever has arrived."""
        self._topology()
        turns = self._session()
        if turns is not None:
            return self._turn_collect(turns, self._deadline(timeout))
        (deliver,) = self._request([self._collect_request()], timeout)
        return self._finish_round(deliver)

    def exchange(
        self, tensors: Mapping[str, Any], timeout: float | None = None, checked: bool = False
    ) -> dict[int, dict]:
        """publish() then collect() pipelined in one round trip: both requests leave together and
        the two turn locks are waited on at the same time. Within a session both turns are taken
        in shared memory, one after the other, with no message to the broker. ``checked``: the
        caller has made sure the tensors hold no NaN or infinity, so check_finite skips them."""
        self._topology()
        turns = self._session()
        if turns is not None:
            deadline = self._deadline(timeout)
            self._turn_publish(turns, tensors, deadline, checked)
            return self._turn_collect(turns, deadline)
        ack, deliver = self._request([self._publish_request(tensors, checked), self._collect_request()], timeout)
        self._note_ack(ack)
        return self._finish_round(deliver)

    # ------------------------------------------------------------ a session's turns (shmlocks)

    def _deadline(self, timeout: float | None) -> float | None:
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    def _left(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _session(self) -> shmlocks.Turns | None:
        """The session whose turns this call takes, if any: from the round the grant names, all of
        them in shared memory; after leaving it, whatever its edges still owe (drain, then broker)."""
        grant, turns = self._grant, self._turns
        if grant is not None and self.round >= grant["round"] and (turns is None or turns.id != grant["id"]):
            if self._plane is None or self._plane.control is None:
                self._grant = None
                return turns
            turns = self._begin(grant)
        if turns is not None and not turns.left and time.monotonic() - self._last_heard > self.heartbeat:
            self._consult(turns)  # the broker hears from us, and we hear whether the session holds
        return turns

    def _begin(self, grant: dict) -> shmlocks.Turns:
        def peer(pid, fd, token):
            try:
                return shmlocks.PeerControl(pid, fd, token, self.topology.n)
            except (OSError, TypeError, ValueError):
                return None

        readers = {r[0]: r[1:] for r in grant["readers"]}
        ins = {}
        for w in self.topology.in_peers(self.rank, 0):
            ref = self._plane.writers.get(w, ({}, []))[0]
            ins[w] = peer(ref.get("pid"), ref.get("ctl_fd"), ref.get("ctl_token"))
        outs = {p: peer(*readers[p]) if p in readers else None for p in self.topology.out_peers(self.rank, 0)}
        if self._turns is not None:
            self._turns.close()
        self._turns = shmlocks.Turns(self._plane.control, self.rank, grant["id"], ins, outs)
        self._turns.row = self.topology.weights(self.rank, 0)  # static and whole while the session holds
        self._turns.enter()
        return self._turns

    def _consult(self, turns: shmlocks.Turns) -> None:
        """Ask the broker whether the session holds and which of our neighbours are gone: a turn
        that does not come within a heartbeat may be waiting on an agent that died or left."""
        about = sorted({*turns.ins, *turns.outs})
        (pong,) = self._request([(wire.PING, {"about": about}, ())])
        gone = pong.get("gone")
        if isinstance(gone, list):
            turns.gone |= {r for r in gone if r in about}
        if pong.get("session") != turns.id:
            turns.leave()

    def _wait(self, turns: shmlocks.Turns, blocked, deadline: float | None, why: int) -> None:
        """Wait for a turn, asking the broker every heartbeat (GossipTimeout past ``deadline``)."""
        while True:
            step = time.monotonic() + self.heartbeat
            if shmlocks.wait_for(blocked, step if deadline is None else min(step, deadline), turns.control, why):
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise GossipTimeout(f"rank {self.rank}: no turn within the timeout (round {self.round}, session)")
            self._consult(turns)

    def _turn_publish(
        self, turns: shmlocks.Turns, tensors, deadline: float | None, checked: bool = False
    ) -> PublishResult:
        """Post our letter once every reader has read the previous one; after leaving the session,
        once they read all we posted, the broker's way."""
        if not turns.left:
            if self.check_finite and not checked:
                _refuse_non_finite(tensors)
            segment = self._plane.segment
            token = segment.token
            _, ref = segment.write(tensors, self.round)
            if segment.token != token:
                turns.leave()  # a new schema: a new segment our readers do not know
            self._wait(turns, lambda: _turn(turns, turns.may_post()), deadline, shmlocks.FOR_READ)
            if not turns.left:
                turns.post(ref["version"])
                self._plane.acked = True
                return PublishResult(self.round, sorted(set(turns.outs) - turns.gone), [])
        if not turns.drained:
            self._wait(turns, turns.undrained, deadline, shmlocks.FOR_READ)
            turns.drained = True
        (ack,) = self._request([self._publish_request(tensors, checked)], self._left(deadline))
        self._note_ack(ack)
        return PublishResult(ack["round"], ack["written"], ack["skipped"])

    def _turn_collect(self, turns: shmlocks.Turns, deadline: float | None) -> dict[int, dict]:
        """Take each in-peer's letter when it is posted; an edge whose writer goes the broker's way
        (it left the session, or is gone) makes us leave too, and the broker's COLLECT then skips
        the letters already taken here."""
        letters, taken = {}, []
        for w in turns.ins:
            self._wait(turns, lambda w=w: _turn(turns, turns.may_read(w)), deadline, shmlocks.FOR_POST)
            version = turns.pending(w)
            if version is None:
                continue
            got = self._plane.read_posted(w, version)
            turns.mark_read(w)
            taken.append(w)
            if got is None:
                turns.leave()  # a letter we could not have: the broker path says why, and relays
            else:
                letters[w] = got
        if taken:
            turns.ring(shmlocks.FOR_READ)
        if not turns.left:
            self.last_rounds = dict.fromkeys(letters, self.round)
            self.last_weights = dict(turns.row)
            self.round += 1
            return letters
        (deliver,) = self._request([self._collect_request(taken)], self._left(deadline))
        return {**self._finish_round(deliver), **letters}

    def ping(self, timeout: float | None = None) -> float:
        """Round-trip time to the broker in seconds."""
        t0 = time.perf_counter()
        self._request([(wire.PING, {}, ())], timeout)
        return time.perf_counter() - t0

    def _publish_request(self, tensors, checked: bool = False):
        if self.check_finite and not checked:
            _refuse_non_finite(tensors)
        if self._plane is not None:
            return (wire.PUBLISH, *self._plane.publish(tensors, self.round))
        schema, buffers = pack(tensors, self.codec, self._stager)
        nbytes = sum(spec["nbytes"] for spec in schema)
        if self.max_payload is not None and nbytes > self.max_payload:  # the broker would drop the connection
            raise ValueError(
                f"{nbytes} bytes of tensors in one letter; the broker takes at most {self.max_payload} "
                "(start it with a larger --max-payload-mib)"
            )
        return (wire.PUBLISH, {"round": self.round, "tensors": schema}, buffers)

    def _collect_request(self, taken=()):
        fields = {"round": self.round, **(self._plane.collect_fields() if self._plane else {})}
        if taken:
            fields["taken"] = sorted(taken)
        return (wire.COLLECT, fields, ())

    def _note_ack(self, ack: wire.Message) -> None:
        if self._plane is not None:
            self._plane.relay_to = ack.get("relay", [])
            self._plane.acked = True
        self._note_grant(ack)

    def _note_grant(self, reply: wire.Message) -> None:
        """Keep a session grant the broker sent (a malformed one is ignored: turns stay with the broker)."""
        grant = reply.get("session")
        if (
            isinstance(grant, dict)
            and type(grant.get("id")) is int
            and grant["id"] != 0
            and type(grant.get("round")) is int
            and isinstance(grant.get("readers"), list)
            and all(isinstance(r, list) and len(r) == 4 and type(r[0]) is int for r in grant["readers"])
        ):
            self._grant = grant

    @property
    def plane_counts(self) -> dict[str, int]:
        """Which path the letters took and what the data plane dropped (empty on the broker's relay)."""
        return dict(self._plane.counts) if self._plane is not None else {}

    def _finish_round(self, deliver: wire.Message) -> dict[int, dict]:
        self._note_grant(deliver)
        self.last_rounds = {letter["rank"]: letter.get("round") for letter in deliver["messages"]}
        self.last_weights = {int(j): float(w) for j, w in deliver["weights"]}
        self.round += 1
        letters = wire.deliveries(deliver)
        if self._plane is not None:
            letters.update(self._plane.receive(deliver))
        return letters

    # ------------------------------------------------------------ request / reply

    def _request(self, requests: list, timeout: float | None = None, register: bool = True) -> list[wire.Message]:
        """Send requests back to back, wait for one reply each (matched by seq), pinging while waiting.

        A broker restart (a reply with another instance id) or a "not-registered" refusal (the
        broker expired us, or dropped our connection) re-registers and resends once; every other
        refusal raises GossipError.
        """
        timeout = self.timeout if timeout is None else timeout
        for attempt in (0, 1):
            if register and self.topology is None:
                self.register()
            try:
                return self._roundtrip(requests, timeout)
            except _BrokerRestarted:
                if attempt:
                    self._reset()
                    raise BrokerUnavailable(
                        f"rank {self.rank}: the broker at {self.address} restarted twice during one call"
                    ) from None
            except GossipError as err:
                if err.code != "not-registered" or not register or attempt:
                    raise
            self.topology = None
        raise AssertionError("unreachable")

    def _roundtrip(self, requests: list, timeout: float | None) -> list[wire.Message]:
        if self._sock is None:
            self._connect()
        seqs = []
        for cmd, fields, frames in requests:
            seq = next(self._seq)
            seqs.append(seq)
            try:  # blocks (up to SNDTIMEO) only when ZeroMQ dropped the connection, e.g. a refused handshake
                self._sock.send_multipart(wire.encode(cmd, {**fields, "seq": seq}, frames), copy=False)
            except zmq.Again:
                raise self._unavailable(self.heartbeat * self.liveness) from None
        replies: dict[int, wire.Message] = {}
        pings: set[int] = set()
        start = last_heard = time.monotonic()
        # Heartbeats waited out in a row with nothing heard. The broker is taken for gone only when
        # `liveness` of them were and the clock agrees: a pause of this whole process (a garbage
        # collection in a big host program, a starved core) moves the clock without any waiting, and
        # with the broker a thread of the same process, paused alike, it read as a dead broker.
        silent = 0
        while len(replies) < len(seqs):
            now = time.monotonic()
            if self._stop is not None and self._stop.is_set():
                raise GossipStopped(f"rank {self.rank}: stopped while waiting on the broker (round {self.round})")
            if timeout is not None and now - start > timeout:
                heard = (
                    "the broker is alive"
                    if silent < self.liveness
                    else f"broker last heard {now - last_heard:.3g}s ago"
                )
                raise GossipTimeout(f"rank {self.rank}: no turn within {timeout:.3g}s (round {self.round}; {heard})")
            window = max(self.heartbeat * self.liveness, self.broker_grace)
            if silent >= self.liveness and now - last_heard > window:
                raise self._unavailable(now - last_heard)
            wait = self.heartbeat if timeout is None else min(self.heartbeat, max(0.0, start + timeout - now))
            if not self._sock.poll(int(wait * 1000) + 1):
                silent += 1
                pings.add(next(self._seq))
                try:
                    self._sock.send_multipart(wire.encode(wire.PING, {"seq": max(pings)}), flags=zmq.NOBLOCK)
                except zmq.Again:  # no connection to queue on (a refused handshake): liveness decides
                    pass
                continue
            try:
                msg = wire.decode(self._sock.recv_multipart(copy=False), max_header=self._max_header)
            except wire.WireError:
                self._reset()
                raise
            last_heard = self._last_heard = time.monotonic()
            silent = 0
            seq = msg.get("seq")
            if self.broker is not None and msg.get("broker") not in (None, self.broker):
                raise _BrokerRestarted()
            if msg.cmd == wire.ERROR and (
                seq in seqs or seq is None or seq in pings and msg.get("code") == "not-registered"
            ):
                raise GossipError(msg.get("code", "unknown"), msg.get("reason", "refused"))
            if seq in seqs:
                replies[seq] = msg
        return [replies[s] for s in seqs]


def _turn(turns: shmlocks.Turns, decision) -> Any:
    """What to wait on for a turn (``Turns.may_post`` / ``may_read``): leaving is never waited for."""
    state, peer = decision
    if state == shmlocks.LEAVE:
        turns.leave()
    return peer if state == shmlocks.WAIT else None


def _refuse_non_finite(tensors: Mapping[str, Any]) -> None:
    """One diverged agent must not poison the swarm: refuse to send NaN or infinity at all."""
    for name, value in tensors.items():
        if not finite(value):
            raise ValueError(f"tensor {name!r} holds NaN or infinity; refusing to publish it")
