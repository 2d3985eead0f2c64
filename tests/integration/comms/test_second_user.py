"""Issue 19's attacks by another local user: a process that really runs as ``nobody``, not as us.

The round-3 review attacked as root and as an unprivileged second user of the same host. Here
the attacker is a subprocess that imports what it needs while still root, then drops to
``nobody`` (setgroups, setgid, setuid) before it does anything to the swarm, so the kernel's
checks (on /proc/<pid>/fd, on a 0700 directory, on key files) are the ones a real stranger meets.
Only root can start such a process: elsewhere the tests skip, saying so.
"""

import json
import os
import pwd
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

import topologies
from gossiprl import Broker, GossipClient
from gossiprl.launch import private_endpoint
from helpers import wait_for


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or _nobody() is None,
    reason="a second local user needs root (to setuid to 'nobody') and a 'nobody' account",
)

FAST = {"heartbeat": 0.5, "liveness": 20}  # a loaded host must not look like a dead broker
RING2 = topologies.make("ring", 2)

BECOME_NOBODY = """
import errno, json, os, pwd, sys
import msgpack, numpy as np, zmq
from gossiprl import BrokerUnavailable, GossipClient
from gossiprl.comms import dataplane, wire

def attempt(f):
    try:
        f()
        return "done"
    except OSError as err:
        return errno.errorcode.get(err.errno, type(err).__name__)
    except BrokerUnavailable:
        return "BrokerUnavailable"

user = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(user.pw_gid)
os.setuid(user.pw_uid)
"""
"""The prelude of every stranger: everything imported as root (our interpreter lives under a 0700
home), then root dropped for good. ``attempt`` names how an action failed (an errno) or "done"."""


