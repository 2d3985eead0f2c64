"""PALA's turn locks as a state machine: no sockets, no clock, no knowledge of what a letter holds.

Every directed edge j -> i of the topology is a one-slot mailbox. In sync mode (PALA's
Algorithm 2) a PUBLISH from j is written into the slot j -> i only once i has consumed
the previous letter (the writer waits), and a COLLECT from i is answered only once every
in-peer's slot is full (the reader waits). Waiting costs nothing: a request that cannot
proceed is parked, and is re-examined only when a slot it waits on changes. In async mode
(GALA-style) a PUBLISH skips full slots and a COLLECT returns what is there, unless an
edge has been empty ``max_staleness`` collects in a row.

The broker feeds events in (publish, collect, gone, rejoin, each with the time it happened)
and sends the :class:`Reply` records that come back. A letter's ``header`` and ``payload``
are carried, never read: they may be tensor frames, or a descriptor of bytes kept elsewhere.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MODES = ("sync", "async")
ACK, DELIVER = "ACK", "DELIVER"

BYPASS_CACHE = 32
BYPASS_CACHE_BYTES = 256 << 20
"""How many ``Topology.without(gone)`` results are kept (at most BYPASS_CACHE, and at most this many
bytes of dense matrices): agents coming and going must not grow memory."""


@dataclass
class Reply:
    """What to send, to which rank: a command, its header fields, and payload frames (opaque)."""

    rank: int
    cmd: str
    fields: dict
    payload: list = field(default_factory=list)


@dataclass
class Letter:
    """One published parameter set sitting in mailboxes (shared by all of its sender's out-edges).

    ``header`` goes into the reader's DELIVER entry as it is (e.g. the tensor schema), and
    ``payload`` is appended to its frames: the locks never look inside either."""

    sender: int
    round: int
    header: dict
    payload: list
    nbytes: int
    written_to: set[int] = field(default_factory=set)
    """Readers whose slot this letter was put in: after a rewiring, a new reader that missed it gets it."""


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
    skip: frozenset = frozenset()
    """A COLLECT's in-peers whose letter the reader already has (a session's turn): not waited on."""


@dataclass
class Rank:
    """One rank's side of the locks: its parked requests, latest letter, and wait counters."""

    rank: int
    round: int = 0
    publish: Parked | None = None
    collect: Parked | None = None
    last_letter: Letter | None = None
    collected: int | None = None
    """The round of its last COLLECT answered: a letter of that round or older is one it has mixed past."""
    stale: dict[int, int] = field(default_factory=dict)
    publishes: int = 0
    collects: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    publish_wait_s: float = 0.0
    collect_wait_s: float = 0.0
    waited_on: dict[int, float] = field(default_factory=dict)


