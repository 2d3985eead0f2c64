"""The comms layer: topologies' mixing matrices carried between agents over ZeroMQ.

Everything in this package needs only pyzmq, msgpack and numpy, so a broker host needs no RL
stack: ``wire`` (the message format, no sockets) -> ``turnlocks`` (the locks as a state machine)
and ``registry`` (who holds which rank), both with no sockets and no clock -> ``broker`` /
``client`` (the ROUTER poll loop and the DEALER API) and ``dataplane`` (where the bytes travel)
-> ``gossip`` (mixing letters into parameters). ``tensors`` is the one module that knows torch
tensors, and it never imports torch itself.
"""

from .broker import Broker
from .client import BrokerUnavailable, GossipClient, GossipError, GossipStopped, GossipTimeout, PublishResult
from .gossip import Gossip, MixError, MixResult, load_tensors, mix
from .wire import PROTOCOL_VERSION, WireError

__all__ = [
    "Broker",
    "GossipClient",
    "Gossip",
    "mix",
    "load_tensors",
    "MixResult",
    "MixError",
    "PublishResult",
    "WireError",
    "GossipError",
    "BrokerUnavailable",
    "GossipStopped",
    "GossipTimeout",
    "PROTOCOL_VERSION",
]
