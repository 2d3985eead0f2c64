"""CurveZMQ keys for the broker and its agents, and the rule that decides when they are required.

Without authentication anyone who can reach the broker's port can register a free rank and
publish parameters into the swarm, so a broker that binds anything but loopback must either
hold CURVE keys or be told ``insecure`` explicitly. With CURVE the broker proves who it is
with its secret key, every agent proves who it is with its own, and the broker's ZAP handler
(below) admits only agents whose public keys sit in its allow directory. A refused peer never
completes the ZeroMQ handshake, so none of its bytes reach the broker's message handling.

Key files are the ZeroMQ certificate format (``NAME.key`` public, ``NAME.key_secret`` secret),
so keys made with other ZeroMQ tools work too. Nothing here imports torch or gymnasium.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import stat
import struct
import tempfile
import uuid
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

log = logging.getLogger("gossiprl.comms.keys")

ZAP_DOMAIN = "gossiprl"
SECRET_SUFFIX = ".key_secret"
PUBLIC_SUFFIX = ".key"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
HOW_TO_MAKE_KEYS = (
    "make keys with `gossiprl keys generate DIR` and start the broker with "
    "--curve-secret DIR/broker.key_secret --curve-allow DIR_OF_AGENT_PUBLIC_KEYS "
    "(Python: Broker(curve=(secret_file, allow_dir)))"
)


# ------------------------------------------------------------------ files


def generate(directory, name: str) -> tuple[Path, Path]:
    """Write a new key pair ``NAME.key`` / ``NAME.key_secret`` into ``directory``; returns their paths.

    The pair is made in a private temporary directory and moved into place only once the secret
    file is mode 0600, so the secret key is never readable by other users, not even briefly.
    Existing files are never overwritten: replacing a deployed key would lock its holder out.
    """
    if not _NAME.match(name):
        raise ValueError(f"key name {name!r}: use letters, digits, '_', '.' or '-' (e.g. broker, agent-0)")
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    public, secret = directory / f"{name}{PUBLIC_SUFFIX}", directory / f"{name}{SECRET_SUFFIX}"
    for path in (public, secret):
        if path.exists():
            raise FileExistsError(f"{path} already exists; choose another name or delete the old key pair first")
    staging = tempfile.mkdtemp(prefix=".gossiprl-keys-", dir=directory)
    try:
        tmp_public, tmp_secret = zmq.auth.create_certificates(staging, name)
        os.chmod(tmp_secret, 0o600)
        os.chmod(tmp_public, 0o644)
        os.replace(tmp_secret, secret)
        os.replace(tmp_public, public)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return public, secret


def load_secret(path) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a ``.key_secret`` file, checked to belong together."""
    public, secret = _read_certificate(path, "secret key file (NAME.key_secret)")
    if secret is None:
        raise ValueError(f"{path} holds only a public key; give the matching {SECRET_SUFFIX} file")
    _check_z85(path, secret)
    if zmq.curve_public(secret) != public:
        raise ValueError(f"{path}: the secret key does not match the public key in the same file (corrupted?)")
    mode = stat.S_IMODE(Path(path).stat().st_mode)
    if mode & 0o077:
        raise PermissionError(
            f"{path} is open to other users (mode {mode:o}), so its secret key may be "
            f"known to them; refusing it, as ssh does: chmod 600 {path}"
        )
    return public, secret


def load_public(path) -> bytes:
    """The Z85 public key from a ``.key`` (or ``.key_secret``) file."""
    public, _ = _read_certificate(path, "public key file (NAME.key)")
    return public


