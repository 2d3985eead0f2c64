"""Watching a real broker: its stats server (Prometheus /metrics, JSON /stats) and `gossiprl top --once`."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from gossiprl import GossipClient
from helpers import free_port, invoke, wait_for

pytest.importorskip("prometheus_client", reason="the monitor extra (prometheus-client) is not installed")
pytest.importorskip("rich", reason="the monitor extra (rich) is not installed")


@pytest.fixture(scope="module")
def swarm():
    """`gossiprl broker --metrics-port` in its own process, with two agents gossiping through it until the
    module's last test ends: the tests only read its stats, so one broker serves them all."""
    port, metrics = free_port(), free_port()
    broker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gossiprl.cli import main; main()",
            "broker",
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "--agents",
            "2",
            "--stats-every",
            "0",
            "--metrics-port",
            str(metrics),
            "--insecure",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stop, errors = threading.Event(), []

    def agent(rank):
        try:
            with GossipClient(f"tcp://127.0.0.1:{port}", rank, n=2) as client:
                while not stop.is_set():
                    client.exchange({"x": np.full(1000, float(rank), np.float32)})
                    time.sleep(0.02)  # a steady stream of rounds for the stats to count, not a busy loop
        except Exception as err:  # noqa: BLE001 (reported by the test)
            errors.append(err)

    try:
        banner = ""
        while "stats on" not in banner:
            line = broker.stdout.readline()
            assert line, f"broker exited: {banner}"
            banner += line
        agents = [threading.Thread(target=agent, args=(r,)) for r in range(2)]
        for t in agents:
            t.start()
        yield f"127.0.0.1:{metrics}", banner
        stop.set()
        for t in agents:
            t.join(30)
        assert not errors, errors
    finally:
        broker.terminate()
        broker.wait(30)


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, "", ""