def _stranger(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", BECOME_NOBODY + script, *map(str, args)],
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _report(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, f"process {proc.args[:3]} said nothing: {proc.stderr.read() if proc.stderr else ''}"
    return json.loads(line)


def _finish(proc: subprocess.Popen, text: str = "") -> str:
    try:
        out, err = proc.communicate(text, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"the stranger failed (exit {proc.returncode}): {err}"
    return out


def _exchange_all(clients, tensors):
    got = {}
    threads = [threading.Thread(target=lambda r=r: got.update({r: clients[r].exchange(tensors[r])})) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 2, "an exchange hung"
    return got


# ------------------------------------------------ A1: shrinking a memfd, as another user

HOSTILE_WRITER = """
dataplane.SEALS = 0  # this writer seals nothing
c = GossipClient(sys.argv[1], 0, timeout=60, heartbeat=0.5, liveness=20)
print(json.dumps({"registered": True}), flush=True)
sys.stdin.readline()
c.exchange({"x": np.ones(1 << 16, np.float32)})
print(json.dumps({"uid": os.getuid(), "counts": c.plane_counts}), flush=True)
pid, fd = map(int, sys.stdin.readline().split())
honest = attempt(lambda: os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)))
os.ftruncate(c._plane.segment.fd, dataplane.HEADER_BYTES)
print(json.dumps({"open_honest_segment": honest}), flush=True)
sys.stdin.readline()
c.close()
"""

READER = """
import json, os, sys, numpy as np
from gossiprl import GossipClient
c = GossipClient(sys.argv[1], 1, timeout=60, heartbeat=0.5, liveness=20)
print(json.dumps({"registered": True}), flush=True)
sys.stdin.readline()
letters = c.exchange({"x": np.zeros(1 << 16, np.float32)})
print(json.dumps({"pid": os.getpid(), "fd": c._plane.segment.fd}), flush=True)
sys.stdin.readline()  # the stranger has shrunk its segment now
total = sum(float(v["x"].sum()) for v in letters.values())
print(json.dumps({"ranks": sorted(letters), "total": total, "counts": c.plane_counts}), flush=True)
c.close()
"""


@pytest.mark.timeout(300)
def test_another_user_who_shrinks_its_segment_cannot_kill_a_reader_nor_touch_the_reader_s():
    """A1: a local user who joined a keyless loopback broker announced a memfd and shrank it: every
    reader died of SIGBUS. Even with the broker open to it (--insecure), the reader now refuses the
    unsealed segment, and the stranger can neither map nor open the honest reader's segment."""
    with Broker(RING2, "tcp://127.0.0.1:0", data_plane="shm", insecure=True).start() as broker:
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, broker.address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stranger = _stranger(HOSTILE_WRITER, broker.address)
        try:
            assert _report(stranger)["registered"] and _report(reader)["registered"]
            for proc in (stranger, reader):  # both registered: start the round together
                proc.stdin.write("go\n")
                proc.stdin.flush()
            hello = _report(stranger)
            segment = _report(reader)
            stranger.stdin.write(f"{segment['pid']} {segment['fd']}\n")
            stranger.stdin.flush()
            tried = _report(stranger)
            out, _ = reader.communicate("go\n", timeout=120)
            _finish(stranger, "bye\n")
        finally:
            for proc in (reader, stranger):
                if proc.poll() is None:
                    proc.kill()
    assert hello["uid"] == _nobody().pw_uid
    assert hello["counts"]["shm"] == 0 and hello["counts"]["unreachable"] == 1, hello  # our segment: out of reach
    assert tried["open_honest_segment"] in ("EACCES", "EPERM"), tried
    assert reader.returncode == 0, f"the reader died (exit {reader.returncode})"
    report = json.loads(out.splitlines()[-1])
    assert report["ranks"] == [] and report["counts"]["shm"] == 0 and report["counts"]["unreachable"] == 1, report


# ------------------------------------------------ B6 / C9: joining, taking over and fetching, as another user

STRANGER_AT_THE_SWARM = """
address, endpoint, token_len, key_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
out = {"uid": os.getuid()}
out["takeover"] = attempt(lambda: GossipClient(address, 0, takeover=True, timeout=2, heartbeat=0.1, liveness=5))
out["read_keys"] = attempt(lambda: os.listdir(key_dir))
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(endpoint)
for seq, fields in enumerate(({}, {"token": "0" * token_len})):
    header = {"v": 1, "cmd": "FETCH", "seq": seq, "slot": 0, "version": 2, "latest": True, **fields}
    sock.send(msgpack.packb(header, use_bin_type=True))
out["fetch_answers"] = int(sock.poll(1500))
print(json.dumps(out), flush=True)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_another_user_can_neither_take_over_a_rank_nor_fetch_the_swarm_s_parameters(transport):
    """B6: an unprivileged user took over a rank of a keyless loopback tcp broker and got 1e30 mixed
    in; C9: another user fetched the swarm's parameters from a direct letter server. A swarm set up
    as `gossiprl run` sets it up (ipc in a 0700 directory, or tcp with throwaway CURVE keys kept
    there) admits no stranger, and its letter servers answer no FETCH without the swarm's token."""
    with tempfile.TemporaryDirectory() as tmp:
        bind, broker_curve, agent_curve = private_endpoint(Path(tmp), transport)
        with Broker(RING2, bind, data_plane="direct", curve=broker_curve).start() as broker:
            clients = [GossipClient(broker.address, r, timeout=20, curve=agent_curve, **FAST) for r in (0, 1)]
            try:
                _exchange_all(clients, [{"x": np.full(8, 3.0, np.float32)}, {"x": np.zeros(8, np.float32)}])
                server = clients[0]._plane.server
                refused = server.refused
                stranger = _stranger(STRANGER_AT_THE_SWARM, broker.address, server.endpoint, len(server.tokens[0]), tmp)
                seen = _report(stranger)
                _finish(stranger)
                # Keyless (ipc), the server reads both FETCHes and refuses them for want of the token;
                # with keys (tcp), the letter server is a CURVE server too and the handshake fails first.
                expected = refused + 2 if agent_curve is None else refused
                wait_for(lambda: server.refused >= expected, 30, "the stranger's fetches were not refused", every=0.05)
                got = _exchange_all(clients, [{"x": np.full(8, 5.0, np.float32)}, {"x": np.ones(8, np.float32)}])
                stats = broker.stats()
            finally:
                for c in clients:
                    c.close()
    assert seen["uid"] == _nobody().pw_uid
    assert seen["takeover"] == "BrokerUnavailable", seen  # never registered, let alone took rank 0
    assert seen["read_keys"] in ("EACCES", "EPERM"), seen
    assert seen["fetch_answers"] == 0 and server.refused == expected, seen
    assert all(a["registrations"] == 1 for a in stats["agents"].values()), stats["agents"]
    np.testing.assert_array_equal(got[1][0]["x"], np.full(8, 5.0, np.float32))  # rank 0's own letter, nothing else
