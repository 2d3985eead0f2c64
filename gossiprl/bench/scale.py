"""`gossiprl bench scale`: ring round time against the number of hosts, relay vs direct.

Each "host" is a Linux network namespace holding one agent process, wired to a switch (a bridge in
a namespace of its own) by a veth link shaped with ``tc tbf`` to ``rate`` in each direction, as a
NIC would be. The broker sits behind such a link too. With the relay (``broker``) every letter
crosses the broker's one link twice, so a round grows with n; with ``direct`` each agent's link
carries its own letter out and its in-peer's in, so a ring round should not grow with n.

A round is ``GossipClient.exchange`` plus the plain ring mix ``x += m; x *= 0.5`` (the cost of
``gossip.mix`` is the same at every n and is measured by `gossiprl bench comms`); the figure is
the median over rounds of the slowest agent. Needs root and iproute2; without them it says why
and measures nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

import numpy as np

from ..settings import NATURE_CNN_PARAMS

PORT = 5555
PREFIX = "gscale-"
SUBNET = "10.232.0"


def unavailable(what: str = "bench scale") -> str | None:
    """Why namespaces cannot be made here (for ``what``), or None."""
    if os.geteuid() != 0:
        return f"{what} needs root to make network namespaces"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return f"{what} needs iproute2 (ip, tc): apt-get install iproute2"
    probe = f"{PREFIX}probe-{uuid.uuid4().hex[:6]}"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode:
        return f"'ip netns add' is not allowed here: {made.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    return None


def _sh(*cmd, check=True):
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def _remove_orphans() -> None:
    """Namespaces left by a bench whose process was killed: named after its pid, removed once it is dead."""
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX):
            owner = name[len(PREFIX) :].split("-")[0]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                _sh("ip", "netns", "del", name, check=False)


class Network:
    """A switch, a broker host and ``n`` agent hosts, each behind its own shaped veth link."""

    def __init__(self, n: int, rate: str):
        self.tag = f"{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.switch = f"{PREFIX}{self.tag}-sw"
        self.hosts = {"broker": f"{PREFIX}{self.tag}-b", **{i: f"{PREFIX}{self.tag}-h{i}" for i in range(n)}}
        self.ip = {"broker": f"{SUBNET}.1", **{i: f"{SUBNET}.{10 + i}" for i in range(n)}}
        short = uuid.uuid4().hex[:5]
        try:
            _sh("ip", "netns", "add", self.switch)
            _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for key, ns in self.hosts.items():
                near, far = f"g{short}{key if key != 'broker' else 'b'}s", f"g{short}{key if key != 'broker' else 'b'}h"
                _sh("ip", "netns", "add", ns)
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _sh("ip", "link", "add", near, "netns", self.switch, "type", "veth", "peer", "name", far, "netns", ns)
                _sh("ip", "-n", self.switch, "link", "set", near, "master", "br0")
                _sh("ip", "-n", ns, "addr", "add", f"{self.ip[key]}/24", "dev", far)
                for space, dev in ((self.switch, near), (ns, far)):
                    _sh("ip", "-n", space, "link", "set", dev, "up")
                    _sh(
                        "ip",
                        "netns",
                        "exec",
                        space,
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        rate,
                        "burst",
                        "256kb",
                        "latency",
                        "50ms",
                    )
        except BaseException:
            self.close()
            raise

    def run(self, host, *args) -> subprocess.Popen:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[host], sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        for ns in (self.switch, *self.hosts.values()):
            _sh("ip", "netns", "del", ns, check=False)


def agent_main(address: str, rank: int, numel: int, rounds: int, warmup: int) -> None:
    """One agent: ring rounds of exchange + plain mix; prints its round times as JSON."""
    from ..comms.client import GossipClient

    x = np.full(numel, float(rank), np.float32)
    times = []
    with GossipClient(address, rank, timeout=300, heartbeat=1.0, liveness=30) as client:
        for r in range(warmup + rounds):
            t0 = time.perf_counter()
            letters = client.exchange({"x": x})
            for letter in letters.values():
                x += letter["x"]
                x *= 0.5
            if r >= warmup:
                times.append(time.perf_counter() - t0)
        counts = client.plane_counts
    print(json.dumps({"rank": rank, "times": times, "counts": counts}), flush=True)


def _wait_for_agents(broker: subprocess.Popen, agents: list[subprocess.Popen], timeout: float) -> None:
    """Wait until every agent has exited cleanly; raise at once, with its stderr, when one fails or
    the broker stops, and after ``timeout`` with the stderr of every process still running.

    Waiting on the agents one by one hid a crashed agent behind its neighbour, parked on the
    crashed one's letter until its own 300 s turn-lock wait ran out."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in agents):
        failed = [(f"agent-{r}", p) for r, p in enumerate(agents) if p.poll() not in (None, 0)]
        if broker.poll() is not None:
            failed.append(("the broker", broker))
        if failed or time.monotonic() > deadline:
            stuck = [(f"agent-{r}", p) for r, p in enumerate(agents) if p.poll() is None]
            for p in [broker, *(p for _, p in stuck)]:
                if p.poll() is None:
                    p.kill()
                    p.wait()  # reaped before we go on: a killed process is gone, not dying
            what = "failed" if failed else f"gave no result within {timeout:g}s"
            report = "\n".join(
                f"--- {name} (exit {p.wait()}):\n{p.communicate()[1][-2000:]}" for name, p in failed + stuck
            )
            raise RuntimeError(f"bench agents {what}:\n{report}")
        time.sleep(0.1)
    for r, p in enumerate(agents):
        if p.returncode:
            raise RuntimeError(f"a bench agent failed (agent-{r}):\n{p.communicate()[1][-2000:]}")


