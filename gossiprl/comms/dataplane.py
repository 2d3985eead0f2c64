"""Data planes: the letter's bytes go agent to agent; the broker keeps only the turn locks.

With ``data_plane`` ``shm``, ``direct`` or ``auto`` a PUBLISH carries the tensor schema and a
small *reference* (``ref``) instead of the tensor frames, and the broker hands the reference to the
readers in DELIVER, as opaque as it handles payloads. PROTOCOL.md section 10 is the normative text.

- Each writer owns a :class:`Segment`: an anonymous shared-memory file (``memfd_create``) with
  ``SLOTS`` slots, each stamped with a seqlock version. Nothing is ever named in /dev/shm, so no
  crash of any process can leak a segment: the kernel frees it when the last process holding the
  file or a mapping of it exits. The file is sealed against resizing before it is announced: a
  mapping of a file that shrinks kills its reader with SIGBUS, so a reader maps only a sealed
  segment whose header agrees with its size and the letter's schema. A reader on the same host
  maps it through ``/proc/<writer pid>/fd/<fd>`` once and copies each letter out of it before
  anything checks or mixes it: a writer's memory is the writer's to change, so what was checked
  must be what is mixed.
- ``direct``: the writer also serves its slots on a ZeroMQ ROUTER of its own (a
  :class:`LetterServer` thread); a reader on another host fetches them (:class:`Fetcher`), with
  CURVE when the swarm uses it.

Why three slots: in sync mode a writer writes letter k+1 only after the ACK of letter k, which
the broker sends once every reader emptied its mailbox of letter k-1, which a reader does only
after it finished mixing letter k-2 (it collects again only after mixing). So while a reader may
still be mixing letter k-1, the writer writes slot (k+1) mod 3 = (k-2) mod 3: never a slot anyone
reads. ``k`` is the writer's own count of letters, not the round, so it keeps this order across a
broker restart (which starts rounds again at 0). In async mode nothing holds a writer back, so a
reader copies the slot and then checks the version: a letter overwritten while copied is dropped
and counted, never mixed.

Torch tensors are left to ``tensors``, which copies a CUDA one device-to-host once, straight
into the slot.
"""

from __future__ import annotations

import fcntl
import functools
import hmac
import itertools
import logging
import math
import mmap
import os
import secrets
import socket
import stat
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from . import keys, shmlocks, wire
from .tensors import copy_into, dtype_name, pack

log = logging.getLogger("gossiprl.comms.dataplane")

PLANES = ("broker", "shm", "direct", "auto")
SLOTS = 3
ALIGN = 64
MAGIC = b"GRPSHM01"
HEADER_BYTES = 64
"""Segment header: magic (8 bytes), token (16), slots (u64), slot_bytes (u64), pid (u64), zero padding."""
SLOT_HEADER_BYTES = 64
"""Slot header: version (u64; odd while being written), round (i64), zero padding."""
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
"""The seals a segment carries before it is announced: its size is fixed for good, so no mapping
of it can ever reach past its end (a shrunk file kills whoever reads the lost pages with SIGBUS)."""
FETCH, LETTER = "FETCH", "LETTER"
SERVER_QUEUE = 4
"""Replies a letter server queues for one connection (ZMQ_SNDHWM); past it they are dropped. A
reader asks once per writer per round, so this is slack: it bounds what one connection that asks
and never reads costs the writer (250 FETCHes took one from 46 to 880 MiB)."""
SLOW_STRIKES = 3
"""Rounds in a row a writer may connect and not answer (in time, or at all: it hung up) before its
edge goes to the relay: a starved process loses a round or two, a server that stalls or oversends
on purpose loses its edge."""
_DTYPES = {
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "bfloat16": np.uint16,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "bool": np.bool_,
}