class TurnLocks:
    """Mailboxes and parked requests of one swarm; every event returns the replies it releases."""

    def __init__(
        self,
        topology,
        mode: str = "sync",
        max_staleness: int | None = None,
        open_letter: Callable[[Letter, int], tuple[dict, list, int]] | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if max_staleness is not None and (type(max_staleness) is not int or max_staleness < 1):
            raise ValueError(f"max_staleness must be an int >= 1 or None, got {max_staleness!r}")
        self.topology = topology
        self.mode = mode
        self.max_staleness = max_staleness
        self.ranks = [Rank(r) for r in range(topology.n)]
        self.gone_ranks: set[int] = set()
        """Ranks that left, expired or were declared dead: the survivors are rewired around them
        until they come back. A rank that never registered is not gone: it is waited for."""
        self.mailbox: dict[tuple[int, int], Letter] = {}
        self.events: dict[str, int] = {}
        self._bypassed: OrderedDict[frozenset, Any] = OrderedDict()
        self._cache_size = max(2, min(BYPASS_CACHE, BYPASS_CACHE_BYTES // (8 * topology.n**2 * topology.period)))
        self._rewire_pending = False
        self._out: list[Reply] = []
        self._open = open_letter or _as_is
        """What a reader is handed of a letter: (DELIVER entry fields, payload frames, bytes). The
        letter as it is, unless the owner decides per edge (the broker's data planes, for one)."""

    # ------------------------------------------------------------ events

    def publish(
        self, rank: int, seq: int, round: int, header: dict, payload: list, nbytes: int, now: float
    ) -> list[Reply]:
        """Rank's letter for ``round``: written into every out-slot its turn allows, ACKed once all are."""
        me = self.ranks[rank]
        letter = Letter(rank, round, header, payload, nbytes)
        me.last_letter = letter
        me.round = round
        me.publishes += 1
        me.bytes_in += nbytes
        me.publish = Parked(seq, round, now, self._out_peers(rank, round), letter)
        self._settle(now, ("publish", me))
        return self._sent()

    def collect(self, rank: int, seq: int, round: int, now: float, skip=()) -> list[Reply]:
        """Rank asks for its in-peers' letters of ``round``: DELIVERed once its turn has come.
        ``skip``: in-peers whose letter of this round it took by a session's turn (dataplane, shmlocks);
        a rank named there that is no in-peer of ``rank`` is left out, so it cannot keep a gone agent
        in the row."""
        me = self.ranks[rank]
        skip = frozenset(skip) & set(self.topology.in_peers(rank, round))
        me.collect = Parked(seq, round, now, self._in_peers(rank, round, skip) - skip, skip=skip)
        self._settle(now, ("collect", me))
        return self._sent()

    def cancel(self, rank: int) -> list[Parked]:
        """Forget rank's parked requests (its connection was replaced); returns them, so their
        sender can be told they will never be answered."""
        me = self.ranks[rank]
        dropped = [p for p in (me.publish, me.collect) if p is not None]
        me.publish = me.collect = None
        return dropped

    def gone(self, rank: int, now: float) -> list[Reply]:
        """Rank is dead or left: rewire the survivors around it. Its unread letters stay readable."""
        self.cancel(rank)
        if rank in self.gone_ranks:
            return []
        self.gone_ranks.add(rank)
        self._rewire(now)
        return self._sent()

    def rejoin(self, rank: int, now: float) -> list[Reply]:
        """Rank registered (again): a fresh process, so its parked requests are void; a gone rank is
        wired back in, and its last letter (the dead process's parameters) forgotten."""
        self.cancel(rank)
        if rank not in self.gone_ranks:
            return []
        self.ranks[rank].last_letter = self.ranks[rank].collected = None
        self.gone_ranks.discard(rank)
        self._rewire(now)
        return self._sent()

    def drop_letters(self) -> None:
        """Forget every letter: the swarm emptied, and what its last agents wrote must not reach
        (or, in another tensor schema, poison) the agents of the next one."""
        for _ in self.mailbox:
            self._note("letters-dropped-by-rewiring")
        self.mailbox.clear()
        for me in self.ranks:
            me.last_letter = None

    # ------------------------------------------------------------ the topology in force

    def row(self, i: int, taken: frozenset = frozenset()):
        """The topology agent i mixes by now: the swarm's, with the gone agents bypassed.

        A gone agent's last letter still counts: while it waits unread in slot (d, i), d stays
        in i's row, so a swarm whose agents finish one by one mixes exactly as the matrix says
        to the last round. Only once i has read it is d bypassed in i's row. ``taken``: the
        in-peers whose letter of the round i collects it took by a session's turn (shmlocks);
        such a letter counts as one still in its slot, for that collect.
        """
        if not self.gone_ranks:
            return self.topology
        gone = frozenset(d for d in self.gone_ranks if (d, i) not in self.mailbox and d not in taken)
        if not gone:
            return self.topology
        hit = self._bypassed.get(gone)
        if hit is None:
            hit = self._bypassed[gone] = self.topology.without(gone)
            if len(self._bypassed) > self._cache_size:
                self._bypassed.popitem(last=False)
        else:
            self._bypassed.move_to_end(gone)
        return hit

    def reads_from(self, i: int, j: int) -> bool:
        """Whether agent i reads j's letters in some round of the topology's period, as wired now."""
        return any(j in self._in_peers(i, r) for r in range(self.topology.period))

    def _in_peers(self, i: int, round: int, taken: frozenset = frozenset()) -> set[int]:
        return set(self.row(i, taken).in_peers(i, round))

    def _out_peers(self, j: int, round: int) -> set[int]:
        """Who reads j's letter of ``round`` now. Bypassing a gone d only wires d's in-peers to d's
        out-peers, so the readers are among j's out-peers and, through gone agents, theirs: only
        those rows are looked at (O(degree), not O(n), rows per call)."""
        out = set(self.topology.out_peers(j, round))
        if not self.gone_ranks:
            return out
        candidates, todo = set(out), [d for d in out if d in self.gone_ranks]
        while todo:
            for i in self.topology.out_peers(todo.pop(), round):
                if i not in candidates:
                    candidates.add(i)
                    if i in self.gone_ranks:
                        todo.append(i)
        return {i for i in candidates if i != j and j in self._in_peers(i, round)}

    def _note(self, event: str) -> None:
        self.events[event] = self.events.get(event, 0) + 1

    def _sent(self) -> list[Reply]:
        """The replies released since the last event (settling may cascade through a rewiring)."""
        out, self._out = self._out, []
        return out

    def _rewire(self, now: float) -> None:
        """Re-judge every slot and parked request after an agent left or came back.

        Letters in slots that are no longer edges (to a gone agent, or a bypass edge made
        obsolete by a return) are dropped: no one would ever read them, and a writer must
        not wait on them. Parked requests get their peer sets recomputed, so a COLLECT that
        waited on a dead in-peer now waits on the in-peers that replace it.
        """
        period = self.topology.period
        stale = [(j, i) for (j, i) in self.mailbox if not any(j in self._in_peers(i, r) for r in range(period))]
        for key in stale:
            del self.mailbox[key]
            self._note("letters-dropped-by-rewiring")
        work = []
        for me in self.ranks:
            # A letter sent while a reader's row was changing may have found no reader at all
            # (its new reader was still finishing a gone agent's last letter). Its sender now
            # waits on that reader while the reader waits on it: give each new reader the
            # sender's latest letter, so no rewiring can deadlock a cycle of agents. Not to a
            # reader that already collected the letter's round: it would mix it a round late,
            # and its slot, full, would hold up the sender's next letter; two agents that both
            # wait for their PUBLISH's ACK before they COLLECT would wait on each other for good.
            letter = me.last_letter
            if (
                letter is not None
                and me.rank not in self.gone_ranks
                and (me.publish is None or me.publish.letter is not letter)
            ):
                for reader in self._out_peers(me.rank, letter.round) - letter.written_to:
                    collected = self.ranks[reader].collected
                    if (me.rank, reader) not in self.mailbox and (collected is None or collected < letter.round):
                        self.mailbox[(me.rank, reader)] = letter
                        letter.written_to.add(reader)
            if me.publish is not None:
                me.publish.waiting_on = self._out_peers(me.rank, me.publish.round) - set(me.publish.written)
                work.append(("publish", me))
            if me.collect is not None:
                me.collect.waiting_on = self._in_peers(me.rank, me.collect.round, me.collect.skip) - me.collect.skip
                work.append(("collect", me))
        self._settle(now, *work)

    # ------------------------------------------------------------ the locks

    def _settle(self, now: float, *first: tuple[str, Rank]) -> None:
        """Re-examine parked requests until nothing more can move; replies go to ``_out``.

        Answering one request changes slots another may wait on (a COLLECT empties slots
        that writers wait for; a PUBLISH fills slots that readers wait for), so the
        requests touched are queued here rather than advanced recursively.
        """
        work = deque(first)
        while work:
            kind, me = work.popleft()
            if kind == "publish" and me.publish is not None:
                work.extend(("collect", r) for r in self._advance_publish(me, now))
            elif kind == "collect" and me.collect is not None:
                work.extend(("publish", w) for w in self._advance_collect(me, now))
        if self._rewire_pending:
            self._rewire_pending = False
            self._rewire(now)

    def _advance_publish(self, me: Rank, now: float) -> list[Rank]:
        """Write the parked letter into every out-edge whose slot is empty; ACK once none is left.

        Sync: a full slot means the receiver has not read the previous letter, so wait.
        Async: a full slot is skipped (the receiver will read the older letter).
        Returns the readers whose slots were filled.
        """
        parked, touched = me.publish, []
        for dst in sorted(parked.waiting_on):
            if (me.rank, dst) in self.mailbox:
                if self.mode == "async":
                    parked.skipped.append(dst)
                    parked.waiting_on.discard(dst)
                continue
            self.mailbox[(me.rank, dst)] = parked.letter
            parked.letter.written_to.add(dst)
            parked.written.append(dst)
            parked.waiting_on.discard(dst)
            me.waited_on[dst] = me.waited_on.get(dst, 0.0) + now - parked.since
            touched.append(self.ranks[dst])
        if not parked.waiting_on:
            me.publish = None
            me.publish_wait_s += now - parked.since
            self._out.append(
                Reply(
                    me.rank,
                    ACK,
                    {"seq": parked.seq, "round": parked.round, "written": parked.written, "skipped": parked.skipped},
                )
            )
        return touched

    def _advance_collect(self, me: Rank, now: float) -> list[Rank]:
        """Answer the parked COLLECT when its turn has come, emptying the slots it reads.

        Sync: every in-peer's slot must be full. Async: answer with whatever is there, except
        that an in-edge empty for ``max_staleness`` collects in a row must be waited for.
        Returns the writers whose slots were emptied.
        """
        parked = me.collect
        full = {j for j in parked.waiting_on if (j, me.rank) in self.mailbox}
        if self.mode == "sync" and full != parked.waiting_on:
            return []
        if (
            self.mode == "async"
            and self.max_staleness is not None
            and any(me.stale.get(j, 0) + 1 >= self.max_staleness for j in parked.waiting_on - full)
        ):
            return []
        weights = [[j, w] for j, w in self.row(me.rank, parked.skip).weights(me.rank, parked.round).items()]
        entries, payload, released = [], [], []
        for j in sorted(parked.waiting_on):
            letter = self.mailbox.pop((j, me.rank), None)
            if letter is None:
                me.stale[j] = me.stale.get(j, 0) + 1
                continue
            me.stale[j] = 0
            me.waited_on[j] = me.waited_on.get(j, 0.0) + now - parked.since
            fields, frames, nbytes = self._open(letter, me.rank)
            entries.append({"rank": j, "round": letter.round, **fields})
            payload.extend(frames)
            me.bytes_out += nbytes
            released.append(self.ranks[j])
            self._rewire_pending |= j in self.gone_ranks  # a gone agent's last letter read: bypass it now
        released.extend(self._drop_bypass_letters(me, parked))
        me.collect = None
        me.collected = parked.round
        me.collects += 1
        me.collect_wait_s += now - parked.since
        self._out.append(
            Reply(
                me.rank,
                DELIVER,
                {"seq": parked.seq, "round": parked.round, "messages": entries, "weights": weights},
                payload,
            )
        )
        return released

    def _drop_bypass_letters(self, me: Rank, parked: Parked) -> list[Rank]:
        """A sync COLLECT that kept a gone in-peer d in the row (d's letter was ``taken``) mixed d's
        letter for this round; a writer already wired to the reader around d may have put its
        letter of this round or an older one in the reader's slot. Read next round, it would keep
        that edge a round behind for as long as both run: it is dropped. Returns those writers."""
        if self.mode != "sync" or not parked.skip & self.gone_ranks:
            return []
        i, r = me.rank, parked.round
        around = set(self.row(i).in_peers(i, r)) - set(self.row(i, parked.skip).in_peers(i, r))
        released = []
        for j in sorted(around):
            letter = self.mailbox.get((j, i))
            if letter is not None and letter.round <= r:
                del self.mailbox[(j, i)]
                self._note("letters-dropped-by-rewiring")
                released.append(self.ranks[j])
        return released


def _as_is(letter: Letter, reader: int) -> tuple[dict, list, int]:
    return letter.header, letter.payload, letter.nbytes
