"""The broker's end of the data plane on its own: what a reader is handed, and which edges are relayed."""

from types import SimpleNamespace

import pytest

import topologies
from gossiprl.comms import wire
from gossiprl.comms.dataplane import BrokerPlane
from gossiprl.comms.turnlocks import Letter, TurnLocks

REF = {"host": "h", "seq": 1}


def test_only_edges_the_reader_reads_are_relayed_and_each_is_counted_once():
    plane = BrokerPlane("direct")
    reads = {1: True, 2: False}.get  # the reader reads rank 1, not rank 2
    locks = SimpleNamespace(reads_from=lambda i, j: i == 0 and bool(reads(j)))
    assert plane.unreachable(0, [1, 2, 0, 9], locks) == 1
    assert plane.unreachable(0, [1], locks) == 0
    assert plane.relay_edges == {(1, 0)}
    assert plane.events == {"data-plane-fallbacks": 1, "relay-requests-ignored": 3}


def test_a_reader_gets_the_bytes_only_on_a_relayed_edge():
    plane = BrokerPlane("auto")
    plane.relay_edges.add((1, 0))
    with_bytes = Letter(sender=1, round=0, header={"ref": REF}, payload=[b"xy"], nbytes=2)
    assert plane.open_letter(with_bytes, 0) == ({"ref": REF, "relayed": True}, [b"xy"], 2)
    assert plane.open_letter(with_bytes, 2) == ({"ref": REF, "relayed": False}, [], 0)
    inline = Letter(sender=1, round=0, header={"tensors": []}, payload=[b"xy"], nbytes=2)
    assert plane.open_letter(inline, 2) == ({"tensors": []}, [b"xy"], 2), "a letter without a reference goes whole"


def test_a_writer_is_told_to_relay_only_to_registered_readers_of_its_reference():
    locks = TurnLocks(topologies.make("full", 3))
    plane = BrokerPlane("direct")
    plane.relay_edges |= {(0, 1), (0, 2)}
    assert plane.relays(0, locks, lambda i: True) == [], "no letter yet"
    locks.publish(0, 1, 0, {"ref": REF}, [], 0, now=0.0)
    assert plane.relays(0, locks, lambda i: True) == [1, 2]
    assert plane.relays(0, locks, lambda i: i != 2) == [1]
    locks.gone(1, now=1.0)
    assert plane.relays(0, locks, lambda i: True) == [2], "a reader rewired away is not relayed to"


def test_welcome_names_the_plane_and_the_fetch_token_only_where_they_apply():
    assert BrokerPlane("broker").welcome() == {}
    assert BrokerPlane("shm").welcome() == {"data_plane": "shm"}
    direct = BrokerPlane("direct")
    assert direct.welcome() == {"data_plane": "direct", "fetch_token": direct.fetch_token}
    assert len(direct.fetch_token) == 32 and direct.fetch_token != BrokerPlane("direct").fetch_token


def _ctl_ref(rank):
    return {"host": "h", "pid": 10 + rank, "ctl_fd": 5, "ctl_token": f"t{rank}"}


def _swarm(topology, mode="sync"):
    return SimpleNamespace(
        locks=TurnLocks(topology, mode), mode=mode, registry=SimpleNamespace(registered=lambda r: True)
    )


def test_a_session_is_granted_once_every_rank_published_and_ends_when_one_leaves_it():
    swarm = _swarm(topologies.make("ring", 3))
    plane, locks = BrokerPlane("shm"), swarm.locks
    for r in range(3):
        assert plane.session == 0, "granted before every rank published"
        plane.published(r, {"ref": _ctl_ref(r)}, 0, swarm)
        locks.publish(r, 1, 0, {"ref": _ctl_ref(r)}, [], 0, now=0.0)
    assert plane.session != 0 and plane.session_round == 2
    grant = {"id": plane.session, "round": 2, "readers": [[1, 11, 5, "t1"]]}
    assert plane.grant(0, locks.topology) == {"session": grant}
    plane.published(0, {"ref": _ctl_ref(0)}, 1, swarm)
    assert plane.session != 0, "a round before the session is still the broker's"
    plane.published(1, {"ref": _ctl_ref(1)}, 2, swarm)
    assert plane.session == 0 and plane.events == {"sessions": 1, "sessions-ended": 1}, "rank 1 left the session"
    assert locks.ranks[0].last_letter is None, "a letter from before the session would reach a rewired reader"
    assert plane.grant(0, locks.topology) == {}


def test_a_newly_relayed_edge_ends_the_session_and_a_known_one_does_not():
    swarm = _swarm(topologies.make("ring", 3))
    plane, locks = BrokerPlane("shm"), swarm.locks
    reader = next(i for i in range(3) if locks.reads_from(i, 0))
    plane.relay_edges.add((0, reader))
    plane.session, plane.session_round = 7, 2
    plane.unreachable(reader, [0], locks)
    assert plane.session == 7, "an edge already relayed changes nothing"
    writer = next(j for j in range(3) if j != reader and not locks.reads_from(reader, j))
    plane.unreachable(reader, [writer], locks)
    assert plane.session == 7, "a writer the reader does not read is not relayed"
    plane.relay_edges.clear()
    plane.unreachable(reader, [0], locks)
    assert plane.session == 0 and plane.events["sessions-ended"] == 1


def test_reply_fields_name_the_relay_readers_in_an_ack_and_the_session_in_every_reply():
    locks = TurnLocks(topologies.make("full", 3))
    plane = BrokerPlane("direct")
    plane.relay_edges |= {(0, 1), (0, 2)}
    locks.publish(0, 1, 0, {"ref": REF}, [], 0, now=0.0)
    assert plane.reply_fields(0, wire.ACK, locks, lambda i: True) == {"relay": [1, 2]}
    assert plane.reply_fields(0, wire.DELIVER, locks, lambda i: True) == {}
    assert plane.reply_fields(1, wire.ACK, locks, lambda i: True) == {}, "rank 1 has no letter: nothing to relay"


@pytest.mark.parametrize(
    "plane,topology,mode",
    [
        ("shm", topologies.make("ring", 2), "async"),
        ("shm", topologies.make("sparse", 4, time_varying=True), "sync"),
        ("auto", topologies.make("ring", 2), "sync"),
    ],
)
def test_no_session_without_sync_a_static_topology_and_the_shm_plane(plane, topology, mode):
    swarm = _swarm(topology, mode)
    broker_plane = BrokerPlane(plane)
    for r in range(topology.n):
        broker_plane.published(r, {"ref": _ctl_ref(r)}, 0, swarm)
    assert broker_plane.session == 0
