"""The comms layer's settings: a broker's (BrokerConfig) and an agent's connection to it
(ClientConfig), and the timing constants both ends share.

They live in the comms layer, not beside the launcher's SwarmConfig, because a broker host runs
without the RL stack and the broker and client take their defaults from here. Like every config
of gossiprl (``gossiprl.settings`` is the tree), each field's default and the docstring under it
are its one declaration: the `gossiprl broker` and `gossiprl agent` flags are generated from
them by ``gossiprl.config``, which also says what ``field(metadata=...)`` may hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .wire import DEFAULT_MAX_PAYLOAD_BYTES

PEER_TIMEOUT_S = 60.0
"""Seconds of silence after which a broker declares an agent gone."""

GOSSIP_TIMEOUT_S = 60.0
"""Seconds an agent waits for a turn lock before it skips the round and trains on."""

HEARTBEAT_S = 1.0
"""How often a client waiting on the broker pings it."""

LIVENESS = 3
"""Silent heartbeats in a row after which a client takes its broker for gone."""

CONNECT_TIMEOUT_S = 120.0
"""How long an agent of a batch job, which may start before its broker, keeps trying to register."""

KEY_FILE = {"exists": True, "dir_okay": False}
"""A key file given on the command line must exist (metadata ``path``: click.Path's checks)."""


@dataclass
class BrokerConfig:
    """What a broker process is told beyond the swarm's shape: where it binds, when a silent agent
    is gone, whose keys it admits, and where and how often it reports."""

    topology: str = field(default="ring", metadata={"flag": "--topology", "metavar": "NAME|FILE"})
    """A family (ring, sparse, full, ...: `gossiprl topology table` lists them), or a .npy/.csv
    file holding a row-stochastic matrix."""
    agents: int | None = field(default=None, metadata={"min": 1, "short": "-n"})
    """Number of agents (ranks 0..N-1)."""
    bind: str = "tcp://127.0.0.1:5555"
    """ZeroMQ endpoint to bind (tcp://HOST:PORT or ipc://PATH)."""
    peer_timeout: float = field(default=PEER_TIMEOUT_S, metadata={"min": 0.1})
    """Seconds of silence before an agent is unregistered."""
    stats_every: float = field(default=30.0, metadata={"min": 0})
    """Print a line of broker stats every this many seconds (0: never)."""
    stats_json: bool = field(default=False, metadata={"switch": True})
    """Print the stats as full JSON (as -v does) instead of one short line."""
    exit_when_done: bool = field(default=False, metadata={"switch": True})
    """Exit once every rank has registered and then left with BYE (the swarm finished), e.g. for a
    broker started with & beside its agents."""
    curve_secret: Path | None = field(default=None, metadata={"path": KEY_FILE})
    """The broker's CURVE secret key (broker.key_secret from `gossiprl keys generate`)."""
    curve_allow: Path | None = field(default=None, metadata={"path": {"exists": True, "file_okay": False}})
    """Directory of the agents' public keys (*.key) the broker admits."""
    insecure: bool = field(default=False, metadata={"switch": True})
    """Bind a tcp address without CURVE keys: every user of this host (and, beyond loopback, of the
    network) can then join the swarm. Only on a host and network you trust."""
    max_payload_mib: int = field(default=64, metadata={"min": 1, "max": DEFAULT_MAX_PAYLOAD_BYTES >> 20})
    """The largest letter the broker takes, in MiB (64 MiB: a 16M-parameter float32 model). A frame
    larger than this, or than a 1 MiB header, drops its connection before ZeroMQ buffers it."""
    metrics_port: int | None = field(default=None, metadata={"min": 0, "max": 65535})
    """Serve the broker's stats over HTTP on this port (at --metrics-bind; `gossiprl run`'s broker
    at 127.0.0.1): /metrics (Prometheus) and /stats (for `gossiprl top`)."""
    metrics_bind: str = "127.0.0.1"
    """Address the stats server binds (anything wider lets others on that network read the stats)."""

    @property
    def curve(self) -> tuple[Path, Path] | None:
        """The broker's ``curve`` argument: (secret key, directory of admitted keys), or None."""
        return (self.curve_secret, self.curve_allow) if self.curve_secret is not None else None


@dataclass
class ClientConfig:
    """How one agent reaches its broker: the address, its keys, and how long it waits for what."""

    connect: str | None = field(default=None, metadata={"required": True})
    """The broker's endpoint, e.g. tcp://HOST:5555."""
    curve_secret: Path | None = field(default=None, metadata={"path": KEY_FILE})
    """This agent's CURVE secret key (NAME.key_secret), for a broker that requires keys."""
    curve_broker: Path | None = field(default=None, metadata={"path": KEY_FILE})
    """The broker's public key (broker.key)."""
    heartbeat: float = field(default=HEARTBEAT_S, metadata={"min": 0, "min_open": True})
    """Seconds between pings while a call waits on the broker."""
    liveness: int = field(default=LIVENESS, metadata={"min": 1})
    """Silent heartbeats in a row that mean the broker is gone."""
    connect_timeout: float | None = CONNECT_TIMEOUT_S
    """Seconds to keep trying to register with a broker that does not answer yet; None: one try,
    whose error is raised as it is (a broker started by the same launcher is up already)."""

    @property
    def curve(self) -> tuple[Path, Path] | None:
        """The client's ``curve`` argument: (this agent's secret key, the broker's public key), or None."""
        return (self.curve_secret, self.curve_broker) if self.curve_secret is not None else None
