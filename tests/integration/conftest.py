"""Fixtures only the integration tests use: they start brokers on real sockets."""

import pytest

import topologies
from brokers import close_broker, new_broker


@pytest.fixture
def ring2():
    """A started two-agent ring broker on tcp://127.0.0.1:0; closing it must not hang."""
    broker = new_broker(topologies.make("ring", 2))
    yield broker
    assert close_broker(broker), "broker.close() hung"
