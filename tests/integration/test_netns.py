"""A real multi-host run: broker and agents on three network hosts, talking tcp over veth links.

The hosts are Linux network namespaces made here (root and iproute2 needed; skipped with the
reason otherwise): ``broker`` is linked to ``agents-a`` (ranks 0, 1) and ``agents-b`` (rank 2),
each link shaped to 1 Gbit/s with tc, as the PALA paper's cluster. The broker binds a
non-loopback address, so it runs with CURVE keys. Mid-run, rank 2's process is killed -9 and
restarted with --resume; every agent must finish its budget.
"""

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from experiments.layout import namespaces
from gossiprl.bench import scale as bench_scale
from helpers import wait_for

PORT = 5555
LINKS = {"a": ("10.231.1.1", "10.231.1.2"), "b": ("10.231.2.1", "10.231.2.2")}
"""Per agent host: (broker's address on the link, the agent host's address). Private addresses
that exist only inside the namespaces this test makes."""


@pytest.fixture
def hosts():
    reason = bench_scale.unavailable("the netns test")
    if reason:
        pytest.skip(reason)
    with namespaces(LINKS, prefix="gr") as names:
        yield names


def _in(ns, *args, **kw):
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "gossiprl.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


@pytest.mark.timeout(240)
def test_cartpole_swarm_across_three_hosts_survives_a_killed_agent(hosts, tmp_path):
    keys = tmp_path / "keys"
    made = subprocess.run(
        [sys.executable, "-m", "gossiprl.cli", "keys", "generate", str(keys), "--name", "broker", "--name", "agent"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(keys / "agent.key", allowed / "agent.key")
    broker = _in(
        hosts["broker"],
        "broker",
        "--bind",
        f"tcp://0.0.0.0:{PORT}",
        "--agents",
        "3",
        "--peer-timeout",
        "3",
        "--stats-every",
        "1",
        "--stats-json",
        "--curve-secret",
        str(keys / "broker.key_secret"),
        "--curve-allow",
        str(allowed),
    )
    host_of = {0: "a", 1: "a", 2: "b"}

    def agent(rank, resume=False):
        host = host_of[rank]
        return _in(
            hosts[host],
            "agent",
            "--connect",
            f"tcp://{LINKS[host][0]}:{PORT}",
            "--rank",
            str(rank),
            "--total-frames",
            "60000",
            "--run-dir",
            str(tmp_path / "run"),
            "--log-every",
            "20",
            "--checkpoint-every",
            "50",
            "--torch-threads",
            "1",
            "--curve-secret",
            str(keys / "agent.key_secret"),
            "--curve-broker",
            str(keys / "broker.key"),
            *(["--resume"] if resume else []),
        )

    started = time.monotonic()
    try:
        agents = {rank: agent(rank) for rank in range(3)}
        checkpoint = tmp_path / "run" / "agent-2" / "checkpoint.pt"
        wait_for(
            checkpoint.exists,
            120 - (time.monotonic() - started),
            lambda: f"rank 2 wrote no checkpoint; exited: {[r for r, p in agents.items() if p.poll() is not None]}",
            process=list(agents.values()),
        )
        agents[2].send_signal(signal.SIGKILL)
        agents[2].wait()
        killed_at = time.monotonic()
        agents[2] = agent(2, resume=True)
        outputs = {rank: p.communicate(timeout=150)[0] for rank, p in agents.items()}
        for rank, out in outputs.items():
            assert agents[rank].returncode == 0, f"rank {rank}:\n{out[-3000:]}"
            assert json.loads(out.strip().splitlines()[-1])["frames"] >= 60000
    finally:
        broker.send_signal(signal.SIGTERM)
        broker_out = broker.communicate(timeout=30)[0]
        for p in locals().get("agents", {}).values():
            if p.poll() is None:
                p.kill()
    stats = [json.loads(line) for line in broker_out.splitlines() if line.startswith("{")]
    assert stats, broker_out[-3000:]
    assert stats[-1]["agents"]["2"]["registrations"] >= 2, "the restarted agent never rejoined"
    print(
        f"netns run: {time.monotonic() - started:.1f}s in all, rank 2 restarted "
        f"{time.monotonic() - killed_at:.1f}s before the end; "
        f"broker errors {stats[-1]['errors']}, events {stats[-1]['events']}"
    )
