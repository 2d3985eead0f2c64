"""IMPALA's channel between a learner and its actor processes: trajectories one way, parameters the other.

The shape is torchbeast monobeast's, with its two in-process objects turned into messages over one
ZeroMQ connection per actor (PROTOCOL.md section 11 is the normative text):

- **trajectories**: each unroll an actor makes travels to the learner as one UNROLL (a msgpack
  header, then one raw frame per array). The queue they wait in is bounded by credits: an actor
  may send an unroll only for a CREDIT the learner granted, and the learner grants no more than
  ``capacity`` minus the unrolls it holds and the credits still out. A full queue therefore blocks
  the actors instead of dropping their work, and nothing is lost or delivered twice: the actor
  numbers its unrolls, the connection keeps their order.
- **parameters**: the learner posts its newest flat parameters and their version (its update
  count); an actor FETCHes them before each unroll and gets them back in PARAMS, or CURRENT when
  it already holds that version.

The learner's end (``LearnerEnd``) answers in a thread of its own, so an actor is served while the
learner's main thread is busy with an update: unrolls wait in a deque, credits are granted as the
learner takes them, and FETCH is answered from the last posted copy. An actor's end (``ActorEnd``)
is plain blocking calls, for a process that does nothing else. Every message is validated against
its command's schema before anything reads its frames; nothing received is executed. A bad message
is dropped and counted; one of the learner's own actors that reports a failure (FAILED), falls
silent or leaves ends the learner's next ``take`` with ``ActorFailed``. An actor from elsewhere
may come and go: one that closes says LEAVE, and the learner drops it (as it does one that falls
silent or reports a failure), freeing its seat and credits, and trains on with the others; should a
dropped one speak again (its network came back), it is answered STOP with the reason. The
learner admits at most ``max_actors`` actors at a time, and takes back the credits of one that holds
them for ``silence_s`` without sending an unroll, so no peer, however many identities it makes, can
hold the queue's room and starve the learner unseen. Each actor keeps one routing id (a uuid) for
its life and the learner's ROUTER hands a route over to a reconnecting connection, so an actor
whose TCP connection broke goes on with its number and credits. Only numpy arrays cross here: the
RL layer turns them into tensors. The transport is the caller's: ipc:// on one host, tcp:// (with
CURVE keys, ``keys``) across hosts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from . import keys
from .wire import MAX_UINT, PROTOCOL_VERSION, WireError, pack_tensors, parse_specs, unpack_tensors

log = logging.getLogger("gossiprl.comms.trajectories")

# Actor -> learner, then learner -> actor.
JOIN, UNROLL, FETCH, FAILED, LEAVE = "JOIN", "UNROLL", "FETCH", "FAILED", "LEAVE"
WELCOME, CREDIT, PARAMS, CURRENT, STOP = "WELCOME", "CREDIT", "PARAMS", "CURRENT", "STOP"

UNROLL_ARRAYS = ("obs", "actions", "rewards", "dones", "bootstrap", "logits")
"""The arrays of an UNROLL, in order; their dtypes and shapes are the learner's (``unroll_specs``)."""

HEARTBEAT_S = 1.0
"""How often an actor waiting for a credit asks for parameters, which tells the learner it lives."""
SILENCE_S = 60.0
"""Seconds without a word after which either end takes the other for gone; also how long an actor
may hold a credit without sending an unroll before the learner takes it back."""
MAX_REASON_CHARS = 1000
MAX_ENV_CHARS = 256
MAX_HEADER_BYTES = 1 << 16
"""The longest header any command has: an UNROLL's episodes are at most one per env step."""
REFUSED_SHOWN = 10
"""Bad messages logged one by one; past these they are only counted."""
GONE_KEPT = 1024
"""Routing ids of dropped actors the learner remembers, to tell one that speaks again to stop; the
oldest are forgotten past these (their messages then count as bad), so that a peer that joins and
leaves without end cannot grow the learner's memory."""

LEARNER_DONE = "the learner is done"
"""STOP's reason when the learner ended: its budget spent, or itself stopped (a resumed learner takes
new actors). Any other STOP after a JOIN was answered means the learner dropped this actor."""