def load_allowed(directory) -> frozenset[bytes]:
    """The public keys of every ``*.key`` file in ``directory``: the agents a broker admits.

    An empty directory is an error rather than "admit nobody": a broker that refuses every
    agent looks exactly like a dead one from the agents' side. A directory or key file that
    other users may write is refused: whoever can drop a key there can join the swarm.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory of allowed agent public keys (*.key files)")
    for path in (directory, *sorted(directory.glob(f"*{PUBLIC_SUFFIX}"))):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o022:
            raise PermissionError(
                f"{path} is writable by other users (mode {mode:o}), who could add their own "
                f"key to the allowed ones; refusing it, as ssh does: chmod go-w {path}"
            )
    keys = frozenset(load_public(p) for p in sorted(directory.glob(f"*{PUBLIC_SUFFIX}")))
    if not keys:
        raise ValueError(f"{directory} holds no *.key public keys; copy each agent's NAME.key there")
    return keys


_RANKS_LINE = re.compile(r'^\s*ranks\s*=\s*"([^"]*)"\s*$', re.MULTILINE)


def load_grants(directory) -> dict[str, frozenset[int] | None]:
    """Which ranks each allowed key may hold, by Z85 public key: a ``ranks = "0-3,7"`` line in the
    ``metadata`` section of its ``.key`` file; None (any rank) where the file has no such line."""
    grants = {}
    for path in sorted(Path(directory).glob(f"*{PUBLIC_SUFFIX}")):
        found = _RANKS_LINE.search(path.read_text(encoding="utf-8", errors="replace"))
        grants[load_public(path).decode("ascii")] = _parse_ranks(path, found.group(1)) if found else None
    return grants


def _parse_ranks(path, text: str) -> frozenset[int]:
    ranks = set()
    for part in text.replace(" ", "").split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or high and not high.isdigit() or high and int(high) < int(low):
            raise ValueError(f'{path}: ranks = "{text}" is not a list of ranks and ranges, e.g. ranks = "0-3,7"')
        ranks.update(range(int(low), int(high or low) + 1))
    return frozenset(ranks)


def _read_certificate(path, what: str) -> tuple[bytes, bytes | None]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such {what}; make one with `gossiprl keys generate DIR`")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, UnicodeDecodeError):
        public = None
    if public is None:
        raise ValueError(
            f"{path} is not a ZeroMQ CURVE certificate (expected a 'public-key = \"...\"' line "
            "as written by `gossiprl keys generate`)"
        )
    _check_z85(path, public)
    return public, secret


def _check_z85(path, key: bytes) -> None:
    try:
        ok = len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError, struct.error):
        ok = False
    if not ok:
        raise ValueError(
            f"{path}: malformed CURVE key (expected 40 Z85 characters as written by `gossiprl keys generate`)"
        )


# ------------------------------------------------------------------ binding rule

ENDPOINT_TRANSPORTS = ("tcp", "ipc", "inproc")
"""The transports a broker binds and an agent connects over (inproc only within one process)."""


def check_endpoint(endpoint: str) -> str:
    """Return ``endpoint`` if ZeroMQ can bind or connect it, else raise ValueError saying what is valid.

    ZeroMQ's own error for a malformed endpoint is a bare "Invalid argument", and the loopback
    rule below would otherwise answer a bare port (``5559``) with "not a loopback address",
    which sends the user after keys instead of after the typo.
    """
    transport, sep, rest = endpoint.partition("://")
    port = rest.rpartition(":")[2] if transport == "tcp" else ""
    valid = (
        sep
        and transport in ENDPOINT_TRANSPORTS
        and rest
        and (
            transport != "tcp"
            or (":" in rest and rest.rpartition(":")[0] and (port == "*" or (port.isdigit() and int(port) <= 65535)))
        )
    )
    if not valid:
        bare = endpoint.rpartition("://")[2]
        host, _, port = bare.rpartition(":") if ":" in bare else ("127.0.0.1", "", bare)
        port = port if port.isdigit() and int(port) <= 65535 else "5555"
        raise ValueError(
            f"{endpoint or repr(endpoint)} is not a ZeroMQ endpoint: give tcp://HOST:PORT or "
            f"ipc://PATH, e.g. tcp://{host or '127.0.0.1'}:{port}"
        )
    return endpoint


def is_loopback(endpoint: str) -> bool:
    """Whether only this host can reach ``endpoint``: tcp on 127.0.0.0/8, ::1 or localhost, ipc, inproc.

    Anything else (0.0.0.0, ``*``, an interface name, a host name, another transport) counts as
    reachable from the network: when unsure, ask for keys.
    """
    transport, sep, rest = endpoint.partition("://")
    if not sep:
        return False
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp" or ":" not in rest:
        return False
    host = rest.rsplit(":", 1)[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def check_bind(endpoint: str, curve: bool, insecure: bool) -> None:
    """Refuse an unauthenticated bind that other hosts could reach, unless ``insecure`` says so."""
    check_endpoint(endpoint)
    if curve or is_loopback(endpoint):
        return
    if not insecure:
        raise ValueError(
            f"refusing to bind {endpoint} without authentication: it is not a loopback address. "
            f"To secure it, {HOW_TO_MAKE_KEYS}; or pass --insecure (insecure=True) "
            "to bind anyway on a network you trust."
        )
    log.warning(
        "broker binds %s WITHOUT authentication (--insecure): anyone who can reach it can register "
        "a rank and publish parameters into the swarm",
        endpoint,
    )


# ------------------------------------------------------------------ broker side


class _AllowList:
    """The ZAP credentials callback: admit a client key only if it is on the list."""

    def __init__(self, allowed: frozenset[bytes]):
        self.allowed = allowed
        self._refused: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed:
            return True
        if key not in self._refused and len(self._refused) < 1024:  # once per key: refused peers retry ~10x/s
            self._refused.add(key)
            log.warning(
                "broker: refused a CURVE handshake from a key not in the allow directory: %s",
                key.decode("ascii", "replace"),
            )
        return False


class CurveServer:
    """A CURVE-server ROUTER's keys plus the ZAP handler that checks its clients.

    ZeroMQ allows one ZAP handler per context, so unless a context is given the server gets a
    private one (``context``), and ``close()`` stops the handler and destroys that context. The
    socket is set to fail closed (ZAP_ENFORCE_DOMAIN): without a running handler, CURVE would
    otherwise admit any client key.
    """

    def __init__(self, secret_file, allow_dir, context: zmq.Context | None = None):
        from zmq.auth.thread import ThreadAuthenticator

        self.public, self._secret = load_secret(secret_file)
        if isinstance(allow_dir, frozenset):  # the keys themselves (a letter server admits its own swarm's)
            self.allowed, self.grants = allow_dir, {}
        else:
            self.allowed, self.grants = load_allowed(allow_dir), load_grants(allow_dir)
        self._own_context = context is None
        self.context = zmq.Context() if context is None else context
        self._auth = ThreadAuthenticator(self.context, log=logging.getLogger("gossiprl.comms.keys.zap"))
        try:
            self._auth.start()
            self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_AllowList(self.allowed))
        except BaseException:
            self.close()
            raise

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server guarded by this handler; call before bind."""
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._secret)

    def close(self) -> None:
        """Stop the ZAP handler; destroy the private context. Call after the server socket is closed."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._own_context and not self.context.closed:
            self.context.destroy(linger=0)


# ------------------------------------------------------------------ agent side


def client_options(secret_file, broker_public_file) -> dict[int, bytes]:
    """The socket options that make a DEALER a CURVE client of one broker, loaded (and checked) once."""
    public, secret = load_secret(secret_file)
    return {
        zmq.CURVE_PUBLICKEY: public,
        zmq.CURVE_SECRETKEY: secret,
        zmq.CURVE_SERVERKEY: load_public(broker_public_file),
    }


_WATCHED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class HandshakeWatch:
    """Why a client hears nothing: ZeroMQ drops a refused handshake without telling the socket's user.

    A monitor on the client's socket records the handshake events; ``diagnose()`` turns them
    into one line for the BrokerUnavailable error, or None when they explain nothing (the
    broker is down, unreachable, or never answered a connection).
    """

    def __init__(self, sock: zmq.Socket, curve: bool):
        self.curve = curve
        self._sock = sock
        # pyzmq's default monitor endpoint is named by the socket's fd, which the OS reuses at
        # once while ZeroMQ may still hold a closed socket's endpoint: "Address already in use".
        self._monitor = sock.get_monitor_socket(_WATCHED, addr=f"inproc://gossiprl-monitor-{uuid.uuid4().hex}")
        self._seen: set[tuple[int, int]] = set()

    def _drain(self) -> None:
        while self._monitor is not None and self._monitor.poll(0):
            frames = self._monitor.recv_multipart()
            if len(frames) == 2 and len(frames[0]) == 6:
                self._seen.add(struct.unpack("=Hi", frames[0]))

    def diagnose(self) -> str | None:
        self._drain()
        events = {event for event, _ in self._seen}
        if zmq.EVENT_HANDSHAKE_SUCCEEDED in events:
            return None
        if (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) in self._seen:
            return "the broker refused the handshake: its security mechanism differs from this agent's; " + (
                "it does not use CURVE, so drop this agent's keys"
                if self.curve
                else "it requires CURVE keys: give this agent --curve-secret and --curve-broker "
                "(GossipClient(curve=(secret_file, broker_public_file)))"
            )
        if zmq.EVENT_HANDSHAKE_FAILED_AUTH in events:
            return (
                "the broker refused this agent's CURVE key: its public key (NAME.key) is not in the "
                "broker's --curve-allow directory"
            )
        failed = {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL} & events
        if failed or {zmq.EVENT_CONNECTED, zmq.EVENT_DISCONNECTED} <= events:
            return "the broker closed the connection during the handshake: " + (
                "is --curve-broker the public key of this broker?"
                if self.curve
                else "it may require CURVE keys (--curve-secret and --curve-broker)"
            )
        return None

    def close(self) -> None:
        if self._monitor is None:
            return
        if not self._sock.closed:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
        self._monitor.close(linger=0)
        self._monitor = None
