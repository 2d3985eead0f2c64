"""CurveZMQ on a real broker: the right key gets in, no key or an unknown key never reaches the
broker's logic; a public bind needs keys or --insecure; nothing received is unpickled, evaluated
or imported anywhere in the package."""

import ast
import logging
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

import topologies
from gossiprl import Broker, BrokerUnavailable, GossipClient
from gossiprl.comms import keys, wire
from helpers import REPO_ROOT, invoke

FAST = {"heartbeat": 0.2, "liveness": 2}  # a refused agent gives up after 0.4 s


@pytest.fixture(scope="module")
def keyring(tmp_path_factory):
    """broker/ holds the broker's pair, agents/ the admitted agents', outsiders/ a pair nobody admits."""
    root = tmp_path_factory.mktemp("keys")
    keys.generate(root / "broker", "broker")
    for name in ("agent-0", "agent-1"):
        keys.generate(root / "agents", name)
    keys.generate(root / "outsiders", "intruder")
    return root


def agent_curve(keyring, name="agent-0", broker_key="broker/broker.key"):
    return (keyring / ("outsiders" if name == "intruder" else "agents") / f"{name}.key_secret", keyring / broker_key)


@pytest.fixture
def secure_ring2(keyring):
    broker = Broker(
        topologies.make("ring", 2),
        "tcp://127.0.0.1:0",
        curve=(keyring / "broker" / "broker.key_secret", keyring / "agents"),
    ).start()
    yield broker
    broker.close()


def one_round(a, b, value):
    a.publish({"x": np.full(3, value)})
    b.publish({"x": np.full(3, -value)})
    return a.collect(), b.collect()


def zap_threads():
    return [t for t in threading.enumerate() if type(t).__name__ == "AuthenticationThread" and t.is_alive()]


@pytest.mark.timeout(10)
def test_agents_with_allowed_keys_publish_and_collect(keyring):
    before = len(zap_threads())
    broker = Broker(topologies.make("ring", 2), curve=(keyring / "broker/broker.key_secret", keyring / "agents"))
    broker.start()
    a = GossipClient(broker.address, 0, curve=agent_curve(keyring, "agent-0"))
    b = GossipClient(broker.address, 1, curve=agent_curve(keyring, "agent-1"))
    for value in (1.0, 2.0):
        got_a, got_b = one_round(a, b, value)
        np.testing.assert_array_equal(got_a[1]["x"], np.full(3, -value))
        np.testing.assert_array_equal(got_b[0]["x"], np.full(3, value))
    a.close(), b.close()
    assert broker.stats()["agents"][0]["publishes"] == 2
    broker.close()
    assert len(zap_threads()) == before, "close() must stop the ZAP handler thread"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "who, words",
    [
        ("no keys", "may require CURVE keys|requires CURVE keys"),
        ("key not allowed", "not in the broker's --curve-allow directory"),
        ("wrong broker key", "is --curve-broker the public key of this broker"),
    ],
    ids=["no-keys", "key-not-allowed", "wrong-broker-key"],
)
def test_refused_agent_never_reaches_the_broker_and_the_swarm_goes_on(secure_ring2, keyring, who, words):
    curve = {
        "no keys": None,
        "key not allowed": agent_curve(keyring, "intruder"),
        "wrong broker key": agent_curve(keyring, "agent-1", broker_key="outsiders/intruder.key"),
    }[who]
    good0 = GossipClient(secure_ring2.address, 0, curve=agent_curve(keyring, "agent-0"))
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=words):
        GossipClient(secure_ring2.address, 1, curve=curve, **FAST)  # rank 1 is free: only the key stops it
    assert time.monotonic() - t0 < 3

    # the same peer on a raw socket: a PUBLISH and a COLLECT that would each earn an ERROR reply
    # (not-registered) if they reached the broker's logic, get nothing at all
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.linger = 0
    for option, value in (keys.client_options(*curve) if curve else {}).items():
        raw.setsockopt(option, value)
    raw.connect(secure_ring2.address)
    raw.send_multipart(
        wire.encode(
            wire.PUBLISH,
            {"seq": 1, "round": 0, "tensors": [{"name": "x", "dtype": "float32", "shape": [3], "nbytes": 12}]},
            [np.zeros(3, np.float32)],
        )
    )
    raw.send_multipart(wire.encode(wire.COLLECT, {"seq": 2, "round": 0}))
    assert not raw.poll(500), "a refused peer must hear nothing"
    raw.close()
    stats = secure_ring2.stats()
    assert stats["errors"] == {}, "nothing from the refused peer may reach the broker's message handling"
    assert stats["agents"][1]["registrations"] == 0
    assert all(a["publishes"] == 0 and a["collects"] == 0 for a in stats["agents"].values())

    good1 = GossipClient(secure_ring2.address, 1, curve=agent_curve(keyring, "agent-1"))
    got0, got1 = one_round(good0, good1, 5.0)
    assert got0[1]["x"][0] == -5.0 and got1[0]["x"][0] == 5.0
    good0.close(), good1.close()