def test_prometheus_endpoint_serves_each_agents_counters_on_loopback(swarm):
    from prometheus_client.parser import text_string_to_metric_families

    address, banner = swarm
    assert f"http://{address}/metrics" in banner and f"gossiprl top http://{address}" in banner
    wait_for(  # a loaded machine may take a while to run the first rounds
        lambda: min(a["round"] for a in json.loads(get(f"http://{address}/stats")[2])["agents"].values()) > 3,
        60,
        "the agents did not gossip",
    )
    status, kind, body = get(f"http://{address}/metrics")
    assert status == 200 and kind.startswith("text/plain")
    samples = {
        (s.name, s.labels.get("rank")): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    for rank in ("0", "1"):
        assert samples[("gossiprl_agent_round", rank)] > 3
        assert samples[("gossiprl_agent_bytes_in", rank)] >= 4000 * samples[("gossiprl_agent_round", rank)] - 4000
        assert samples[("gossiprl_agent_registrations", rank)] == 1
        assert samples[("gossiprl_agent_gone", rank)] == 0
    assert samples[("gossiprl_broker_uptime_seconds", None)] > 0
    assert get(f"http://{address}/anything-else")[0] == 404


def test_stats_are_snapshotted_at_most_twice_a_second_however_often_asked(swarm):
    address, _ = swarm
    first = json.loads(get(f"http://{address}/stats")[2])
    again = json.loads(get(f"http://{address}/stats")[2])
    assert first == again and first["n"] == 2 and set(first["agents"]) == {"0", "1"}
    time.sleep(0.6)  # past MIN_SNAPSHOT_S: a snapshot that old must be renewed, which is the point
    assert json.loads(get(f"http://{address}/stats")[2])["uptime_s"] > first["uptime_s"]


def test_top_once_shows_every_agent_with_its_round_rate(swarm):
    address, _ = swarm
    out = subprocess.run(
        [sys.executable, "-c", "from gossiprl.cli import main; main()", "top", address, "--once", "--interval", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert out.returncode == 0, out.stderr
    assert "2 agents, sync mode" in out.stdout
    rows = {}  # rank: rounds/s, of each agent registered (or parked between rounds) that never rejoined
    for fields in (line.split() for line in out.stdout.splitlines()):
        if len(fields) == 9 and fields[1] in ("registered", "parked") and fields[2] == "0":
            rows[int(fields[0])] = float(fields[4])
    assert set(rows) == {0, 1} and all(rate > 0 for rate in rows.values()), out.stdout


@pytest.fixture
def stats_server():
    """A real two-agent broker with no agents yet, and its stats server on a free loopback port."""
    import topologies
    from brokers import close_broker, new_broker
    from gossiprl.monitor import StatsServer

    broker = new_broker(topologies.make("ring", 2))
    server = StatsServer(broker.stats, 0)
    yield broker, server
    server.close()
    assert close_broker(broker)


def test_top_fits_80_columns_with_the_widest_figures_a_run_reaches(stats_server):
    """A new user's 80-column terminal cut 'rejoined' to 'rejoin…' and wrapped 'lock wait' over two lines."""
    import copy
    import io

    from rich.console import Console

    from gossiprl.monitor import agent_rows, render

    broker, _ = stats_server
    after = broker.stats()
    for agent in after["agents"].values():  # a week-long run: 7-digit rounds, terabytes through the broker
        agent.update(registered=True, registrations=13, round=1_234_567, bytes_in=999.9e12, bytes_out=999.9e9)
    before = copy.deepcopy(after)
    before["uptime_s"] -= 2.0
    first, second = before["agents"].values()
    first["publish_wait_s"] -= 2.0  # waited the whole 2 s
    second["bytes_in"] -= 1.9e9  # 1.9 GB in the last 2 s: 950 MB/s
    out = io.StringIO()
    Console(file=out, width=80).print(render(after, agent_rows(before, after)))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in out.getvalue(), out.getvalue()
    (header,) = [line for line in lines if line.startswith("rank")]
    assert header.split() == ["rank", "state", "rejoins", "round", "rounds/s", "lock", "wait", "in", "out", "bytes/s"]
    rows = [line.split() for line in lines if line.split()[:2] in (["0", "registered"], ["1", "registered"])]
    assert rows == [
        ["0", "registered", "12", "1234567", "0.00", "100%", "999.9T", "999.9G", "0B"],
        ["1", "registered", "12", "1234567", "0.00", "0%", "999.9T", "999.9G", "950.0M"],
    ], out.getvalue()


def test_top_into_a_pipe_prints_each_view_as_it_comes(stats_server):
    """Not a terminal (a pipe, a file, a CI log): rich's live redraw printed nothing until the command ended."""
    _, server = stats_server
    top = subprocess.Popen(
        [sys.executable, "-c", "from gossiprl.cli import main; main()", "top", server.address, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(top.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: sum(line.startswith("rank ") for line in lines) >= 3, 60, "no views came", process=top)
    finally:
        top.terminate()
        top.wait(30)
    assert sum(line.startswith("broker ") for line in lines) >= 3, lines


def test_top_without_a_stats_server_is_one_line():
    out = subprocess.run(
        [sys.executable, "-c", "from gossiprl.cli import main; main()", "top", f"127.0.0.1:{free_port()}", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "start the broker with --metrics-port" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_local_swarm_serves_its_brokers_stats_while_it_trains(tmp_path):
    port = free_port()
    run = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gossiprl.cli import main; main()",
            "run",
            "--agents",
            "2",
            "--total-frames",
            "400000",
            "--torch-threads",
            "1",
            "--no-progress",
            "--max-seconds",
            "60",
            "--stop-at-return",
            "none",
            "--run-dir",
            str(tmp_path / "run"),
            "--metrics-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = "".join(run.stdout.readline() for _ in range(3))  # the run's header, its threads line, then stats
        assert f"broker stats on http://127.0.0.1:{port}/metrics" in banner, banner
        seen = []

        def every_agent_gossiped():
            seen.append(json.loads(get(f"http://127.0.0.1:{port}/stats")[2]))
            return all(a["round"] > 0 for a in seen[-1]["agents"].values())

        wait_for(every_agent_gossiped, 60, "the agents never gossiped", every=0.5, process=run)
        stats = seen[-1]
        assert stats["n"] == 2 and stats["address"].startswith("ipc://")
    finally:
        run.terminate()
        run.wait(60)
    assert run.returncode == 143  # stopped by SIGTERM (terminate), after a clean stop


@pytest.mark.timeout(60)
def test_a_run_whose_metrics_port_is_taken_leaves_no_run_dir_behind(tmp_path):
    """Issue 19 F15: a run that failed at start (metrics port taken) left a stub run dir, config.json
    and all, which then refused the same --run-dir ('already holds a run')."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = invoke("run", "--agents", 2, "--metrics-port", port, "--run-dir", tmp_path / "run", "--no-progress")
    assert result.exit_code == 1 and f"cannot serve stats on 127.0.0.1:{port}" in result.output, result.output
    assert not (tmp_path / "run").exists(), "a run that never started left its run dir behind"