FIELDS = {
    JOIN: {"env": str},
    UNROLL: {"index": int, "version": int, "episodes": list, "tensors": list},
    FETCH: {"have": int},
    FAILED: {"reason": str},
    LEAVE: {},
    WELCOME: {"actor": int, "seed": int, "params": int, "n_steps": int, "num_envs": int, "gamma": float},
    CREDIT: {"n": int},
    PARAMS: {"version": int, "tensors": list},
    CURRENT: {"version": int},
    STOP: {"reason": str},
}
"""Each command's fields beside ``v`` and ``cmd``, and their msgpack types: no more, no fewer."""
FRAMES = {UNROLL: len(UNROLL_ARRAYS), PARAMS: 1}
"""Payload frames each command carries; the others carry none."""
LOWEST = {"have": -1, "version": -1}
"""Integer fields that may be -1 (no parameters yet); every other one is 0 or more."""


class ActorFailed(RuntimeError):
    """One of the learner's own actors reported a failure, fell silent or left unasked; the learner
    stops with this one-line reason."""


class LearnerGone(ConnectionError):
    """The learner stopped answering, or refused this actor."""


class LearnerLost(LearnerGone):
    """The learner fell silent after this actor had joined it: its host or the network went away, or
    it dropped this actor, which a new start may rejoin."""


@dataclass
class Trajectory:
    """One actor's unroll as the learner takes it."""

    actor: int
    index: int
    """The actor's count of unrolls before this one: the learner can tell a lost or repeated one."""
    version: int
    """The learner's update count behind the parameters the actor acted with."""
    arrays: dict[str, Any]
    """``UNROLL_ARRAYS`` by name: read-only numpy views on the received frames."""
    episodes: list[tuple[float, int]] = field(default_factory=list)
    """(return, length) of the episodes that ended in this unroll."""


def unroll_specs(n_steps: int, num_envs: int, obs_shape, obs_dtype: str, num_actions: int) -> dict:
    """The (dtype, shape) of each array of an UNROLL of ``n_steps`` x ``num_envs`` steps."""
    steps = [n_steps, num_envs]
    return {
        "obs": (obs_dtype, [n_steps + 1, num_envs, *obs_shape]),
        "actions": ("int64", steps),
        "rewards": ("float32", steps),
        "dones": ("float32", steps),
        "bootstrap": ("float32", steps),
        "logits": ("float32", [*steps, num_actions]),
    }


# ------------------------------------------------------------------ messages


def encode(cmd: str, fields: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> list:
    """A message as frames: the msgpack header, then one raw frame per array (none copied)."""
    header = {"v": PROTOCOL_VERSION, "cmd": cmd, **fields}
    buffers = []
    if arrays is not None:
        header["tensors"], buffers = pack_tensors(arrays)
    return [msgpack.packb(header, use_bin_type=True), *buffers]


def decode(frames: Sequence, expected: Mapping[str, Mapping[str, tuple]]) -> tuple[str, dict, dict]:
    """(cmd, header, arrays) of a message, checked against its command's schema; WireError otherwise.

    ``expected`` gives, per command that carries arrays, the (dtype, shape) each must have: the
    receiver's, never the sender's word, so a frame is read only when its size is the one agreed."""
    if not frames:
        raise WireError("empty message")
    head = frames[0].buffer if hasattr(frames[0], "buffer") else frames[0]
    if len(head) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}", "too-large")
    try:
        header = msgpack.unpackb(head, raw=False, max_bin_len=0, max_array_len=MAX_HEADER_BYTES, max_map_len=64)
    except Exception:  # msgpack raises many types on garbage; all mean the same here
        raise WireError("header is not a msgpack map") from None
    if not isinstance(header, dict) or type(header.get("v")) is not int or header["v"] != PROTOCOL_VERSION:
        raise WireError(f"header must be a msgpack map with v = {PROTOCOL_VERSION}", "version")
    cmd = header.get("cmd")
    if cmd not in FIELDS:
        raise WireError(f"unknown command {str(cmd)[:40]!r}; valid: {', '.join(FIELDS)}", "unknown-command")
    schema = FIELDS[cmd]
    extra = set(header) - {"v", "cmd", *schema}
    if extra:
        raise WireError(f"{cmd} has unknown field(s) {sorted(map(str, extra))[:4]}; it takes {', '.join(schema)}")
    for key, kind in schema.items():
        _check_field(cmd, key, header.get(key), kind)
    if len(frames) - 1 != FRAMES.get(cmd, 0):
        raise WireError(f"{cmd} carries {FRAMES.get(cmd, 0)} payload frame(s), got {len(frames) - 1}")
    arrays = {}
    if cmd in FRAMES:
        arrays = _check_arrays(cmd, header["tensors"], frames[1:], expected.get(cmd))
    if cmd == UNROLL:
        _check_episodes(header["episodes"], math.prod(expected[UNROLL]["rewards"][1]))
    return cmd, header, arrays