@pytest.mark.timeout(10)
def test_cli_refuses_a_public_bind_without_keys_and_says_how_to_make_them():
    result = invoke("broker", "--bind", "tcp://0.0.0.0:0", "--agents", 2)
    assert result.exit_code == 1
    assert "gossiprl keys generate" in result.output and "--insecure" in result.output
    assert "--curve-secret" in result.output and "--curve-allow" in result.output
    with pytest.raises(ValueError, match="gossiprl keys generate"):
        Broker(topologies.make("ring", 2), "tcp://0.0.0.0:0")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bind", ["tcp://127.0.0.1:0", "tcp://localhost:0", "tcp://[::1]:0"])
def test_cli_refuses_a_keyless_loopback_tcp_bind_without_insecure(bind):
    """Issue 19 B6: an unprivileged local user took over a rank of a keyless loopback broker and got
    1e30 mixed in (and 12 x 256 MiB frames from a stranger's socket took the broker to 6.2 GB)."""
    result = invoke("broker", "--bind", bind, "--agents", 2)
    assert result.exit_code == 2, result.output
    for words in ("every user of this host", "ipc://", "gossiprl keys generate", "--insecure"):
        assert words in result.output, result.output


@pytest.mark.timeout(10)
def test_insecure_public_bind_starts_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="gossiprl.comms.keys"):
        broker = Broker(topologies.make("ring", 2), "tcp://0.0.0.0:0", insecure=True)
    broker.close()
    assert broker.address.startswith("tcp://0.0.0.0:")
    assert "WITHOUT authentication" in caplog.text


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "endpoint, loopback",
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.3.2.1:0", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("tcp://[::ffff:127.0.0.1]:5555", True),
        ("ipc:///tmp/broker", True),
        ("inproc://broker", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://10.0.0.5:5555", False),
        ("tcp://[::]:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://node001:5555", False),
        ("ws://127.0.0.1:5555", False),
        ("127.0.0.1:5555", False),
    ],
)
def test_only_loopback_endpoints_count_as_loopback(endpoint, loopback):
    assert keys.is_loopback(endpoint) is loopback


@pytest.mark.timeout(10)
def test_keys_generate_writes_a_private_secret_and_never_overwrites(tmp_path):
    target = tmp_path / "keys"
    result = invoke("keys", "generate", target, "--name", "broker", "--name", "agent-0")
    assert result.exit_code == 0, result.output
    for name in ("broker", "agent-0"):
        assert stat.S_IMODE((target / f"{name}.key_secret").stat().st_mode) == 0o600
        assert stat.S_IMODE((target / f"{name}.key").stat().st_mode) == 0o644
        public, secret = keys.load_secret(target / f"{name}.key_secret")
        assert keys.load_public(target / f"{name}.key") == public and len(secret) == 40
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert sorted(p.name for p in target.iterdir()) == [
        "agent-0.key",
        "agent-0.key_secret",
        "broker.key",
        "broker.key_secret",
    ]
    before = (target / "broker.key_secret").read_bytes()
    again = invoke("keys", "generate", target, "--name", "broker")
    assert again.exit_code == 1 and "already exists" in again.output
    assert (target / "broker.key_secret").read_bytes() == before


