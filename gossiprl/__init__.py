"""gossiprl: a ZeroMQ message-passing runtime for gossip-based distributed deep RL.

The comms layer is importable without torch or gymnasium::

    from gossiprl import Broker, GossipClient, mix

``load_policy`` (the RL half) is imported on first use, so ``import gossiprl`` still works
on the comms-only install.
"""
from .broker import Broker
from .client import BrokerUnavailable, GossipClient, GossipError, GossipTimeout, PublishResult
from .gossip import Gossip, MixResult, load_tensors, mix
from .wire import PROTOCOL_VERSION, WireError

__version__ = "0.1.0"

__all__ = ["Broker", "GossipClient", "Gossip", "mix", "load_tensors", "MixResult", "PublishResult",
           "WireError", "GossipError", "BrokerUnavailable", "GossipTimeout", "PROTOCOL_VERSION", "__version__",
           "load_policy"]


def __getattr__(name: str):
    if name == "load_policy":
        from .policy import load_policy

        return load_policy
    raise AttributeError(f"module 'gossiprl' has no attribute {name!r}")