def one_line(text: str) -> str:
    """``text`` as one line of printable characters: runs of whitespace and control characters
    (newlines, terminal escapes) become one space."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _check_field(cmd: str, key: str, value: Any, kind: type) -> None:
    if kind is int:
        if type(value) is not int or not LOWEST.get(key, 0) <= value <= MAX_UINT:
            raise WireError(f"{cmd} needs field {key!r}: an int from {LOWEST.get(key, 0)} to {MAX_UINT}")
    elif kind is float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise WireError(f"{cmd} needs field {key!r}: a finite number")
    elif kind is str:
        limit = MAX_ENV_CHARS if key == "env" else MAX_REASON_CHARS
        if not isinstance(value, str) or len(value) > limit:
            raise WireError(f"{cmd} needs field {key!r}: a string of at most {limit} characters")
    elif not isinstance(value, kind):
        raise WireError(f"{cmd} needs field {key!r} of type {kind.__name__}")


def _check_arrays(cmd: str, schema, frames: Sequence, expected: Mapping[str, tuple] | None) -> dict:
    if expected is None:
        raise WireError(f"{cmd} is not expected here")
    specs = parse_specs(schema)
    agreed = [(name, dtype, list(shape)) for name, (dtype, shape) in expected.items()]
    got = [(s.name, s.dtype, list(s.shape)) for s in specs]
    if got != agreed or any(s.decode_as != s.dtype for s in specs):
        raise WireError(f"{cmd} arrays {got} differ from the agreed {agreed}")
    for spec, frame in zip(specs, frames):
        size = len(frame.buffer) if hasattr(frame, "buffer") else len(frame)
        if size != spec.nbytes:
            raise WireError(f"{cmd}: array {spec.name!r} declares {spec.nbytes} bytes, its frame has {size}")
    return unpack_tensors(specs, frames)


def _check_episodes(episodes: list, most: int) -> None:
    """At most one episode per env step of the unroll, each [finite return, length >= 1]."""
    if len(episodes) > most or not all(
        isinstance(e, list)
        and len(e) == 2
        and type(e[0]) in (int, float)
        and math.isfinite(e[0])
        and type(e[1]) is int
        and 1 <= e[1] <= MAX_UINT
        for e in episodes
    ):
        raise WireError("UNROLL 'episodes' must be a list of [return, length] pairs, at most one per env step")


# ------------------------------------------------------------------ the learner's end


class LearnerEnd:
    """The learner's end: a bound ROUTER that takes actors, queues their unrolls under credits and
    serves them the posted parameters, all in a thread of its own (``trajectories-<endpoint>``).

    ``unroll`` is ``unroll_specs``' answer for this learner's unrolls, ``welcome`` what each actor is
    told when it joins (``params``, ``n_steps``, ``num_envs``, ``gamma``), ``seed_of(actor)`` the seed
    of its envs, and ``env`` the env id an actor must play to be admitted. ``curve``: (the learner's
    secret key file, the directory of admitted actors' public keys), as a broker's; an actor's
    routing id is then bound to the key it joined with. ``max_actors``: how many actors it admits
    at a time (default ``capacity``: more than the queue holds unrolls could never all hold a credit
    at once) beside the ``reserved`` ones, the routing ids of the actors the learner started itself,
    which always have a seat: actors from elsewhere that joined first could otherwise take every
    seat and leave the learner's own refused. A JOIN past them is answered STOP and counted in
    ``refused_joins``. Credits taken back from actors that held them ``silence_s`` without sending
    an unroll are counted in ``reclaimed``. Actors from elsewhere that left (LEAVE) or fell silent
    for ``silence_s`` are dropped, and counted in ``left``; those that failed (FAILED) are dropped
    too, and counted in ``failed``: they may come and go, while the learner's own leave only when
    it tells them to, and one that fails stops the learner."""

    def __init__(
        self,
        bind: str,
        env: str,
        unroll: Mapping[str, tuple],
        welcome: Mapping[str, Any],
        capacity: int,
        seed_of: Callable[[int], int],
        curve: tuple | None = None,
        silence_s: float = SILENCE_S,
        max_actors: int | None = None,
        reserved: Iterable[bytes] = (),
    ):
        self.env, self.capacity, self.seed_of, self.silence_s = env, capacity, seed_of, silence_s
        self.max_actors = capacity if max_actors is None else max_actors
        self.reserved = frozenset(reserved)
        self.welcome = dict(welcome)
        self.expected = {UNROLL: dict(unroll)}
        self.unrolls: deque[Trajectory] = deque()
        self.failures: list[str] = []
        self.bad_messages = 0
        self.joined = 0
        self.refused_joins = 0
        self.reclaimed = 0
        self.left = 0
        self.failed = 0
        self._ready = threading.Condition()
        self._params: tuple[int, np.ndarray] | None = None
        self._actors: dict[bytes, int] = {}
        """Each connected actor's routing id -> its number (numbers are never given twice: ``joined``
        counts on past those that left)."""
        self._credits: dict[bytes, int] = {}
        """Credits granted to each actor and not yet spent on an unroll."""
        self._heard: dict[bytes, float] = {}
        self._keys: dict[bytes, str | None] = {}
        """The CURVE public key each actor joined with (None without CURVE)."""
        self._owing: dict[bytes, float] = {}
        """Since when each actor holding credits has held them without sending an unroll."""
        self._benched: set[bytes] = set()
        """Actors whose credits were taken back: they come after the others for new ones until they
        send an unroll."""
        self._gone: dict[bytes, tuple[str | None, str, bool]] = {}
        """Dropped actors' routing ids -> (the key they joined with, the STOP reason to answer them
        with, whether one was logged yet), oldest first, at most GONE_KEPT."""
        self._curve = keys.CurveServer(*curve) if curve is not None else None
        self._ctx = self._curve.context if self._curve else zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting actor's new connection takes its route
        unroll_bytes = sum(math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape in unroll.values())
        self._sock.setsockopt(zmq.MAXMSGSIZE, unroll_bytes + MAX_HEADER_BYTES)  # a larger frame drops its sender
        if self._curve is not None:
            self._curve.apply(self._sock)
        try:
            self._sock.bind(bind)
        except zmq.ZMQError as err:
            self.close()
            raise OSError(f"cannot bind {bind} for actors: {err}") from None
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        wake = f"inproc://gossiprl-trajectories-{uuid.uuid4().hex}"
        self._wake_in = self._ctx.socket(zmq.PAIR)
        self._wake_in.bind(wake)
        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.connect(wake)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"trajectories-{self.endpoint}", daemon=True)
        self._thread.start()

    # ---- the learner's main thread

    def publish(self, params: np.ndarray, version: int) -> None:
        """Post a copy of ``params`` as ``version``: what actors get from now on."""
        copy = np.array(params, dtype=np.float32, copy=True).reshape(-1)
        with self._ready:
            self._params = (version, copy)

    def take(self, timeout: float) -> Trajectory | None:
        """The oldest unroll, waiting up to ``timeout`` seconds for one (None if none came);
        ActorFailed if an actor failed."""
        with self._ready:
            self._ready.wait_for(lambda: self.unrolls or self.failures, timeout)
            if self.failures:
                raise ActorFailed(self.failures[0])
            trajectory = self.unrolls.popleft() if self.unrolls else None
        if trajectory is not None:
            self._wake.send(b"")  # room in the queue: grant a credit now, not at the next poll
        return trajectory

    def failure(self, timeout: float) -> str | None:
        """The first actor's failure, waiting up to ``timeout`` seconds for one to be reported."""
        with self._ready:
            self._ready.wait_for(lambda: self.failures, timeout)
            return self.failures[0] if self.failures else None

    def depth(self) -> int:
        """Unrolls waiting for the learner."""
        return len(self.unrolls)

    def reserved_missing(self) -> int:
        """How many of the ``reserved`` actors (the learner's own) have not joined yet: actors from
        elsewhere that joined count for nothing here."""
        return len(self.reserved - set(self._actors))

    def close(self) -> None:
        """Tell every actor to stop, and stop serving."""
        if getattr(self, "_thread", None) is not None:
            self._stop.set()
            self._wake.send(b"")
            self._thread.join()
            self._thread = None
            self._wake.close(linger=0)
            self._wake_in.close(linger=0)
        if not self._sock.closed:
            self._sock.close(linger=0)
        if self._curve is not None:
            self._curve.close()

    # ---- the serving thread

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(int(HEARTBEAT_S * 1000)))
                if self._wake_in in events:
                    while self._wake_in.poll(0):
                        self._wake_in.recv()
                while self._sock.poll(0):
                    frames = self._sock.recv_multipart(copy=False)
                    self._receive(frames[0].bytes, frames[1:])
                now = time.monotonic()
                self._reclaim(now)
                self._grant(now)
                self._check_silence(now)
            for identity in self._actors:
                self._send(identity, STOP, {"reason": LEARNER_DONE})
        except zmq.ZMQError as err:  # the socket failed under us: say so where the learner looks
            with self._ready:
                self.failures.append(f"the actors' socket failed: {err}")
                self._ready.notify_all()
        finally:
            self._sock.close(linger=100)

    def _receive(self, identity: bytes, frames: list) -> None:
        try:
            cmd, header, arrays = decode(frames, self.expected)
        except WireError as err:
            self._refuse(identity, err)
            return
        key = frames[0].get("User-Id") if self._curve is not None else None  # set by the ZAP handler
        actor = self._actors.get(identity)
        if actor is not None and key != self._keys[identity]:  # a peer that knows another's routing id
            self._refuse(identity, WireError(f"{cmd} for actor-{actor} from a key other than the one it joined with"))
            return
        if cmd == JOIN:
            self._join(identity, header, key)
            return
        if actor is None and identity in self._gone:
            self._stop_gone(identity, cmd, key)
            return
        if actor is None or cmd not in (UNROLL, FETCH, FAILED, LEAVE):
            self._refuse(
                identity, WireError(f"{cmd} from {'an actor that never joined' if actor is None else 'an actor'}")
            )
            return
        self._heard[identity] = time.monotonic()
        if cmd == FETCH:
            self._answer_fetch(identity, header["have"])
        elif cmd == FAILED:  # one line whatever the actor sent: a newline or escape could forge log lines
            self._drop(identity, f"failed: {one_line(header['reason'])}", failed=True)
        elif cmd == LEAVE:
            self._drop(identity, "left before its learner told it to stop" if identity in self.reserved else "left")
        elif self._credits[identity] < 1:
            self._refuse(identity, WireError(f"actor-{actor} sent an UNROLL without a credit"))
        else:
            self._credits[identity] -= 1
            self._benched.discard(identity)
            if self._credits[identity]:
                self._owing[identity] = time.monotonic()
            else:
                self._owing.pop(identity, None)
            episodes = [(float(r), int(n)) for r, n in header["episodes"]]
            with self._ready:
                self.unrolls.append(Trajectory(actor, header["index"], header["version"], arrays, episodes))
                self._ready.notify_all()

    def _join(self, identity: bytes, header: dict, key: str | None) -> None:
        if header["env"] != self.env:
            self._send(identity, STOP, {"reason": f"this learner trains on {self.env}, not {header['env']}"})
            return
        actor = self._actors.get(identity)
        others = sum(1 for admitted in self._actors if admitted not in self.reserved)
        if actor is None and identity not in self.reserved and others >= self.max_actors:
            self.refused_joins += 1
            mine = f" beside its own {len(self.reserved)}" if self.reserved else ""
            reason = f"this learner admits at most {self.max_actors} actors{mine}, and has them"
            self._send(identity, STOP, {"reason": reason})
            self._warn(self.refused_joins, f"refused a JOIN: {reason}")
            return
        if actor is None:
            self._gone.pop(identity, None)  # a dropped actor that joins anew is a new actor
            actor = self._actors[identity] = self.joined
            self._credits[identity] = 0
            self._keys[identity] = key
            self.joined += 1
        self._heard[identity] = time.monotonic()
        self._send(identity, WELCOME, {"actor": actor, "seed": self.seed_of(actor), **self.welcome})

    def _answer_fetch(self, identity: bytes, have: int) -> None:
        posted = self._params
        if posted is None or posted[0] == have:
            self._send(identity, CURRENT, {"version": -1 if posted is None else posted[0]})
        else:
            self._send(identity, PARAMS, {"version": posted[0]}, {"params": posted[1]})

    def _grant(self, now: float) -> None:
        """Share the free room among the actors, one credit at a time to whoever holds fewest; a
        benched actor counts one more than it holds, so it never takes a credit from one with none."""
        free = self.capacity - len(self.unrolls) - sum(self._credits.values())
        grants = dict.fromkeys(self._credits, 0)
        for _ in range(max(free, 0) if grants else 0):
            fewest = min(grants, key=lambda i: self._credits[i] + grants[i] + (i in self._benched))
            grants[fewest] += 1
        for identity, n in grants.items():
            if n:
                self._credits[identity] += n
                self._owing.setdefault(identity, now)
                self._send(identity, CREDIT, {"n": n})

    def _reclaim(self, now: float) -> None:
        """Take back the credits of actors that held them ``silence_s`` without sending an unroll:
        an actor spends one per unroll, which takes less (or it would be silent that long), so these
        are a hung or hostile peer's, or CREDITs lost with a broken connection."""
        for identity, since in list(self._owing.items()):
            if now - since > self.silence_s:
                n, self._credits[identity] = self._credits[identity], 0
                del self._owing[identity]
                self._benched.add(identity)
                self.reclaimed += n
                log.warning(
                    "actor-%d held %d credit(s) for %g s without sending an unroll: taken back (%d so far)",
                    self._actors[identity],
                    n,
                    self.silence_s,
                    self.reclaimed,
                )

    def _check_silence(self, now: float) -> None:
        for identity, heard in list(self._heard.items()):
            if now - heard > self.silence_s:
                self._drop(
                    identity,
                    f"sent nothing for {self.silence_s:g} s: it hung, or its process, host or network went away",
                )

    def _drop(self, identity: bytes, why: str, failed: bool = False) -> None:
        """An actor that left, fell silent or ``failed`` (``why``). One of the learner's own stops the
        learner: it leaves only when told to, and its failure is the run's. One from elsewhere is
        forgotten, and the learner goes on with the others: such actors come and go (a person's
        Ctrl-C, a host taken back, a broken env there), and kept, it would hold its seat for ever
        and, silent, stop training; nor may its FAILED stop training, or any holder of an admitted
        key could end the run. Its credits return to the pool (the queue's bound counts only the
        actors kept) and its seat is free; its number is not given again, and a message it sends
        after (back from an outage) is answered STOP with ``why`` (``_stop_gone``)."""
        actor = self._actors[identity]
        if identity in self.reserved:
            self._fail(f"actor-{actor} {why}")
            del self._heard[identity]  # failed once: its silence is not reported again
            return
        credits = self._credits.pop(identity)
        reason = f"this learner dropped actor-{actor}, which {why}; start the actor again to join anew"
        self._gone[identity] = (self._keys[identity], reason[:MAX_REASON_CHARS], False)
        if len(self._gone) > GONE_KEPT:
            del self._gone[next(iter(self._gone))]
        for books in (self._actors, self._heard, self._keys):
            del books[identity]
        self._owing.pop(identity, None)
        self._benched.discard(identity)
        # said before it is counted: whoever waits on the count (the learner's stats) then reads why
        log.warning(
            "actor-%d %s: dropped, its seat and %d credit(s) freed (%d actors from elsewhere gone so far)",
            actor,
            why,
            credits,
            self.left + self.failed + 1,
        )
        if failed:
            self.failed += 1
        else:
            self.left += 1
        if not self._actors:  # no actor at all (--actors-per-agent 0): the learner can only wait
            log.warning("no actor left: waiting for the next to join %s", self.endpoint)

    def _stop_gone(self, identity: bytes, cmd: str, key: str | None) -> None:
        """Answer a dropped actor that speaks again (its network came back after ``silence_s``) with
        STOP and why: unanswered, it took its own ``silence_s`` to end, with no word of the reason.
        One short reply per message, and only under the key it joined with, so that no one can
        make the learner answer on another's route. Logged once per actor."""
        joined_with, reason, logged = self._gone[identity]
        if cmd == LEAVE:  # it ends already (a FAILED actor closing says LEAVE after): nothing to tell
            return
        if key != joined_with:
            self._refuse(identity, WireError(f"{cmd} for a dropped actor from a key other than the one it joined with"))
            return
        self._send(identity, STOP, {"reason": reason})
        if not logged:
            self._gone[identity] = (joined_with, reason, True)
            log.warning("a dropped actor sent %s: told it to stop (%s)", cmd, reason)

    def _fail(self, reason: str) -> None:
        with self._ready:
            self.failures.append(reason)
            self._ready.notify_all()

    def _refuse(self, identity: bytes, err: WireError) -> None:
        self.bad_messages += 1
        self._warn(self.bad_messages, f"dropped a message ({err})")

    @staticmethod
    def _warn(count: int, what: str) -> None:
        """Log the first REFUSED_SHOWN of a kind of refusal, ``count`` being this one's number."""
        if count <= REFUSED_SHOWN:
            log.warning(
                "actors' socket: %s%s", what, "" if count < REFUSED_SHOWN else "; further ones are only counted"
            )

    def _send(self, identity: bytes, cmd: str, fields: Mapping[str, Any], arrays=None) -> None:
        try:
            self._sock.send_multipart([identity, *encode(cmd, fields, arrays)], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # an actor that stopped reading: its replies are dropped, its silence noticed
            pass


# ------------------------------------------------------------------ an actor's end


class ActorEnd:
    """An actor's end: a DEALER connected to its learner. ``join`` once, then per unroll
    ``wait_for_credit``, ``fetch`` and ``send_unroll``; ``fail`` says why the actor ends, and
    ``close`` that it leaves.

    ``curve``: (this actor's secret key file, the learner's public key file), as a broker's client;
    or the keys themselves, (this actor's public, its secret, the learner's public), z85-encoded, as
    a learner hands them to the actor processes it starts."""

    def __init__(
        self, endpoint: str, curve: tuple | None = None, silence_s: float = SILENCE_S, routing_id: bytes | None = None
    ):
        self.endpoint, self.silence_s = keys.check_endpoint(endpoint), silence_s
        self.credits = 0
        self.stopped: str | None = None
        """The learner's reason, once it said STOP."""
        self.joined = False
        """Whether the learner welcomed this actor: it then has it on its books until it leaves."""
        self._params: tuple[int, np.ndarray] | None = None
        self._replies_due = 0
        self._heard = time.monotonic()
        self._expected: dict = {}
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.routing_id = routing_id or uuid.uuid4().hex.encode()
        """This actor's name at its learner for its life: a reconnection keeps its number and credits.
        A learner names the actors it starts itself, and keeps a seat for each (LearnerEnd ``reserved``)."""
        self._sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
        self._sock.setsockopt(zmq.SNDTIMEO, int(silence_s * 1000))  # a DEALER with no connection blocks a send
        for option, value in _client_options(curve).items():
            self._sock.setsockopt(option, value)
        self._sock.connect(endpoint)

    def join(self, env: str, stop=None) -> dict:
        """Introduce this actor (it plays ``env``); return the learner's WELCOME: the actor's
        number, its envs' seed, the parameter count and the unroll's n_steps, num_envs, gamma."""
        self._send(JOIN, {"env": env})
        welcome: dict = {}
        while not welcome:
            for cmd, header, _ in self._receive(stop):
                if cmd == WELCOME:
                    welcome = header
            if self.stopped is not None:
                raise LearnerGone(f"the learner at {self.endpoint} refused this actor: {self.stopped}")
            if stop is not None and stop.is_set():
                raise LearnerGone(f"stopped while joining the learner at {self.endpoint}")
        self.joined = True
        return welcome

    def expect_params(self, count: int) -> None:
        """The parameter vector's length agreed in WELCOME: a PARAMS of any other is refused."""
        self._expected = {PARAMS: {"params": ("float32", [count])}}

    def wait_for_credit(self, stop=None) -> bool:
        """Block until the learner grants a credit (True), or tells this actor to stop (False).
        While blocked, ask for parameters every HEARTBEAT_S: the learner hears that the actor
        lives, and the actor that the learner does."""
        while not self.credits:
            if self._replies_due == 0:
                self._ask(self._params[0] if self._params else -1)
            for _ in self._receive(stop, HEARTBEAT_S):
                pass
            if self.stopped is not None or (stop is not None and stop.is_set()):
                return False
        return True

    def fetch(self, into: np.ndarray, have: int, stop=None) -> int:
        """Copy the learner's newest parameters into ``into`` unless it holds version ``have``
        already; return the version it holds. Returns early once the learner says STOP."""
        self._ask(max(have, self._params[0] if self._params else -1))
        while self._replies_due and self.stopped is None and not (stop is not None and stop.is_set()):
            for _ in self._receive(stop):
                pass
        if self._params is not None and self._params[0] != have:
            into[...] = self._params[1]
            return self._params[0]
        return have

    def send_unroll(self, index: int, version: int, arrays: Mapping[str, np.ndarray], episodes) -> None:
        """Spend a credit on one unroll. Its arrays are sent from their own memory: the caller must
        not write to them afterwards (an actor makes new ones for each unroll)."""
        if self.credits < 1:
            raise RuntimeError("send_unroll needs a credit: call wait_for_credit first")
        self.credits -= 1
        fields = {"index": index, "version": version, "episodes": [[float(r), int(n)] for r, n in episodes]}
        self._send(UNROLL, fields, {name: arrays[name] for name in UNROLL_ARRAYS})

    def fail(self, reason: str) -> None:
        """Tell the learner why this actor ends (one line, cut to fit); it still leaves if the actor closes at once."""
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._send(FAILED, {"reason": one_line(reason)[:MAX_REASON_CHARS]})

    def close(self) -> None:
        """Leave: an actor that joined and was not told to stop says LEAVE first, so that its
        learner drops it at once, freeing its seat and credits, rather than taking its silence for
        a failure ``silence_s`` later. The send itself never blocks (with no connection, the learner
        gone, there is no one to tell), but the socket lingers up to 1 s at close to deliver it.
        Closing twice does nothing."""
        if self._sock.closed:
            return
        if self.joined and self.stopped is None:
            self._sock.setsockopt(zmq.LINGER, 1000)
            try:
                self._sock.send_multipart(encode(LEAVE, {}), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
        self._sock.close()

    def _ask(self, have: int) -> None:
        self._send(FETCH, {"have": have})
        self._replies_due += 1

    def _send(self, cmd: str, fields: Mapping[str, Any], arrays=None) -> None:
        try:
            self._sock.send_multipart(encode(cmd, fields, arrays), copy=False)
        except zmq.Again:  # no connection took it within SNDTIMEO: never up, or its handshake refused
            raise LearnerGone(
                f"the learner at {self.endpoint} has not answered for {self.silence_s:g} s "
                "(no connection: is it running there, and does it admit this actor's key?)"
            ) from None

    def _receive(self, stop, wait_s: float = HEARTBEAT_S):
        """The messages that came within ``wait_s``, their effects applied; LearnerGone after
        ``silence_s`` without one."""
        got = []
        if self._sock.poll(int(wait_s * 1000)):
            while self._sock.poll(0):
                try:
                    message = decode(self._sock.recv_multipart(copy=False), self._expected)
                except WireError as err:
                    log.warning("actor: dropped a message from the learner (%s)", err)
                    continue
                self._apply(*message)
                got.append(message)
            self._heard = time.monotonic()
        elif time.monotonic() - self._heard > self.silence_s and not (stop is not None and stop.is_set()):
            raise LearnerGone(f"the learner at {self.endpoint} has not answered for {self.silence_s:g} s")
        return got

    def _apply(self, cmd: str, header: dict, arrays: dict) -> None:
        if cmd == CREDIT:
            self.credits += header["n"]
        elif cmd in (PARAMS, CURRENT):
            self._replies_due = max(self._replies_due - 1, 0)
            if cmd == PARAMS and (self._params is None or header["version"] > self._params[0]):
                self._params = (header["version"], arrays["params"])
        elif cmd == STOP:
            self.stopped = one_line(header["reason"])


def _client_options(curve: tuple | None) -> dict[int, bytes]:
    """ActorEnd's ``curve`` as socket options: from key files (two paths) or from the keys (three)."""
    if curve is None:
        return {}
    if len(curve) == 2:
        return keys.client_options(*curve)
    public, secret, learner = curve
    return {zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret, zmq.CURVE_SERVERKEY: learner}