@pytest.mark.timeout(10)
def test_missing_or_malformed_keys_get_one_line_errors(tmp_path, keyring):
    bad = tmp_path / "bad.key_secret"
    bad.write_text('curve\n    public-key = "tooshort"\n    secret-key = "x"\n')
    with pytest.raises(FileNotFoundError, match="gossiprl keys generate"):
        keys.load_secret(tmp_path / "missing.key_secret")
    with pytest.raises(ValueError, match="malformed CURVE key"):
        keys.load_secret(bad)
    with pytest.raises(ValueError, match="holds only a public key"):
        keys.load_secret(keyring / "broker" / "broker.key")
    (tmp_path / "hello.key").write_text("hello\n")
    with pytest.raises(ValueError, match="not a ZeroMQ CURVE certificate"):
        keys.load_public(tmp_path / "hello.key")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no \*\.key"):
        keys.load_allowed(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        keys.load_allowed(tmp_path / "missing")

    result = invoke("broker", "--curve-secret", bad, "--curve-allow", keyring / "agents", "--agents", 2)
    assert result.exit_code == 1 and "malformed CURVE key" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = invoke("broker", "--curve-secret", keyring / "broker/broker.key_secret", "--agents", 2)
    assert result.exit_code == 2 and "--curve-allow" in result.output
    result = invoke(
        "agent",
        "--connect",
        "tcp://127.0.0.1:1",
        "--rank",
        0,
        "--curve-secret",
        bad,
        "--curve-broker",
        keyring / "broker/broker.key",
    )
    assert result.exit_code == 1 and "malformed CURVE key" in result.output


@pytest.mark.timeout(10)
@pytest.mark.parametrize("mode", [0o640, 0o604, 0o666])
def test_a_secret_key_other_users_can_read_is_refused_with_the_fix(tmp_path, mode):
    public, secret = keys.generate(tmp_path / "k", "agent")
    secret.chmod(mode)
    with pytest.raises(PermissionError, match=rf"{secret} is open to other users.*chmod 600 {secret}"):
        keys.load_secret(secret)
    result = invoke(
        "agent", "--connect", "tcp://127.0.0.1:1", "--rank", 0, "--curve-secret", secret, "--curve-broker", public
    )
    assert result.exit_code == 1 and "chmod 600" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.timeout(10)
@pytest.mark.parametrize("what", ["directory", "key file"])
def test_an_allow_directory_others_can_write_is_refused_with_the_fix(tmp_path, keyring, what):
    allow = tmp_path / "allow"
    allow.mkdir(mode=0o755)
    shutil.copy(keyring / "agents" / "agent-0.key", allow / "agent-0.key")
    (allow / "agent-0.key").chmod(0o644)
    target = allow if what == "directory" else allow / "agent-0.key"
    target.chmod(0o777 if what == "directory" else 0o666)
    with pytest.raises(PermissionError, match=rf"{target} is writable by other users.*chmod go-w {target}"):
        keys.load_allowed(allow)
    result = invoke(
        "broker", "--curve-secret", keyring / "broker/broker.key_secret", "--curve-allow", allow, "--agents", 2
    )
    assert result.exit_code == 1 and "chmod go-w" in result.output
    target.chmod(0o755 if what == "directory" else 0o644)
    assert len(keys.load_allowed(allow)) == 1


@pytest.mark.timeout(30)
def test_an_agent_the_broker_refuses_stops_retrying_and_says_why(secure_ring2, keyring, tmp_path):
    from gossiprl.launch import RunError, run_agent
    from gossiprl.rl.agent import AgentConfig

    t0 = time.monotonic()
    with pytest.raises(RunError, match="not in the broker's --curve-allow directory; not retrying"):
        run_agent(
            secure_ring2.address,
            0,
            AgentConfig(total_frames=80),
            tmp_path,
            connect_timeout=60,
            curve=agent_curve(keyring, "intruder"),
            echo=lambda line: None,
        )
    assert time.monotonic() - t0 < 15  # one liveness window, not the 60 s connect timeout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_local_swarm_is_closed_to_other_users_of_the_host(tmp_path, transport):
    """`gossiprl run`'s broker: an ipc socket in a 0700 directory, or tcp loopback with throwaway keys."""
    from gossiprl.launch import private_endpoint

    private = Path(tempfile.mkdtemp(dir=tmp_path))
    bind, broker_curve, agent_curve = private_endpoint(private, transport)
    with Broker(topologies.make("ring", 2), bind, curve=broker_curve).start() as broker:
        member = GossipClient(broker.address, 0, curve=agent_curve)
        if transport == "ipc":
            socket_dir = Path(broker.address.removeprefix("ipc://")).parent
            assert socket_dir == private and stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
        else:
            assert broker_curve is not None
            for path in (private / "broker", private / "agents"):
                assert stat.S_IMODE(path.stat().st_mode) == 0o700
            with pytest.raises(BrokerUnavailable, match="may require CURVE keys|requires CURVE keys"):
                GossipClient(broker.address, 1, heartbeat=0.1, liveness=5)
        member.close()


# ------------------------------------------------------------------ nothing received is executed

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle"}
UNSAFE_BUILTINS = {"eval", "exec", "__import__", "compile"}
UNSAFE_METHODS = {"recv_pyobj", "recv_serialized", "import_module", "Unpickler"}
ALLOWED = {
    ("gossiprl/bench/comms.py", "import pickle"),
    ("gossiprl/bench/comms.py", "pickle.dumps"),
    ("gossiprl/bench/comms.py", "pickle.loads"),
    ("gossiprl/rl/envs.py", ".import_module("),
}
"""bench/comms.py measures the PALA paper's path (pickle + base64 through a Manager) between its
own processes; it is the only place allowed to touch pickle, and only to dump and load.
rl/envs.py imports the module a ``MODULE:ENV_ID`` env id names (gymnasium's convention): the id
comes from the user's command line or config, never from a socket."""


def unsafe_uses(source: str) -> list[str]:
    """Every way this source could turn bytes into code or objects: imports of pickle-like modules,
    eval/exec/compile/__import__, pyzmq's recv_pyobj, importlib, and loaders told to unpickle."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES | {"importlib"}:
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in UNSAFE_BUILTINS:
                found.append(f"{func.id}(")
            elif isinstance(func, ast.Attribute):
                owner = func.value.id if isinstance(func.value, ast.Name) else None
                if owner in UNSAFE_MODULES:
                    found.append(f"{owner}.{func.attr}")
                elif func.attr in UNSAFE_METHODS:
                    found.append(f".{func.attr}(")
                elif (
                    func.attr == "load"
                    and owner == "torch"
                    and not any(
                        k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in node.keywords
                    )
                ):
                    found.append("torch.load without weights_only=True")
            if any(
                k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                for k in node.keywords
            ):
                found.append("allow_pickle not False")
    return found


@pytest.mark.timeout(10)
def test_the_scanner_catches_each_unsafe_form():
    sample = """
import pickle, marshal
from importlib import import_module
x = pickle.loads(data); y = eval(text); exec(text); __import__(name); sock.recv_pyobj()
m = importlib.import_module(name); torch.load(path); np.load(path, allow_pickle=True)
model.eval(); re.compile("x"); torch.load(path, weights_only=True); np.load(path, allow_pickle=False)
"""
    assert sorted(unsafe_uses(sample)) == sorted(
        [
            "import pickle",
            "import marshal",
            "from importlib import ...",
            "pickle.loads",
            "eval(",
            "exec(",
            "__import__(",
            ".recv_pyobj(",
            ".import_module(",
            "torch.load without weights_only=True",
            "allow_pickle not False",
        ]
    )


@pytest.mark.timeout(10)
def test_nothing_received_is_unpickled_evaluated_or_imported():
    files = sorted((REPO_ROOT / "gossiprl").rglob("*.py")) + sorted((REPO_ROOT / "topologies").rglob("*.py"))
    assert len(files) > 10
    offending = [
        f"{path}: {use}"
        for path in (f.relative_to(REPO_ROOT).as_posix() for f in files)
        for use in unsafe_uses((REPO_ROOT / path).read_text(encoding="utf-8"))
        if (path, use) not in ALLOWED
    ]
    assert offending == []
