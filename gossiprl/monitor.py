"""Watching a running broker: its stats over HTTP (Prometheus and JSON) and ``gossiprl top``.

The stats leave the broker through a small HTTP server of its own rather than through the
gossip protocol: a monitor then needs no rank, no registration and no CURVE key, and cannot
disturb the turn locks. The server is read-only, answers only ``GET /metrics`` (Prometheus
text format) and ``GET /stats`` (``Broker.stats()`` as JSON), and binds loopback by default.
The stats hold counters, timings and ranks, never keys, identities or parameters; a wider
bind is the operator's explicit choice (``--metrics-bind``). Each answer costs one
``Broker.stats()`` snapshot, and at most ``MIN_SNAPSHOT_S`` apart: faster scrapers are
served the previous snapshot, so no client can make the broker's lock table busier.

Needs only the standard library, plus ``prometheus-client`` for ``/metrics`` and ``rich``
for ``top`` (the ``monitor`` extra); the comms-only install can serve ``/stats``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIN_SNAPSHOT_S = 0.5
"""Stats snapshots are taken at most this often, however often the endpoint is asked."""

_AGENT_GAUGES = {
    "round": ("gossiprl_agent_round", "Gossip rounds the agent has completed at the broker."),
    "publishes": ("gossiprl_agent_publishes", "PUBLISH requests from the agent."),
    "collects": ("gossiprl_agent_collects", "COLLECT requests from the agent."),
    "bytes_in": ("gossiprl_agent_bytes_in", "Payload bytes the broker received from the agent."),
    "bytes_out": ("gossiprl_agent_bytes_out", "Payload bytes the broker sent to the agent."),
    "publish_wait_s": ("gossiprl_agent_publish_wait_seconds", "Seconds the agent's PUBLISHes waited on turn locks."),
    "collect_wait_s": ("gossiprl_agent_collect_wait_seconds", "Seconds the agent's COLLECTs waited on turn locks."),
    "registrations": ("gossiprl_agent_registrations", "Times the agent registered (more than 1: it rejoined)."),
    "gone": ("gossiprl_agent_gone", "1 while the agent is declared gone, else 0."),
}


class StatsServer:
    """Serves ``stats()`` (a callable returning ``Broker.stats()``'s dict) on ``host:port``; port 0 picks one."""

    def __init__(self, stats, port: int, host: str = "127.0.0.1"):
        self._stats = stats
        self._lock = threading.Lock()
        self._snapshot: tuple[float, dict] | None = None
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        self.address = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="stats-http", daemon=True)
        self._thread.start()

    def snapshot(self) -> dict:
        with self._lock:
            now = time.monotonic()
            if self._snapshot is None or now - self._snapshot[0] >= MIN_SNAPSHOT_S:
                self._snapshot = (now, self._stats())
            return self._snapshot[1]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/stats":
            body, kind = json.dumps(self.server.owner.snapshot()).encode(), "application/json"
        elif self.path == "/metrics":
            body, kind = prometheus_text(self.server.owner.snapshot())
        else:
            self.send_error(404, "this server answers GET /metrics and GET /stats only")
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        """Scrapes every few seconds would flood the broker's console."""


def prometheus_text(stats: dict) -> tuple[bytes, str]:
    """(body, content type) of ``stats`` in Prometheus' text format, one gauge per counter with a rank label."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    class Collector:
        def collect(self):
            for key, (name, doc) in _AGENT_GAUGES.items():
                family = GaugeMetricFamily(name, doc, labels=["rank"])
                for rank, agent in stats["agents"].items():
                    family.add_metric([str(rank)], float(agent[key]))
                yield family
            yield GaugeMetricFamily(
                "gossiprl_broker_uptime_seconds", "Seconds since the broker started.", value=stats["uptime_s"]
            )
            errors = GaugeMetricFamily("gossiprl_broker_errors", "Requests refused, by error code.", labels=["code"])
            for code, count in stats["errors"].items():
                errors.add_metric([code], count)
            yield errors
            events = GaugeMetricFamily("gossiprl_broker_events", "Broker events, by kind.", labels=["event"])
            for event, count in stats["events"].items():
                events.add_metric([event], count)
            yield events

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


def fetch_stats(address: str, timeout: float = 5.0) -> dict:
    """``Broker.stats()`` from a broker's stats server (``--metrics-port``): ``http://HOST:PORT`` or ``HOST:PORT``."""
    url = (address if "://" in address else f"http://{address}").rstrip("/") + "/stats"
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def agent_rows(before: dict, after: dict) -> list[dict]:
    """Per-agent figures between two snapshots ``seconds`` apart: rates from the differences."""
    seconds = max(after["uptime_s"] - before["uptime_s"], 1e-9)
    rows = []
    for rank, now in sorted(after["agents"].items(), key=lambda item: int(item[0])):
        then = before["agents"].get(rank, now)
        rows.append(
            {
                "rank": int(rank),
                "state": "gone"
                if now["gone"]
                else "parked"
                if now["parked"]
                else "registered"
                if now["registered"]
                else "absent",
                "rejoined": max(now["registrations"] - 1, 0),
                "round": now["round"],
                "rounds_per_s": (now["round"] - then["round"]) / seconds,
                "lock_wait_share": (
                    now["publish_wait_s"] + now["collect_wait_s"] - then["publish_wait_s"] - then["collect_wait_s"]
                )
                / seconds,
                "bytes_in": now["bytes_in"],
                "bytes_out": now["bytes_out"],
                "mb_per_s": (now["bytes_in"] + now["bytes_out"] - then["bytes_in"] - then["bytes_out"]) / seconds / 1e6,
            }
        )
    return rows


def render(stats: dict, rows: list[dict]):
    """A rich Table of one view: the broker's header line and a row per agent."""
    from rich.table import Table

    errors = sum(stats["errors"].values())
    table = Table(
        title=f"gossiprl broker {stats['address']}: {stats['n']} agents, {stats['mode']} mode, "
        f"up {stats['uptime_s']:.0f}s, {errors} refused request(s)"
    )
    for column in ("rank", "state", "rejoined", "round", "rounds/s", "lock wait", "MB in", "MB out", "MB/s"):
        table.add_column(column, justify="left" if column == "state" else "right")
    for r in rows:
        table.add_row(
            str(r["rank"]),
            r["state"],
            str(r["rejoined"]),
            str(r["round"]),
            f"{r['rounds_per_s']:.2f}",
            f"{100 * r['lock_wait_share']:.0f}%",
            f"{r['bytes_in'] / 1e6:.1f}",
            f"{r['bytes_out'] / 1e6:.1f}",
            f"{r['mb_per_s']:.2f}",
        )
    return table


def top(address: str, interval: float = 2.0, once: bool = False, console=None) -> None:
    """Redraw the view every ``interval`` seconds (rates over that interval) until Ctrl-C; ``once``: one view."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    before = fetch_stats(address)
    time.sleep(interval)
    after = fetch_stats(address)
    if once:
        console.print(render(after, agent_rows(before, after)))
        return
    with Live(render(after, agent_rows(before, after)), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            before, after = after, fetch_stats(address)
            live.update(render(after, agent_rows(before, after)), refresh=True)