def check_plane(plane: str) -> str:
    if plane not in PLANES:
        raise ValueError(f"unknown data plane {plane!r}; valid: {', '.join(PLANES)}")
    return plane


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """Who can map whose memory: the same kernel boot and the same pid namespace (``/proc/<pid>``
    must name the writer). Network namespaces do not matter: shared memory does not cross a link."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return f"{socket.gethostname()}-{uuid.uuid4().hex}"  # no /proc: nobody else can map us
    return f"{boot}/{pidns}"


def layout(specs: Sequence[wire.TensorSpec]) -> tuple[list[int], int]:
    """Offsets of the tensors inside a slot's payload (each aligned to 64 bytes) and the payload size."""
    offsets, at = [], 0
    for spec in specs:
        offsets.append(at)
        at += -(-spec.nbytes // ALIGN) * ALIGN
    return offsets, at


def _specs_of(tensors: Mapping[str, Any]) -> list[wire.TensorSpec]:
    """The raw (uncompressed) schema of a dict of arrays/tensors: a segment stores bytes as they are."""
    if not isinstance(tensors, Mapping) or not tensors:
        raise ValueError("tensors must be a non-empty dict of name -> array/tensor")
    specs = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not 0 < len(name) <= wire.MAX_NAME_CHARS:
            raise ValueError(f"tensor names must be strings of 1..{wire.MAX_NAME_CHARS} characters, got {name!r}")
        dtype = dtype_name(value)
        if dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {dtype}; valid: {', '.join(wire.DTYPES)}")
        shape = tuple(int(s) for s in value.shape)
        specs.append(wire.TensorSpec(name, dtype, shape, math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize, dtype))
    return specs


class Segment:
    """One writer's slots in anonymous shared memory. Made at the first write (the schema sets its size)."""

    def __init__(self):
        self.token = b""
        self.fd: int | None = None
        self.map: mmap.mmap | None = None
        self.specs: list[wire.TensorSpec] = []
        self.offsets: list[int] = []
        self.slot_bytes = 0
        self.letters = 0
        self._versions: list[np.ndarray] = []
        self._key: tuple = ()
        """(name, dtype, shape) of each tensor of the last letter: the same again needs no new schema."""

    def _make(self, specs: list[wire.TensorSpec]) -> None:
        self.close()
        self.token = uuid.uuid4().bytes  # a reader that mapped the old segment must not take this one for it
        self.specs = specs
        self.offsets, self.slot_bytes = layout(specs)
        size = HEADER_BYTES + SLOTS * (SLOT_HEADER_BYTES + self.slot_bytes)
        self.fd = os.memfd_create(f"gossiprl-{os.getpid()}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
        self.map = mmap.mmap(self.fd, size)
        head = np.frombuffer(self.map, np.uint8, HEADER_BYTES)
        head[:8] = np.frombuffer(MAGIC, np.uint8)
        head[8:24] = np.frombuffer(self.token, np.uint8)
        head[24:48].view(np.uint64)[:] = (SLOTS, self.slot_bytes, os.getpid())
        self._versions = [self._slot_header(s) for s in range(SLOTS)]

    def _slot_header(self, slot: int) -> np.ndarray:
        return np.frombuffer(self.map, np.int64, 2, HEADER_BYTES + slot * (SLOT_HEADER_BYTES + self.slot_bytes))

    def payload(self, slot: int) -> memoryview:
        start = HEADER_BYTES + slot * (SLOT_HEADER_BYTES + self.slot_bytes) + SLOT_HEADER_BYTES
        return memoryview(self.map)[start : start + self.slot_bytes]

    def write(self, tensors: Mapping[str, Any], round: int) -> tuple[list[wire.TensorSpec], dict]:
        """Copy the letter into the next slot; returns its schema and the reference readers need."""
        try:
            key = tuple((name, value.dtype, tuple(value.shape)) for name, value in tensors.items())
        except AttributeError:
            key = ()
        if key and key == self._key and self.map is not None:
            specs = self.specs
        else:
            specs = _specs_of(tensors)
            if self.map is None or [s.schema_key for s in specs] != [s.schema_key for s in self.specs]:
                self._make(specs)
            self._key = key
        k = self.letters
        self.letters += 1
        slot, head = k % SLOTS, self._versions[k % SLOTS]
        head[0] = 2 * k + 1  # odd: being written (a reader that sees it, or a change, drops the letter)
        buf = self.payload(slot)
        for spec, offset, value in zip(specs, self.offsets, tensors.values()):
            dst = np.frombuffer(buf, _DTYPES[spec.dtype], math.prod(spec.shape), offset).reshape(spec.shape)
            copy_into(dst, value)
        head[1] = round
        head[0] = 2 * k + 2
        return specs, {
            "pid": os.getpid(),
            "fd": self.fd,
            "token": self.token.hex(),
            "slot": slot,
            "version": 2 * k + 2,
            "host": host_id(),
        }

    def close(self) -> None:
        if self.map is not None:
            self._versions = []
            try:
                self.map.close()
            except BufferError:  # a view handed out is still alive; the kernel frees it with us
                pass
            os.close(self.fd)
        self.map, self.fd = None, None


def split_payload(buf, specs: Sequence[wire.TensorSpec]) -> dict[str, np.ndarray]:
    """Read-only arrays over one slot's payload laid out as ``layout`` says (bfloat16 widened)."""
    out = {}
    for spec, offset in zip(specs, layout(specs)[0]):
        arr = np.frombuffer(buf, _DTYPES[spec.dtype], math.prod(spec.shape), offset).reshape(spec.shape)
        if spec.dtype == "bfloat16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        arr.flags.writeable = False
        out[spec.name] = arr
    return out


LATEST_SCANS = 3
"""Scans of the slots an async reader makes before it settles for no letter this round."""


def copy_whole(version_of, payload_of, slots: int, slot: int, version: int, latest: bool) -> bytearray | None:
    """Copy a letter out of its slot, then check the slot was not rewritten meanwhile (the seqlock).

    ``latest`` (async mode) takes the newest whole letter at least as new as ``version``: a reader
    that fell behind gets its writer's freshest parameters rather than nothing. A writer that
    rewrites its slots faster than one can be copied tears every copy of a scan, so the scan is
    tried LATEST_SCANS times before giving up. None: no such letter.
    """
    for _ in range(LATEST_SCANS if latest else 1):
        order = sorted(range(slots), key=version_of, reverse=True) if latest else [slot]
        for s in order:
            v = version_of(s)
            if v % 2 or v < version or (not latest and v != version):
                continue
            data = bytearray(payload_of(s))
            if version_of(s) == v:
                return data
    return None


class SegmentRefused(OSError):
    """A reference names something that is not a whole, sealed segment fitting the letter's schema."""


class TornLetter(Exception):
    """A sync-mode letter whose slot changed while it was copied: a writer that broke its promise."""


class ShmReader:
    """Maps writers' segments (once each) and copies letters out of them, checking the seqlock.

    Everything in a segment was written by another process, possibly a hostile one: the seals,
    size and header are checked before the first byte is mapped, and letters are handed out as
    copies, so a writer that rewrites its slot while we mix changes nothing we checked.
    """

    def __init__(self):
        self._maps: dict[tuple[int, str], tuple[mmap.mmap, int]] = {}
        self._copies: dict[tuple[int, str], bytearray] = {}

    def _map(self, ref: Mapping) -> tuple[mmap.mmap, int]:
        """The segment (mapped read-only) and its slot payload size, checked against its file."""
        key = (ref["pid"], ref["token"])
        if key in self._maps:
            return self._maps[key]
        # Non-blocking, and regular files only: a reference naming a pipe must not hang the reader.
        fd = os.open(f"/proc/{int(ref['pid'])}/fd/{int(ref['fd'])}", os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SegmentRefused("the descriptor does not name a shared-memory segment")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:  # a file that cannot be sealed at all
                seals = 0
            if seals & SEALS != SEALS:
                raise SegmentRefused("the segment is not sealed against resizing (F_SEAL_SHRINK, GROW, SEAL)")
            size = os.fstat(fd).st_size  # fixed for good now: read after the seals
            if size < HEADER_BYTES:
                raise SegmentRefused(f"the segment has {size} bytes, less than its {HEADER_BYTES}-byte header")
            seg = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        slots, slot_bytes, pid = (int(v) for v in np.frombuffer(seg, np.uint64, 3, 24))
        why = None
        if seg[:8] != MAGIC or seg[8:24].hex() != ref["token"]:
            why = "the descriptor names a file that is not that writer's segment"
        elif slots != SLOTS or pid != ref["pid"] or slot_bytes % ALIGN:
            why = f"the segment header says {slots} slots of {slot_bytes} bytes for pid {pid}"
        elif size != HEADER_BYTES + SLOTS * (SLOT_HEADER_BYTES + slot_bytes):
            why = f"the segment has {size} bytes, not the {SLOTS} slots of {slot_bytes} bytes its header claims"
        if why is not None:
            seg.close()
            raise SegmentRefused(why)
        for old in [k for k in self._maps if k[0] == key[0] or not os.path.exists(f"/proc/{k[0]}")]:
            self._maps.pop(old)[0].close()  # that process's previous segment, or a dead writer's
            self._copies.pop(old, None)
        self._maps[key] = (seg, slot_bytes)
        return seg, slot_bytes

    def read(self, ref: Mapping, specs: Sequence[wire.TensorSpec], latest: bool) -> dict[str, np.ndarray] | None:
        """A private copy of the letter, or None when the slot no longer holds it (a stale reference).

        ``latest=False`` (sync mode) copies exactly the referenced version, into a buffer kept per
        writer and valid until this reader collects again (a fresh one per letter cost more than
        the mix itself: page faults), and raises TornLetter if the version changed during the copy;
        ``latest=True`` (async mode) copies the newest whole letter (see ``copy_whole``).
        """
        seg, slot_bytes = self._map(ref)
        slot = ref["slot"]
        if type(slot) is not int or not 0 <= slot < SLOTS or layout(specs)[1] != slot_bytes:
            raise SegmentRefused("the reference does not fit the writer's segment and the letter's schema")

        def start(s):
            return HEADER_BYTES + s * (SLOT_HEADER_BYTES + slot_bytes)

        def version_of(s):
            return int(np.frombuffer(seg, np.int64, 1, start(s))[0])

        def payload_of(s):
            return memoryview(seg)[start(s) + SLOT_HEADER_BYTES : start(s) + SLOT_HEADER_BYTES + slot_bytes]

        if latest:
            data = copy_whole(version_of, payload_of, SLOTS, slot, int(ref["version"]), latest=True)
            return None if data is None else split_payload(data, specs)
        if version_of(slot) != ref["version"]:
            return None
        buf = self._copies.get(key := (ref["pid"], ref["token"]))
        if buf is None:
            buf = self._copies[key] = bytearray(slot_bytes)
        memoryview(buf)[:] = payload_of(slot)
        if version_of(slot) != ref["version"]:
            raise TornLetter(f"slot {slot} of writer pid {ref['pid']} changed while it was copied")
        return split_payload(buf, specs)

    def close(self) -> None:
        for seg, _ in self._maps.values():
            seg.close()
        self._maps.clear()
        self._copies.clear()


# ------------------------------------------------------------------ direct: serving and fetching letters


def _frame(header: dict) -> bytes:
    return msgpack.packb({"v": wire.PROTOCOL_VERSION, **header}, use_bin_type=True)


def _parse(frame) -> dict:
    """A FETCH or LETTER header; anything else (or garbage) raises WireError."""
    raw = frame.buffer if hasattr(frame, "buffer") else frame
    if len(raw) > 4096:
        raise wire.WireError("data-plane header too large", "too-large")
    try:
        header = msgpack.unpackb(raw, raw=False, max_bin_len=0, max_array_len=64, max_map_len=64)
    except Exception:  # msgpack raises many types on garbage; all mean the same here
        raise wire.WireError("data-plane header is not valid msgpack") from None
    if not isinstance(header, dict) or header.get("v") != wire.PROTOCOL_VERSION or type(header.get("v")) is not int:
        raise wire.WireError("data-plane header must be a msgpack map with v = 1", "version")
    if header.get("cmd") not in (FETCH, LETTER) or type(header.get("seq")) is not int:
        raise wire.WireError("data-plane header needs cmd FETCH or LETTER and an int seq")
    return header


def advertised_host(broker_address: str) -> str:
    """The address this agent's letter server binds: the interface its broker is reached through."""
    if not broker_address.startswith("tcp://"):
        return "127.0.0.1"
    host = broker_address[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
    if keys.is_loopback(broker_address):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent: routing only
        probe.connect((host, 9))
        return probe.getsockname()[0]


class LetterServer:
    """A writer's ROUTER that serves FETCH requests from its segment, in a thread of its own.

    The slot is copied and its version checked again before the reply leaves, so a reader never
    gets a letter that was being overwritten: it gets ``ok: false`` instead. Only a FETCH that
    carries the swarm's fetch token (from the broker's WELCOME, so only registered agents hold it)
    is answered; any other is dropped unanswered and counted in ``refused``: the port is reachable
    by anyone on the host or network, the parameters are the swarm's.
    """

    def __init__(self, segment: Segment, host: str, curve=None):
        self.segment = segment
        self.tokens: tuple[str, ...] = ()
        """The fetch tokens answered: the current broker's, and the previous one across a restart."""
        self.refused = 0
        self._curve = keys.CurveServer(*curve) if curve is not None else None
        self._ctx = self._curve.context if self._curve else zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 4096)
        self._sock.setsockopt(zmq.SNDHWM, SERVER_QUEUE)
        if self._curve is not None:
            self._curve.apply(self._sock)
        self._sock.bind(f"tcp://{host}:*")
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.public_key = self._curve.public.decode() if self._curve else None
        self._stop = threading.Event()
        self.served = 0
        self._thread = threading.Thread(target=self._serve, name="gossiprl-letters", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(100):
                    continue
                frames = self._sock.recv_multipart()
                if len(frames) != 2:
                    continue
                try:
                    req = _parse(frames[1])
                    if not self._admits(req.get("token")):
                        self.refused += 1
                        continue
                    self._answer(frames[0], req)
                except (wire.WireError, zmq.ZMQError) as err:
                    self.refused += 1
                    log.debug("letter server: refused a request: %s", err)
        finally:
            self._sock.close(linger=0)

    def _admits(self, token) -> bool:
        return isinstance(token, str) and any(hmac.compare_digest(token, t) for t in self.tokens)

    def _answer(self, identity: bytes, req: dict) -> None:
        seg, slot, version = self.segment, req.get("slot"), req.get("version")
        data = None
        if type(slot) is int and 0 <= slot < SLOTS and type(version) is int and seg.map is not None:
            data = copy_whole(
                lambda s: int(seg._slot_header(s)[0]),
                seg.payload,
                SLOTS,
                slot,
                version,
                latest=req.get("latest") is True,
            )
        ok = data is not None
        self._sock.send_multipart(
            [identity, _frame({"cmd": LETTER, "seq": req["seq"], "ok": ok}), data if ok else b""],
            flags=zmq.NOBLOCK,
            copy=False,
        )  # data is ours alone
        self.served += ok

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._curve is not None:
            self._curve.close()


class Fetcher:
    """A reader's DEALER sockets, one per writer endpoint: fetch many letters at once, in parallel.

    A writer is *unreachable* when no connection to it ever completed, within the timeout; one that
    connected but answers late is only *slow* (a starved process): it is waited for up to
    ``patience`` times longer, and past that its letter is dropped for this round (AgentPlane gives
    up on the edge after SLOW_STRIKES such rounds in a row). One that connected before and then
    *hung up* (its connection dropped, or a reconnection to it failed, after the FETCH left) is
    not waited for: its agent closed its server (it finished its run or died), or this reader
    dropped the connection over an oversized frame. Waiting ten liveness windows for it stalled the
    end of every run whose last writer left before a slower reader fetched. A reply already in
    the socket when the drop is seen is still taken. A reply is read only up to the size the
    letter's schema gives (ZMQ_MAXMSGSIZE: a larger frame drops the connection before it is
    buffered) and used only at exactly that size. Each FETCH carries ``token``, the swarm's.
    """

    _EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
    """What a writer connection's monitor reports: a handshake done; a connection lost; a connection
    attempt's socket closed, which is how a failed reconnection shows (a refused connect)."""

    def __init__(
        self,
        curve_client: Mapping[int, bytes] | None = None,
        context: zmq.Context | None = None,
        patience: float = 10.0,
    ):
        self._curve = dict(curve_client) if curve_client else None
        self._ctx = context or zmq.Context.instance()
        self._socks: dict[str, tuple[zmq.Socket, zmq.Socket, int]] = {}
        self._drops: dict[str, int] = {}
        """Per endpoint, how many times its connection was lost or a reconnection failed: compared
        before and after a FETCH, never read as a count of anything."""
        self._reached: set[str] = set()
        """Endpoints that ever completed a handshake: they keep their patience on a new socket."""
        self._seq = itertools.count(1)
        self.patience = patience
        self.token = ""

    def _sock(self, ref: Mapping, nbytes: int) -> zmq.Socket:
        endpoint = ref["endpoint"]
        if endpoint in self._socks and self._socks[endpoint][2] != nbytes:  # another schema: another limit
            self._drop(endpoint)
        if endpoint not in self._socks:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, max(4096, nbytes))
            if self._curve is not None:
                opts = {**self._curve, zmq.CURVE_SERVERKEY: str(ref.get("key", "")).encode()}
                for option, value in opts.items():
                    sock.setsockopt(option, value)
            monitor = sock.get_monitor_socket(self._EVENTS, addr=f"inproc://gossiprl-fetch-monitor-{uuid.uuid4().hex}")
            sock.connect(endpoint)
            self._socks[endpoint] = (sock, monitor, nbytes)
            self._drops[endpoint] = 0
        return self._socks[endpoint][0]

    def _dropped(self, endpoint: str) -> int:
        """Read what ``endpoint``'s monitor reported so far; its drops."""
        monitor = self._socks[endpoint][1]
        while monitor.poll(0):
            if parse_monitor_message(monitor.recv_multipart())["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._reached.add(endpoint)
            elif endpoint in self._reached:  # refused connects before the writer first answered are not hang-ups
                self._drops[endpoint] += 1
        return self._drops[endpoint]

    def _drop(self, endpoint: str) -> None:
        """Close a writer's socket, and with it whatever is queued to it; the next fetch reconnects."""
        sock, monitor, _ = self._socks.pop(endpoint)
        del self._drops[endpoint]
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)

    def fetch(
        self, wanted: Mapping[int, tuple[Mapping, Sequence[wire.TensorSpec]]], timeout: float, latest: bool = False
    ) -> tuple[dict[int, dict], dict[str, list[int]]]:
        """Letters by writer rank, and the ranks lost: ``overwritten``, ``unreachable``, ``slow``,
        ``hung-up``. ``latest``: the newest whole letter will do (async mode, as ``copy_whole``)."""
        pending, got = {}, {}
        lost = {"overwritten": [], "unreachable": [], "slow": [], "hung-up": []}
        for rank, (ref, specs) in wanted.items():
            seq = next(self._seq)
            sock = self._sock(ref, layout(specs)[1])
            drops = self._dropped(ref["endpoint"])  # what happened before this FETCH does not lose it
            fields = {"slot": ref["slot"], "version": ref["version"], "latest": latest, "token": self.token}
            try:
                sock.send(_frame({"cmd": FETCH, "seq": seq, **fields}), flags=zmq.NOBLOCK)
            except zmq.Again:
                lost["unreachable"].append(rank)
                continue
            pending[seq] = (rank, ref["endpoint"], specs, drops)
        endpoints = {e for _, e, _, _ in pending.values()}
        of_sock = {self._socks[e][0]: e for e in endpoints}
        poller = zmq.Poller()
        for sock in of_sock:
            poller.register(sock, zmq.POLLIN)

        def take(sock: zmq.Socket) -> None:
            frames = sock.recv_multipart(copy=False)
            try:
                reply = _parse(frames[0])
            except wire.WireError:
                return
            entry = pending.get(reply["seq"])
            if entry is None or entry[1] != of_sock[sock]:  # given up on, or another writer's FETCH
                return
            rank, _, specs, _ = pending.pop(reply["seq"])
            if reply.get("ok") is True and len(frames) == 2 and len(frames[1]) == layout(specs)[1]:
                got[rank] = split_payload(frames[1].buffer, specs)
            else:
                lost["overwritten"].append(rank)

        def drop_hung_up() -> None:
            """Give up the pending FETCHes whose writer hung up since they left. The monitor is read
            before the sockets: a reply that came before the drop is in its socket by then, and is taken."""
            now = {e: self._dropped(e) for e in endpoints}
            hung = [seq for seq, (_, e, _, drops) in pending.items() if now[e] > drops]
            for sock in of_sock:
                while sock.poll(0):
                    take(sock)
            for seq in hung:
                if seq in pending:
                    lost["hung-up"].append(pending.pop(seq)[0])

        start = time.monotonic()
        while pending:
            drop_hung_up()
            if not pending:
                break
            reached = all(e in self._reached for _, e, _, _ in pending.values())
            if time.monotonic() - start > timeout * (self.patience if reached else 1.0):
                break
            for sock, _ in poller.poll(100):
                take(sock)
        drop_hung_up()
        for rank, endpoint, _, _ in pending.values():
            lost["slow" if endpoint in self._reached else "unreachable"].append(rank)
        for endpoint in {e for _, e, _, _ in pending.values()} | {wanted[r][0]["endpoint"] for r in lost["hung-up"]}:
            self._drop(endpoint)
        return got, lost

    def close(self) -> None:
        for endpoint in list(self._socks):
            self._drop(endpoint)


# ------------------------------------------------------------------ one agent's end of the data plane


class AgentPlane:
    """What a GossipClient does differently when the broker carries references instead of bytes.

    ``publish`` writes the letter into the segment and returns the PUBLISH fields (plus the
    payload frames for readers the broker says cannot reach us: the relay fallback);
    ``receive`` turns the references of a DELIVER into letters, from shared memory on this host
    or fetched from the writer's server. ``counts`` says which path each letter took and what
    was dropped: ``overwritten`` (a stale reference), ``unreachable`` (its edge then falls back to
    the relay), ``slow`` (a writer that connected but did not answer in time), ``hung-up`` (the
    connection to a writer's server was lost before it answered: the writer left or died, or sent
    a frame beyond the size rule), ``writer-gone``
    (its process died before we mapped its segment), ``refused`` (a DELIVER entry whose reference
    or schema breaks PROTOCOL.md: that letter alone is dropped) and
    ``torn`` (a sync-mode letter changed while it was copied: a broken promise, never expected).
    """

    def __init__(self, plane: str, broker_address: str, mode: str, curve=None, fetch_timeout: float = 3.0, n: int = 0):
        self.plane, self.mode, self.fetch_timeout = check_plane(plane), mode, fetch_timeout
        self.segment = Segment()
        self.control = shmlocks.Control(n) if plane == "shm" and n > 0 else None
        """Our side of the turn locks in a session (shmlocks): only the shm plane has sessions."""
        self.writers: dict[int, tuple[dict, list]] = {}
        """Each in-peer's segment (its last reference, without slot and version) and schema, as its
        last DELIVER entry gave them: within a session, letters are found from these."""
        self.host = host_id()
        self.reader = ShmReader()
        self.server = None
        if plane in ("direct", "auto"):
            server_curve = None
            if curve is not None:  # readers that hold this agent's key pair (a swarm sharing one agent key)
                server_curve = (curve[0], frozenset({keys.load_secret(curve[0])[0]}))
            self.server = LetterServer(self.segment, advertised_host(broker_address), server_curve)
        client_keys = None
        if curve is not None:
            public, secret = keys.load_secret(curve[0])
            client_keys = {zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}
        self.fetcher = Fetcher(client_keys)
        self.relay_to: list[int] = []
        self.acked = True
        """Whether the last letter written into the segment was ACKed (PROTOCOL.md 10.3, Writing)."""
        self.unreachable: set[int] = set()
        self._to_report: set[int] = set()
        self._slow: dict[int, int] = {}
        """Rounds in a row each writer connected but did not answer, or hung up (see SLOW_STRIKES)."""
        self.counts = {
            k: 0
            for k in (
                "shm",
                "direct",
                "relay",
                "overwritten",
                "unreachable",
                "slow",
                "hung-up",
                "writer-gone",
                "torn",
                "refused",
                "sent-inline",
                "session",
            )
        }

    def publish(self, tensors: Mapping[str, Any], round: int) -> tuple[dict, list]:
        if not self.acked:
            # The previous letter got no ACK (a timeout, a lost broker): some reader may still hold
            # it, or the one before, in place, so no slot is known to be free. This letter travels
            # through the broker, bytes and all, like any relay letter.
            schema, frames = pack(tensors)
            self.counts["sent-inline"] += 1
            return {"round": round, "tensors": schema}, frames
        self.acked = False
        specs, ref = self.segment.write(tensors, round)
        if self.plane == "direct":
            del ref["pid"], ref["fd"], ref["token"], ref["host"]
        if self.control is not None:
            ref.update(self.control.ref())
        if self.server is not None:
            ref["endpoint"] = self.server.endpoint
            if self.server.public_key:
                ref["key"] = self.server.public_key
        frames = []
        if self.relay_to:  # some reader cannot reach us: the broker relays this letter's bytes to it
            buf = self.segment.payload(ref["slot"])
            frames = [bytes(buf[o : o + s.nbytes]) for s, o in zip(specs, self.segment.offsets)]
        return {"round": round, "tensors": [s.to_wire() for s in specs], "ref": ref}, frames

    def collect_fields(self) -> dict:
        """Tell the broker (once) which writers we cannot reach, so it relays their letters to us."""
        if not self._to_report:
            return {}
        fields, self._to_report = {"unreachable": sorted(self._to_report)}, set()
        return fields

    def set_token(self, token) -> None:
        """The fetch token of the broker this agent just registered with (WELCOME ``fetch_token``).
        Our server keeps answering the previous one too: readers re-register one by one after a
        broker restart, and each still fetches with the old token until it has."""
        token = token if isinstance(token, str) and 0 < len(token) <= 64 else ""
        self.fetcher.token = token
        if self.server is not None and token and token not in self.server.tokens:
            self.server.tokens = (token, *self.server.tokens[:1])

    def report_again(self) -> None:
        """A restarted broker knows none of the relay edges: name every writer we cannot reach anew."""
        self._to_report |= self.unreachable

    def receive(self, deliver: wire.Message) -> dict[int, dict[str, np.ndarray]]:
        out, remote = {}, {}
        for letter in deliver["messages"]:
            ref, rank = letter.get("ref"), letter["rank"]
            if "refused" in letter:
                self.counts["refused"] += 1
                log.warning("dropped the letter of rank %d: %s", rank, letter["refused"])
                continue
            if not isinstance(ref, dict) or letter.get("relayed"):
                self.counts["relay"] += 1
                continue
            if rank in self.unreachable:
                self.counts["unreachable"] += 1
                continue
            fetchable = (
                isinstance(ref.get("endpoint"), str)
                and ref["endpoint"].startswith("tcp://")
                and type(ref.get("slot")) is int
                and type(ref.get("version")) is int
            )
            if self.plane != "direct" and ref.get("host") == self.host:
                self.writers[rank] = ({k: v for k, v in ref.items() if k not in ("slot", "version")}, letter["specs"])
                try:
                    got = self.reader.read(ref, letter["specs"], latest=self.mode != "sync")
                except TornLetter as err:
                    self.counts["torn"] += 1
                    log.error("dropped a letter: %s", err)
                    continue
                except (OSError, KeyError, TypeError, ValueError) as err:
                    log.warning("cannot map the segment of rank %d: %s", rank, err)
                    got = False
                if got is None:
                    self.counts["overwritten"] += 1
                elif got is False and type(ref.get("pid")) is int and not os.path.exists(f"/proc/{ref['pid']}"):
                    self.counts["writer-gone"] += 1
                elif got is False and fetchable:  # auto: not mappable after all (permissions, say)
                    remote[rank] = (ref, letter["specs"])
                elif got is False:
                    self._lost(rank)
                else:
                    self.counts["shm"] += 1
                    out[rank] = got
            elif fetchable:
                remote[rank] = (ref, letter["specs"])
            else:
                self._lost(rank)
        if remote:
            got, lost = self.fetcher.fetch(remote, self.fetch_timeout, self.mode != "sync")
            out.update(got)
            self.counts["direct"] += len(got)
            self.counts["overwritten"] += len(lost["overwritten"])
            self.counts["slow"] += len(lost["slow"])
            self.counts["hung-up"] += len(lost["hung-up"])
            for rank in got:
                self._slow.pop(rank, None)
            for rank in lost["slow"] + lost["hung-up"]:
                self._slow[rank] = self._slow.get(rank, 0) + 1
                if self._slow[rank] >= SLOW_STRIKES:
                    del self._slow[rank]
                    self._lost(rank)
            for rank in lost["unreachable"]:
                self._lost(rank)
        return out

    def read_posted(self, rank: int, version: int) -> dict[str, np.ndarray] | None:
        """Copy the letter ``rank`` posted to us in a session (shmlocks) out of its segment, checked as
        any shm letter is; None when it cannot be had (counted, as ``receive`` counts)."""
        base = self.writers.get(rank)
        if base is None:
            self.counts["unreachable"] += 1
            return None
        ref = {**base[0], "slot": (version // 2 - 1) % SLOTS, "version": version}
        try:
            got = self.reader.read(ref, base[1], latest=False)
        except TornLetter as err:
            self.counts["torn"] += 1
            log.error("dropped a letter: %s", err)
            return None
        except (OSError, KeyError, TypeError, ValueError) as err:
            log.warning("cannot map the segment of rank %d: %s", rank, err)
            self.counts["writer-gone" if not os.path.exists(f"/proc/{base[0].get('pid')}") else "unreachable"] += 1
            return None
        if got is None:
            self.counts["overwritten"] += 1
            return None
        self.counts["shm"] += 1
        self.counts["session"] += 1
        return got

    def _lost(self, rank: int) -> None:
        log.warning("cannot reach the letters of rank %d; asking the broker to relay them", rank)
        self.counts["unreachable"] += 1
        self.unreachable.add(rank)
        self._to_report.add(rank)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.fetcher.close()
        self.reader.close()
        self.segment.close()
        if self.control is not None:
            self.control.close()
            self.control = None


# ------------------------------------------------------------------ the broker's end of the data plane


class BrokerPlane:
    """What the broker decides about letters' bytes: what each reader is handed, and which edges it relays.

    A reader that cannot open some writers' references names them in COLLECT ``unreachable``; those
    edges are relayed from then on: the writer is told in its ACK ``relay`` to attach its bytes, and
    the broker forwards them on those edges only (PROTOCOL.md section 10.5). No sockets: the broker
    says who is registered and who reads whom as the topology is wired now."""

    def __init__(self, plane: str):
        self.plane = check_plane(plane)
        self.fetch_token = secrets.token_hex(16) if self.plane in ("direct", "auto") else None
        """Handed to registered agents in WELCOME: letter servers answer only FETCHes that carry it."""
        self.relay_edges: set[tuple[int, int]] = set()
        """Edges (writer, reader) whose reader cannot reach the writer's data plane: relayed by the broker."""
        self.events: Counter[str] = Counter()
        self.session = 0
        """The session in force (PROTOCOL.md 10.6; random, never 0), or 0: turns go through the broker."""
        self.session_round = 0
        self._ready: dict[int, dict] = {}
        """Ranks whose letter came through the broker since the last session ended, with the reference
        to their control segment: a session is granted once every rank is in."""

    def welcome(self) -> dict:
        """WELCOME's data-plane fields: none for the broker plane, so its agents see the protocol as before."""
        return {
            **({"data_plane": self.plane} if self.plane != "broker" else {}),
            **({"fetch_token": self.fetch_token} if self.fetch_token else {}),
        }

    def unreachable(self, reader: int, writers, locks) -> int:
        """A reader names writers it could not reach (COLLECT ``unreachable``). Only the edges it reads
        as ``locks`` (the TurnLocks) are wired now are relayed: one COLLECT naming every rank used to
        make every writer upload every letter. A new relayed edge ends the session, since it cannot
        take its turns in shared memory. Returns how many edges it relays anew."""
        added = 0
        for j in writers:
            if (j, reader) in self.relay_edges:
                continue
            if j != reader and locks.reads_from(reader, j):
                self.relay_edges.add((j, reader))
                self.events["data-plane-fallbacks"] += 1
                added += 1
            else:
                self.events["relay-requests-ignored"] += 1
        if added:
            self.end_session(locks)
        return added

    def open_letter(self, letter, reader: int) -> tuple[dict, list, int]:
        """What ``reader`` is handed of a letter (the TurnLocks hook): a reference-only letter, or one
        the reader can open itself, goes without its frames; a relayed edge gets the bytes too."""
        if "ref" not in letter.header:
            return letter.header, letter.payload, letter.nbytes
        if letter.payload and (letter.sender, reader) in self.relay_edges:
            return {**letter.header, "relayed": True}, letter.payload, letter.nbytes
        return {**letter.header, "relayed": False}, [], 0

    def published(self, rank: int, header: dict, round: int, swarm) -> None:
        """A letter came through the broker (``swarm``: the broker, for its locks, registry and mode).

        Within a session, one of the session's rounds means its writer left it: the session ends.
        Otherwise, once every rank sent one with a control segment, all on one host, the swarm
        whole and wired as drawn, a session begins. It starts two rounds past the furthest rank, so
        every rank hears of it on the way there."""
        if self.plane != "shm":
            return
        locks = swarm.locks
        if self.session:
            if round < self.session_round:
                return
            self.end_session(locks)
        ref = header.get("ref")
        if not isinstance(ref, dict) or "ctl_fd" not in ref:
            return
        self._ready[rank] = ref
        if (
            len(self._ready) < locks.topology.n
            or swarm.mode != "sync"
            or locks.topology.period != 1
            or locks.gone_ranks
            or self.relay_edges
            or len({r.get("host") for r in self._ready.values()}) != 1
            or not all(swarm.registry.registered(r) for r in range(locks.topology.n))
        ):
            return
        self.session = secrets.randbits(62) + 1
        self.session_round = max(r.round for r in locks.ranks) + 2
        self.events["sessions"] += 1

    def end_session(self, locks) -> None:
        """The swarm changed (an agent gone, back or registered anew, left the session, an edge
        relayed): turns go back to the broker; agents hear it when they next ask (PONG ``session``)
        or see a neighbour leave. The letters the broker still keeps from before the session were
        read long ago: forgotten, or rewiring would hand one to a new reader as its latest."""
        if self.session:
            self.events["sessions-ended"] += 1
            for me in locks.ranks:
                if me.round < self.session_round and me.publish is None:
                    me.last_letter = None
        self.session = 0
        self._ready.clear()

    def grant(self, rank: int, topology) -> dict:
        """The ``session`` field of ``rank``'s ACK and DELIVER while a session is in force: its id,
        first round, and the control segments of the readers of rank's letters."""
        if not self.session:
            return {}
        readers = []
        for p in topology.out_peers(rank, 0):
            ref = self._ready[p]
            readers.append([p, ref.get("pid"), ref.get("ctl_fd"), ref.get("ctl_token")])
        return {"session": {"id": self.session, "round": self.session_round, "readers": readers}}

    def reply_fields(self, rank: int, cmd: str, locks, registered: Callable[[int], bool]) -> dict:
        """What the data plane adds to a reply the locks released for ``rank``: an ACK's ``relay`` (the
        readers its writer must send the bytes to), and the session grant while a session is in force."""
        relay = self.relays(rank, locks, registered) if cmd == wire.ACK else []
        return {**({"relay": relay} if relay else {}), **self.grant(rank, locks.topology)}

    def relays(self, writer: int, locks, registered: Callable[[int], bool]) -> list[int]:
        """Readers that cannot open ``writer``'s references (its last letter in ``locks``, the
        TurnLocks), registered and still reading it as wired now: its ACK tells it to send the
        bytes along (no bytes are uploaded for a reader that left)."""
        letter = locks.ranks[writer].last_letter
        if letter is None or "ref" not in letter.header:
            return []
        return sorted(i for j, i in self.relay_edges if j == writer and registered(i) and locks.reads_from(i, writer))
