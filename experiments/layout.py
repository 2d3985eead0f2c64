"""Layout (PALA paper Fig. 5): the same 4-agent sync ring with every agent on one host, or spread
over two network-namespace "hosts" (2 agents each) whose links to the broker's host are shaped
to 1 Gbit/s, as the paper's cluster. Both talk tcp; the spread one with CURVE keys, as any
broker on a non-loopback address must. Needs root and iproute2 (as tests/integration/test_netns.py);
without them only the one-host setting runs, and the study says why.

    sudo python -m experiments.layout            # MinAtar Breakout, 5 seeds
    sudo python -m experiments.layout --quick    # CartPole smoke test
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import click

from experiments.common import Cell
from experiments.study import Study, command
from gossiprl.bench import scale as bench_scale
from gossiprl.launch import SwarmConfig
from gossiprl.rl.agent import AgentConfig

AGENTS = 4
PORT = 5555
LINKS = {"a": ("10.232.1.1", "10.232.1.2"), "b": ("10.232.2.1", "10.232.2.2")}
"""Per agent host: (broker's address on the link, the host's address); private, inside the namespaces only."""
ONE_HOST = "one host (tcp loopback)"
SPREAD = "2 netns hosts, 1 Gbit/s links (tcp + CURVE)"


def _sh(*cmd, check=True):
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def netns_unavailable() -> str | None:
    return bench_scale.unavailable("the layout study")


@contextmanager
def namespaces(links=LINKS, prefix: str = "gx"):
    """A broker host and agent hosts (``links``: host -> (broker-side ip, agent-side ip)), each agent
    host on its own 1 Gbit/s veth link to the broker's; all removed on exit."""
    tag = uuid.uuid4().hex[:6]
    names = {"broker": f"{prefix}-{tag}-broker", **{host: f"{prefix}-{tag}-{host}" for host in links}}
    try:
        for ns in names.values():
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        for host, (broker_ip, agent_ip) in links.items():
            near, far = f"{prefix[-1]}b{tag}{host}", f"{prefix[-1]}a{tag}{host}"
            _sh(
                "ip",
                "link",
                "add",
                near,
                "netns",
                names["broker"],
                "type",
                "veth",
                "peer",
                "name",
                far,
                "netns",
                names[host],
            )
            for ns, dev, ip in ((names["broker"], near, broker_ip), (names[host], far, agent_ip)):
                _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
                _sh("ip", "-n", ns, "link", "set", dev, "up")
                _sh(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    "1gbit",
                    "burst",
                    "256kb",
                    "latency",
                    "20ms",
                )
        yield names
    finally:
        for ns in names.values():
            _sh("ip", "netns", "del", ns, check=False)


def run_spread(cell: Cell, cfg: AgentConfig, run_dir: Path) -> tuple[list[dict], float]:
    """Broker and agents as `gossiprl` commands in their namespaces; each agent's summary is its last line."""
    run_dir.mkdir(parents=True, exist_ok=True)
    keys, allowed = run_dir / "keys", run_dir / "allowed"
    _sh(sys.executable, "-m", "gossiprl.cli", "keys", "generate", str(keys), "--name", "broker", "--name", "agent")
    allowed.mkdir()
    shutil.copy(keys / "agent.key", allowed / "agent.key")

    def cli(ns, *args):
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "gossiprl.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    a2c = cfg.a2c
    # the cell's rate, which its fingerprint names (the studies' on MinAtar), not the CLI's default
    rate = ["--lr", repr(a2c.lr)] if a2c.lr is not None else []
    with namespaces() as ns:
        start = time.perf_counter()
        broker = cli(
            ns["broker"],
            "broker",
            "--bind",
            f"tcp://0.0.0.0:{PORT}",
            "--agents",
            str(cell.agents),
            "--topology",
            "ring",
            "--curve-secret",
            str(keys / "broker.key_secret"),
            "--curve-allow",
            str(allowed),
        )
        agents = {}
        try:
            for rank in range(cell.agents):
                host = "a" if rank < cell.agents // 2 else "b"
                agents[rank] = cli(
                    ns[host],
                    "agent",
                    "--connect",
                    f"tcp://{LINKS[host][0]}:{PORT}",
                    "--rank",
                    str(rank),
                    "--agents-per-host",
                    str(cell.agents),
                    "--env",
                    cfg.env_id,
                    "--seed",
                    str(cfg.seed),
                    "--total-frames",
                    str(cfg.total_frames),
                    "--num-envs",
                    str(a2c.num_envs),
                    "--n-steps",
                    str(a2c.n_steps),
                    *rate,
                    "--gossip-every",
                    str(cfg.gossip_every),
                    "--log-every",
                    str(cfg.log_every),
                    "--checkpoint-every",
                    str(cfg.checkpoint_every),
                    "--device",
                    "cpu",
                    "--run-dir",
                    str(run_dir),
                    "--curve-secret",
                    str(keys / "agent.key_secret"),
                    "--curve-broker",
                    str(keys / "broker.key"),
                )
            outputs = {rank: p.communicate()[0] for rank, p in agents.items()}
            wall = time.perf_counter() - start
        finally:
            for p in [*agents.values(), broker]:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            broker.communicate(timeout=30)
    for rank, out in outputs.items():
        if agents[rank].returncode:
            raise RuntimeError(f"agent-{rank} in its namespace failed:\n{out[-2000:]}")
    return [json.loads(outputs[r].strip().splitlines()[-1]) for r in range(cell.agents)], wall


def build(quick: bool, frames: int, seeds: list[int]) -> tuple[list[Cell], list[str]]:
    settings = [ONE_HOST]
    cells = [
        Cell(
            ONE_HOST,
            seed,
            AGENTS,
            frames,
            SwarmConfig(agents=AGENTS, topology="ring", transport="tcp"),
            labels={"layout": "one host"},
            plane=None,  # through the broker, as the namespaces' arm: the layout is the question
        )
        for seed in seeds
    ]
    reason = netns_unavailable()
    if reason:
        click.echo(f"layout: the network-namespace setting is skipped: {reason}")
        return cells, settings
    settings.append(SPREAD)
    cells += [
        Cell(
            SPREAD,
            seed,
            AGENTS,
            frames,
            SwarmConfig(agents=AGENTS, topology="ring", transport="tcp"),
            labels={"layout": "netns"},
            runner=run_spread,
        )
        for seed in seeds
    ]
    return cells, settings


STUDY = Study(
    "layout",
    "Layout: one host vs network-namespace hosts",
    "does spreading the same swarm over hosts joined by 1 Gbit/s links, as PALA's cluster, cost "
    "learning speed against all agents on one host, on the same cores?",
    build,
    real_frames=100_000,
)
main = command(STUDY)

if __name__ == "__main__":
    main()
