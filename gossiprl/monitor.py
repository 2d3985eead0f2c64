"""Watching a running broker: its stats over HTTP (Prometheus and JSON), ``gossiprl top``, and the
one-line form ``gossiprl broker`` prints (``stats_line``).

The stats leave the broker through a small HTTP server of its own rather than through the
gossip protocol: a monitor then needs no rank, no registration and no CURVE key, and cannot
disturb the turn locks. The server is read-only, answers only ``GET /metrics`` (Prometheus
text format) and ``GET /stats`` (``Broker.stats()`` as JSON), and binds loopback by default.
It runs on one thread of its own with a cap on connections and on each connection's life, so
neither a scrape flood nor slow clients reach the broker's serving thread or its descriptors.
The stats hold counters, timings and ranks, never keys, identities or parameters; a wider
bind is the operator's explicit choice (``--metrics-bind``). Each answer costs one
``Broker.stats()`` snapshot, and at most ``MIN_SNAPSHOT_S`` apart: faster scrapers are
served the previous snapshot, so no client can make the broker's lock table busier.

Needs only the standard library, plus ``prometheus-client`` for ``/metrics`` and ``rich``
for ``top`` (the ``monitor`` extra); the comms-only install can serve ``/stats``.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
import time
import urllib.request

log = logging.getLogger("gossiprl.monitor")

MIN_SNAPSHOT_S = 0.5
"""Stats snapshots are taken at most this often, however often the endpoint is asked."""
MAX_CONNECTIONS = 16
"""Connections held at once. Each costs a file descriptor of the broker's process, so the cap keeps
scrapers off the agents' budget; at the cap a new connection replaces the oldest one still sending
its request (the likeliest slowloris), so a quick scrape still gets through a slow flood."""
CONNECTION_S = 5.0
"""A connection's whole life: a client that has not sent its request and read the answer by then
is cut off (248 slowloris connections used to hold a thread and a descriptor each, for ever)."""
MAX_REQUEST_BYTES = 8192
"""Request line and headers; a longer request is answered 431 and closed."""

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


def listen(port: int, host: str = "127.0.0.1") -> socket.socket:
    """The stats server's listening socket. A command binds it before it makes anything else, so a
    port in use stops it with nothing left behind (a run dir made first then blocked its own retry)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=128)  # no descriptor until accepted
    listener.setblocking(False)
    return listener


class StatsServer:
    """Serves ``stats()`` (a callable returning ``Broker.stats()``'s dict) on ``host:port``; port 0 picks one;
    ``port`` may also be a socket from ``listen``, bound earlier.

    One thread of its own serves every connection from a selector, never the broker's serving
    thread: a flood of scrapes or slow clients costs this thread, at most MAX_CONNECTIONS
    descriptors and CONNECTION_S each, and no answer is rendered more often than a snapshot is
    taken (a /metrics flood used to raise the broker's PING median from 0.63 to 15.9 ms).
    """

    def __init__(self, stats, port: int | socket.socket, host: str = "127.0.0.1"):
        self._stats = stats
        self._lock = threading.Lock()
        self._snapshot: tuple[float, dict, dict] | None = None
        self._listener = port if isinstance(port, socket.socket) else listen(port, host)
        self.address = f"http://{host}:{self._listener.getsockname()[1]}"
        self.refused = 0
        """Connections closed unserved: over the cap, too slow, or a request too long."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="stats-http", daemon=True)
        self._thread.start()

    def _current(self) -> tuple[dict, dict]:
        """The latest stats and the answers rendered from them (filled in as they are asked for)."""
        with self._lock:
            now = time.monotonic()
            if self._snapshot is None or now - self._snapshot[0] >= MIN_SNAPSHOT_S:
                self._snapshot = (now, self._stats(), {})
            return self._snapshot[1], self._snapshot[2]

    def _answer(self, request: bytes) -> bytes:
        """The whole HTTP/1.0 response to one request's head."""
        method, _, rest = request.partition(b" ")
        path = rest.split(b" ", 1)[0]
        if method != b"GET":
            return _response(405, b"this server answers GET /metrics and GET /stats only\n", "text/plain")
        if path not in (b"/stats", b"/metrics"):
            return _response(404, b"this server answers GET /metrics and GET /stats only\n", "text/plain")
        stats, rendered = self._current()
        if path not in rendered:
            if path == b"/stats":
                rendered[path] = _response(200, json.dumps(stats).encode(), "application/json")
            else:
                rendered[path] = _response(200, *prometheus_text(stats))
        return rendered[path]

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, "accept")
        selector.register(self._wake_r, selectors.EVENT_READ, "stop")
        conns: dict[socket.socket, list] = {}  # socket -> [deadline, bytes received, answer left to send]
        try:
            while True:
                for key, _ in selector.select(timeout=0.5):
                    if key.data == "stop":
                        return
                    if key.data == "accept":
                        self._accept(selector, conns)
                    elif key.fileobj in conns:  # (not evicted by an accept of this same batch)
                        self._step(selector, conns, key.fileobj)
                now = time.monotonic()
                for conn in [c for c, state in conns.items() if state[0] < now]:
                    self.refused += 1
                    _close(selector, conns, conn)
        finally:
            for conn in list(conns):
                _close(selector, conns, conn)
            selector.close()

    def _accept(self, selector, conns) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the next select tries again
                return
            if len(conns) >= MAX_CONNECTIONS:  # make room: the oldest still sending its request goes
                reading = [c for c, state in conns.items() if not state[2]]
                if not reading:
                    self.refused += 1
                    conn.close()
                    continue
                self.refused += 1
                _close(selector, conns, min(reading, key=lambda c: conns[c][0]))
            conn.setblocking(False)
            conns[conn] = [time.monotonic() + CONNECTION_S, b"", b""]
            selector.register(conn, selectors.EVENT_READ, "conn")

    def _step(self, selector, conns, conn) -> None:
        """Read more of a request, or send more of its answer; close when done or on any error."""
        state = conns[conn]
        try:
            if state[2]:
                state[2] = state[2][conn.send(state[2]) :]
                if not state[2]:
                    _close(selector, conns, conn)
                return
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            _close(selector, conns, conn)
            return
        if not chunk:
            _close(selector, conns, conn)
            return
        state[1] += chunk
        if b"\r\n\r\n" in state[1]:
            try:
                answer = self._answer(state[1].split(b"\r\n", 1)[0])
            except Exception as err:  # a failed snapshot, prometheus-client missing: this one answer fails
                log.exception("stats server: cannot answer")
                answer = _response(500, f"cannot answer: {type(err).__name__}\n".encode(), "text/plain")
            state[2] = memoryview(answer)
        elif len(state[1]) > MAX_REQUEST_BYTES:
            self.refused += 1
            state[2] = memoryview(_response(431, b"request head over 8 KiB\n", "text/plain"))
        else:
            return
        selector.modify(conn, selectors.EVENT_WRITE, "conn")

    def close(self) -> None:
        self._wake_w.send(b"x")
        self._thread.join()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()


