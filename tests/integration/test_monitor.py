"""Watching a real broker: its stats server (Prometheus /metrics, JSON /stats) and `gossiprl top --once`."""

import json
import os
import re
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
                    time.sleep(0.02)
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
    time.sleep(0.6)
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
    rows = {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(
            r"^\S*\s*(\d)\s+\S*\s*(?:registered|parked)\s+\S*\s*0\s+\S*\s*\d+\s+\S*\s*([\d.]+)", out.stdout, re.M
        )
    }
    assert set(rows) == {0, 1} and all(rate > 0 for rate in rows.values()), out.stdout


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