def measure(n: int, plane: str, numel: int, rounds: int, warmup: int, rate: str, deadline_s: float = 600) -> dict:
    """The median slowest-agent round (seconds) of one ring of n hosts over one data plane."""
    net = Network(n, rate)
    broker = agents = None
    try:
        address = f"tcp://{net.ip['broker']}:{PORT}"
        broker = net.run(
            "broker",
            "-m",
            "gossiprl.cli",
            "broker",
            "--bind",
            address,
            "--insecure",
            "--agents",
            str(n),
            "--topology",
            "ring",
            "--data-plane",
            plane,
            "--stats-every",
            "0",
        )
        agents = [
            net.run(r, "-m", "gossiprl.bench.scale", "--agent", address, str(r), str(numel), str(rounds), str(warmup))
            for r in range(n)
        ]
        _wait_for_agents(broker, agents, timeout=deadline_s)
        results = []
        for p in agents:
            out, _ = p.communicate()
            results.append(json.loads(out.strip().splitlines()[-1]))
        slowest = [max(ts) for ts in zip(*(r["times"] for r in results))]
        counts = {k: sum(r["counts"].get(k, 0) for r in results) for k in results[0]["counts"]}
        return {"round_s": statistics.median(slowest), "counts": counts}
    finally:
        for p in [broker, *(agents or [])]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        net.close()


def run(
    hosts=(2, 4, 8, 16),
    planes=("broker", "direct"),
    numel: int = NATURE_CNN_PARAMS,
    rounds: int = 10,
    warmup: int = 2,
    rate: str = "1gbit",
    plot: str | None = "scale.png",
    echo=print,
    deadline_s: float = 600,
) -> dict:
    """The scaling table (and plot); returns it as a dict, or {"skipped": why}. ``deadline_s``
    bounds each ring: past it the bench stops, naming the processes still running."""
    why = unavailable()
    if why:
        echo(f"skipped: {why}")
        return {"skipped": why}
    _remove_orphans()
    echo(
        f"ring of n hosts (network namespaces), each link {rate} each way (tc tbf), {numel * 4 / 1e6:.2f} MB "
        f"letters, exchange + plain mix; median over {rounds} rounds of the slowest agent; {os.cpu_count()} cores"
    )
    echo("  hosts  " + "  ".join(f"{p + ' ms/round':>18s}" for p in planes) + f"  direct / direct at n={hosts[0]}")
    table = []
    for n in hosts:
        row = {"hosts": n}
        for plane in planes:
            got = measure(n, plane, numel, rounds, warmup, rate, deadline_s)
            row[plane] = got["round_s"] * 1e3
            row[f"{plane}_counts"] = got["counts"]
        table.append(row)
        ratio = f"  {row['direct'] / table[0]['direct']:.2f}x" if "direct" in row else ""
        echo(f"  {n:5d}  " + "  ".join(f"{row[p]:18.1f}" for p in planes) + ratio)
    result = {"rate": rate, "payload_mb": numel * 4 / 1e6, "rounds": rounds, "cores": os.cpu_count(), "table": table}
    if plot:
        _plot(table, planes, rate, numel, plot)
        echo(f"plot written to {plot}")
    return result


def _plot(table, planes, rate, numel, path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ns = [row["hosts"] for row in table]
    for plane in planes:
        ax.plot(ns, [row[plane] for row in table], marker="o", label=plane)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("hosts (one agent each, ring)")
    ax.set_ylabel("round time, ms (slowest agent, median)")
    ax.set_title(f"{numel * 4 / 1e6:.2f} MB letters, {rate} links")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__" and sys.argv[1:2] == ["--agent"]:
    agent_main(sys.argv[2], *(int(a) for a in sys.argv[3:7]))