_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


def _response(status: int, body: bytes, kind: str) -> bytes:
    head = (
        f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _close(selector, conns, conn) -> None:
    selector.unregister(conn)
    del conns[conn]
    conn.close()


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


def stats_line(stats: dict) -> str:
    """``Broker.stats()`` as one short line for a person watching a terminal (the JSON runs to a kilobyte)."""
    agents = stats["agents"].values()
    registered = sum(a["registered"] for a in agents)
    left = sum(a["said_bye"] for a in agents)
    gone = sum(a["gone"] and not a["said_bye"] for a in agents)
    rounds = [a["round"] for a in agents if a["registrations"]]
    letters = sum(a["publishes"] for a in agents)
    moved = sum(a["bytes_in"] + a["bytes_out"] for a in agents)
    errors = sum(stats["errors"].values())
    return (
        f"broker: {registered}/{stats['n']} agents registered, {left} left (BYE), {gone} gone; "
        f"rounds {f'{min(rounds)}-{max(rounds)}' if rounds else 'none yet'}; {letters:,} letters, "
        f"{_megabytes(moved)} through the broker; {errors} error(s)"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(stats['errors'].items()))})" if errors else "")
        + f"; up {stats['uptime_s']:.0f}s"
    )


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.1f} MB"


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
                "bytes_per_s": (now["bytes_in"] + now["bytes_out"] - then["bytes_in"] - then["bytes_out"]) / seconds,
            }
        )
    return rows


def render(stats: dict, rows: list[dict]):
    """One view: the broker's line, then a row per agent, in 80 columns (a 7-digit round, a rate of
    1,000 rounds/s and a terabyte still fit; the header wraps rather than truncates a long address)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    errors = sum(stats["errors"].values())
    header = Text(
        f"broker {stats['address']}: {stats['n']} agents, {stats['mode']} mode, "
        f"up {stats['uptime_s']:.0f}s, {errors} refused request(s)",
        overflow="fold",
    )
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    for column in ("rank", "state", "rejoins", "round", "rounds/s", "lock wait", "in", "out", "bytes/s"):
        table.add_column(column, justify="left" if column == "state" else "right", no_wrap=True)
    for r in rows:
        table.add_row(
            str(r["rank"]),
            r["state"],
            str(r["rejoined"]),
            str(r["round"]),
            f"{r['rounds_per_s']:.2f}",
            f"{100 * r['lock_wait_share']:.0f}%",
            _size(r["bytes_in"]),
            _size(r["bytes_out"]),
            _size(r["bytes_per_s"]),
        )
    return Group(header, table)


def _size(nbytes: float) -> str:
    """Bytes in at most 6 characters: 512B, 6.8M, 1.2T (decimal units, as the MB elsewhere)."""
    if nbytes < 999.5:
        return f"{nbytes:.0f}B"
    for unit in "KMGT":
        nbytes /= 1000
        if nbytes < 999.95 or unit == "T":
            return f"{nbytes:.1f}{unit}"


def top(address: str, interval: float = 2.0, once: bool = False, console=None) -> None:
    """Redraw the view every ``interval`` seconds (rates over that interval) until Ctrl-C; ``once``: one view.

    Where output is no terminal (a pipe, a file, a CI log) each view is printed below the last: a
    live redraw there shows nothing until the command ends."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    before = fetch_stats(address)
    time.sleep(interval)
    after = fetch_stats(address)
    if once or not console.is_terminal:
        console.print(render(after, agent_rows(before, after)))
        while not once:
            time.sleep(interval)
            before, after = after, fetch_stats(address)
            console.print()
            console.print(render(after, agent_rows(before, after)))
        return
    with Live(render(after, agent_rows(before, after)), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            before, after = after, fetch_stats(address)
            live.update(render(after, agent_rows(before, after)), refresh=True)
