"""gossiprl: a ZeroMQ message-passing runtime for gossip-based distributed deep RL.

The comms layer is importable without torch or gymnasium::

    from gossiprl import Broker, GossipClient, mix
"""
from .broker import Broker
from .client import BrokerUnavailable, GossipClient, GossipError, GossipTimeout, PublishResult
from .gossip import Gossip, MixResult, load_tensors, mix
from .wire import PROTOCOL_VERSION, WireError

__version__ = "0.1.0"

__all__ = ["Broker", "GossipClient", "Gossip", "mix", "load_tensors", "MixResult", "PublishResult",
           "WireError", "GossipError", "BrokerUnavailable", "GossipTimeout", "PROTOCOL_VERSION", "__version__"]
