"""What a new user reads: endpoint errors that say what is valid, progress and end lines without nan."""
import pytest
from click.testing import CliRunner

import topologies
from gossiprl.cli import main
from gossiprl.comms import keys
from gossiprl.comms.broker import Broker
from gossiprl.comms.client import GossipClient


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("endpoint, example", [
    ("5559", "tcp://127.0.0.1:5559"), ("localhost:5559", "tcp://localhost:5559"),
    ("tcp://127.0.0.1", "tcp://127.0.0.1:5555"), ("tcp://127.0.0.1:70000", "tcp://127.0.0.1:5555"),
    ("udp://10.0.0.1:5555", "tcp://10.0.0.1:5555"), ("ipc://", "tcp://127.0.0.1:5555"),
])
def test_a_malformed_endpoint_is_named_with_what_is_valid(endpoint, example):
    with pytest.raises(ValueError) as err:
        keys.check_endpoint(endpoint)
    assert str(err.value) == (f"{endpoint} is not a ZeroMQ endpoint: give tcp://HOST:PORT or ipc://PATH, "
                              f"e.g. {example}")


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5555", "tcp://*:0", "tcp://[::1]:5555", "tcp://eth0:*",
                                      "ipc:///tmp/broker", "inproc://broker"])
def test_valid_endpoints_pass(endpoint):
    assert keys.check_endpoint(endpoint) == endpoint


def test_broker_bind_that_is_no_endpoint_is_not_called_a_non_loopback_address():
    result = invoke("broker", "--bind", "5559", "--agents", 2)
    assert result.exit_code == 2
    assert "5559 is not a ZeroMQ endpoint: give tcp://HOST:PORT or ipc://PATH, e.g. tcp://127.0.0.1:5559" \
        in result.output
    assert "loopback" not in result.output
    with pytest.raises(ValueError, match="not a ZeroMQ endpoint"):
        Broker(topologies.make("ring", 2), bind="5559")


def test_agent_connect_that_is_no_endpoint_gets_one_line():
    result = invoke("agent", "--connect", "5559", "--rank", 0)
    assert result.exit_code == 2
    assert "5559 is not a ZeroMQ endpoint" in result.output and "Traceback" not in result.output
    with pytest.raises(ValueError, match="not a ZeroMQ endpoint"):
        GossipClient("5559", 0)
