"""Turn locks in shared memory: once the broker grants a session, shm edges hand over turns agent to agent.

Through the broker, each round costs two control round trips and the broker's Python (about 1 ms
at two agents, 12-18x a shared-memory ring's whole round at MinAtar size). Within a *session*
(PROTOCOL.md 10.6) every agent instead keeps its side of its edges' turn locks in a small
control segment of its own, and its neighbours map it read-only:

- ``sent[p]``: letters this agent posted on its edge to p, ``version[p]``: the last one's version;
- ``read[w]``: letters this agent read on its edge from w.

The edge w -> i holds an unread letter exactly while ``sent_w[i] > read_i[w]``: the broker's
one-slot mailbox, kept by the two ends. Sync mode, as PALA's Algorithm 2: a writer posts once
every reader has read its previous letter; a reader waits until every in-peer posted, copies,
and counts it read. Each agent writes only its own segment, so a peer that forges its counters
stalls or skips its own edges and nothing else; the letter itself is still copied out and
checked (``dataplane.ShmReader``) before anyone mixes it.

Waiting is a futex on the awaited peer's *doorbell*, a word it bumps (and wakes) after every
change of its counters: no spinning, as with GALA's semaphores, and no lost wake-up, because the
doorbell is read before the condition is checked again. Where futexes are not reachable the wait
polls with a sleep that backs off. No sockets, no broker: ``dataplane.AgentPlane`` and the client
decide when a session begins and ends.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import mmap
import os
import platform
import stat
import time
import uuid

import numpy as np

MAGIC = b"GRPCTL01"
HEADER_BYTES = 128
"""Magic (8 bytes), token (16), n (u64), pid (u64), zero to 64; doorbell (u32) at 64, session (i64)
at 72, left (i64) at 80, sleeping (i64) at 88, zero to 128; then per peer rank p: sent, version,
read (i64 each)."""
DOORBELL, SESSION = 64, 72
FOR_POST, FOR_READ = 0, 1
"""Why an agent sleeps on a neighbour's doorbell: for its next letter, or for it to read ours. A
doorbell wakes only the sleepers its change concerns: a wake-up that finds nothing to do costs a
context switch, which on a busy host is the dearest part of a turn."""
FIELDS = 3
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}


class ControlRefused(OSError):
    """A reference names something that is not a whole, sealed control segment for this swarm."""


def size_for(n: int) -> int:
    return HEADER_BYTES + FIELDS * 8 * n


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


@functools.lru_cache(maxsize=1)
def _syscall():
    """libc's syscall() and the futex number, or None where there is no futex to call."""
    number = _SYS_FUTEX.get(platform.machine())
    if number is None or not hasattr(os, "memfd_create"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.syscall.restype = ctypes.c_long
    return libc.syscall, number


def futex_wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the u32 at ``address`` holds ``expected``, at most ``timeout`` seconds (a wake-up,
    a signal or a changed word end it early; the caller checks its condition again either way)."""
    call = _syscall()
    if call is None:
        time.sleep(min(timeout, 0.001))
        return
    sec = int(timeout)
    ts = _Timespec(sec, int((timeout - sec) * 1e9))
    call[0](call[1], ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected), ctypes.byref(ts), None, 0)


def futex_wake(address: int) -> None:
    call = _syscall()
    if call is not None:
        call[0](call[1], ctypes.c_void_p(address), _FUTEX_WAKE, ctypes.c_int(1 << 30), None, None, 0)


@functools.lru_cache(maxsize=1)
def _fence():
    """A full memory barrier, or None: on x86-64 glibc's pthread_spin_trylock is one locked
    instruction. A doorbell skips its wake-up syscall (about as dear as the rest of a turn) only
    when no neighbour sleeps on it, and the store of the doorbell must be seen before that check."""
    if platform.machine() != "x86_64" or _syscall() is None:
        return None
    libc = ctypes.CDLL(None)
    lock = ctypes.c_int(1)
    if not hasattr(libc, "pthread_spin_trylock"):
        return None
    trylock, unlock, ref = libc.pthread_spin_trylock, libc.pthread_spin_unlock, ctypes.byref(lock)

    def fence():
        trylock(ref)
        unlock(ref)

    return fence


class _View:
    """The fields of a control segment, over a mapping (ours writable, a peer's read-only)."""

    def __init__(self, buf, n: int):
        self.n = n
        self.bell = np.frombuffer(buf, np.uint32, 1, DOORBELL)
        self.state = np.frombuffer(buf, np.int64, 3, SESSION)
        self.edges = np.frombuffer(buf, np.int64, FIELDS * n, HEADER_BYTES).reshape(n, FIELDS)
        self.bell_address = self.bell.ctypes.data

    def doorbell(self) -> int:
        return int(self.bell[0])

    def session(self) -> int:
        return int(self.state[0])

    def left(self) -> bool:
        return bool(self.state[1])

    def sleeping(self) -> int:
        """2 (1 + the rank whose doorbell this agent sleeps on) + FOR_POST or FOR_READ, or 0."""
        return int(self.state[2])

    def sent(self, p: int) -> int:
        return int(self.edges[p, 0])

    def version(self, p: int) -> int:
        return int(self.edges[p, 1])

    def read(self, w: int) -> int:
        return int(self.edges[w, 2])


class Control(_View):
    """This agent's own control segment: the only memory it writes that its neighbours read."""

    def __init__(self, n: int):
        self.token = uuid.uuid4().bytes
        self.fd = os.memfd_create(f"gossiprl-ctl-{os.getpid()}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        size = size_for(n)
        os.ftruncate(self.fd, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
        self.map = mmap.mmap(self.fd, size)
        head = np.frombuffer(self.map, np.uint8, 40)
        head[:8] = np.frombuffer(MAGIC, np.uint8)
        head[8:24] = np.frombuffer(self.token, np.uint8)
        head[24:40].view(np.uint64)[:] = (n, os.getpid())
        super().__init__(self.map, n)

    def ref(self) -> dict:
        """What a neighbour needs to map this segment (it travels in a letter's ``ref``)."""
        return {"ctl_fd": self.fd, "ctl_token": self.token.hex()}

    def ring(self) -> None:
        """Tell whoever waits on us that something changed (after the change, never before)."""
        self.bell[0] += np.uint32(1)
        futex_wake(self.bell_address)

    def enter(self, session: int, left: bool = False) -> None:
        """Start a session: every edge empty and *left* set, then the session's id (a neighbour reads
        our counters only once it sees that id, so it never sees the last session's, nor us in a
        session we joined already left)."""
        self.state[1] = int(left)
        self.edges[:] = 0
        self.state[0] = session

    def leave(self) -> None:
        """Say this agent's edges go through the broker from now on (its posted letters stay readable)."""
        self.state[1] = 1

    def sleep_on(self, rank: int | None, why: int = FOR_POST) -> None:
        self.state[2] = 0 if rank is None else 2 * (rank + 1) + why

    def post(self, p: int, version: int) -> None:
        self.edges[p, 1] = version
        self.edges[p, 0] += 1

    def mark_read(self, w: int) -> None:
        self.edges[w, 2] += 1

    def close(self) -> None:
        self.bell = self.state = self.edges = None
        try:
            self.map.close()
        except BufferError:  # a view handed out is still alive; the kernel frees it with us
            pass
        os.close(self.fd)


class PeerControl(_View):
    """A neighbour's control segment, mapped read-only after the checks a hostile writer could fail."""

    def __init__(self, pid: int, fd: int, token: str, n: int):
        path = f"/proc/{int(pid)}/fd/{int(fd)}"
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe named here must not block us
        try:
            info = os.fstat(handle)
            if not stat.S_ISREG(info.st_mode):
                raise ControlRefused("the descriptor does not name a control segment")
            try:
                seals = fcntl.fcntl(handle, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0
            if seals & SEALS != SEALS:
                raise ControlRefused("the control segment is not sealed against resizing")
            size = os.fstat(handle).st_size
            if size != size_for(n):
                raise ControlRefused(f"the control segment has {size} bytes, not {size_for(n)} for {n} agents")
            self.map = mmap.mmap(handle, size, prot=mmap.PROT_READ)
        finally:
            os.close(handle)
        got_n, got_pid = (int(v) for v in np.frombuffer(self.map, np.uint64, 2, 24))
        if self.map[:8] != MAGIC or self.map[8:24].hex() != token or got_n != n or got_pid != pid:
            self.map.close()
            raise ControlRefused("the descriptor names a file that is not that agent's control segment")
        self.pid, self.token = pid, token
        super().__init__(self.map, n)

    def close(self) -> None:
        self.bell = self.state = self.edges = None
        try:
            self.map.close()
        except BufferError:
            pass


def wait_for(blocked, deadline: float, own: Control | None = None, why: int = FOR_POST, clock=time.monotonic) -> bool:
    """Wait until ``blocked()`` returns None, or until ``deadline``: then False.

    ``blocked()`` returns the peer (a _View) whose change would let us on, or None when nothing
    blocks. Its doorbell is read before the condition is checked again: a change made after that
    check rings a doorbell that no longer holds the value the futex sleeps on, so it is never missed.
    With ``own``, our segment says whom we sleep on and ``why``, so that peer wakes us when its
    change concerns us (see ``Turns.ring``).
    """
    peer = blocked()
    while peer is not None:
        bell = peer.doorbell()
        again = blocked()
        if again is not peer:  # that one moved on meanwhile: look at whoever blocks now
            peer = again
            continue
        left = deadline - clock()
        if left <= 0:
            return False
        if own is not None:
            own.sleep_on(peer.rank, why)
        futex_wait(peer.bell_address, bell, min(left, 1.0))
        if own is not None:
            own.sleep_on(None)
        peer = blocked()
    return True


POST, WAIT, LEAVE = "post", "wait", "leave"


class Turns:
    """One agent's edges in one session (sync mode): when it may post, what it may read, and
    what is left to drain once it has left. The counts it keeps itself are the true ones; the
    neighbours' are read from their segments and only ever decide whether to wait.

    ``ins`` and ``outs`` map the static in- and out-peers to their control segments (None for one
    that could not be mapped: such an edge never carries a letter in this session).
    """

    def __init__(self, control: Control, rank: int, session: int, ins: dict, outs: dict):
        self.control, self.rank, self.id = control, rank, session
        self.ins, self.outs = ins, outs
        self._watchers = []
        """Our neighbours' segments, each once: whoever may sleep on our doorbell."""
        for p, pc in (*ins.items(), *outs.items()):
            if pc is not None and all(pc is not w for w in self._watchers):
                pc.rank = p
                self._watchers.append(pc)
        self.sent = dict.fromkeys(outs, 0)
        self.read = dict.fromkeys(ins, 0)
        self.gone: set[int] = set()
        """Neighbours the broker said are gone: nobody waits on them any more."""
        self.row: dict[int, float] = {}
        """The weights to mix by while the session holds (its topology is static, nobody is gone)."""
        self.left = False
        self.drained = False
        """Whether, since leaving, every out-peer has read what was posted to it."""

    def enter(self) -> None:
        """Join the session. A neighbour we cannot see must not wait on us, nor we on it, so then we
        join already left: a writer that saw us in the session for a moment would post us a letter
        we could never read, and wait for ever for us to read it (issue 18)."""
        self.left = any(pc is None for pc in (*self.ins.values(), *self.outs.values()))
        self.control.enter(self.id, left=self.left)
        self.ring(None)

    def leave(self) -> None:
        if not self.left:
            self.left = True
            self.control.leave()
            self.ring(None)

    def ring(self, why: int | None) -> None:
        """Bump our doorbell after a change; wake whoever sleeps on it for ``why`` (None: for anything,
        as joining or leaving concerns all). The wake-up syscall is made only when a neighbour says
        it sleeps on us so, which needs a fence between the bump and that look (without one, always)."""
        control = self.control
        control.bell[0] += np.uint32(1)
        fence = _fence()
        if fence is None:
            futex_wake(control.bell_address)
            return
        fence()
        me = 2 * (self.rank + 1)
        if any(
            w.sleeping() in (me + FOR_POST, me + FOR_READ) if why is None else w.sleeping() == me + why
            for w in self._watchers
        ):
            futex_wake(control.bell_address)

    def _joined(self, pc) -> bool:
        return pc is not None and pc.session() == self.id

    def may_post(self):
        """(POST, None), (WAIT, the reader to wait on) or (LEAVE, None): a reader that left reads its
        letters the broker's way from now on, so this writer leaves too rather than post to it. Once
        we left (the broker said the session ended, say) we post nothing and wait for no reader to
        join: one that never heard of the session never will."""
        if self.left:
            return LEAVE, None
        for p, pc in self.outs.items():
            if p in self.gone:
                continue
            if pc is None or (self._joined(pc) and pc.left()):
                return LEAVE, None
            if not self._joined(pc) or pc.read(self.rank) < self.sent[p]:
                return WAIT, pc
        return POST, None

    def post(self, version: int) -> None:
        for p in self.outs:
            if p not in self.gone:
                self.control.post(p, version)
                self.sent[p] += 1
        self.ring(FOR_POST)

    def pending(self, w: int) -> int | None:
        """The version of w's unread letter on our edge, or None."""
        pc = self.ins[w]
        if self._joined(pc) and pc.sent(self.rank) > self.read[w]:
            return pc.version(self.rank)
        return None

    def may_read(self, w: int):
        """For in-peer w: (POST, None) when its letter is there, (WAIT, pc), or (LEAVE, None) when its
        letters come the broker's way (it left with nothing unread, never joined, or is gone)."""
        pc = self.ins[w]
        if w in self.gone or pc is None:
            return LEAVE, None
        if self.pending(w) is not None:
            return POST, None
        if self._joined(pc) and not pc.left():
            return WAIT, pc
        if self.left or self._joined(pc):
            return LEAVE, None
        return WAIT, pc  # in the session, and it has not joined yet

    def mark_read(self, w: int) -> None:
        self.read[w] += 1
        self.control.mark_read(w)

    def undrained(self):
        """An out-peer that has not yet read every letter posted to it (or None): a writer that left
        sends its next letter through the broker only after that, so no edge ever holds two."""
        for p, pc in self.outs.items():
            if p not in self.gone and self._joined(pc) and pc.read(self.rank) < self.sent[p]:
                return pc
        return None

    def close(self) -> None:
        for pc in (*self.ins.values(), *self.outs.values()):
            if pc is not None:
                pc.close()
