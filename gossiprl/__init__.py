"""gossiprl: a ZeroMQ message-passing runtime for gossip-based distributed deep RL.

The package is laid out by layer, each importing only from the ones before it:
``topologies`` (a package of its own: mixing matrices) -> ``gossiprl.comms`` (wire format, turn
locks, broker, client, data planes, mixing; numpy + pyzmq only) -> ``gossiprl.rl`` (A2C agents,
envs, models, policies; torch + gymnasium) -> ``launch``, ``cli``, ``config``, ``monitor``,
``draw`` and ``bench`` on top. The comms API is importable without torch or gymnasium::

    from gossiprl import Broker, GossipClient, mix

``load_policy`` (the RL half) is imported on first use, so ``import gossiprl`` still works
on the comms-only install.
"""

from .comms import (
    PROTOCOL_VERSION,
    Broker,
    BrokerUnavailable,
    Gossip,
    GossipClient,
    GossipError,
    GossipStopped,
    GossipTimeout,
    MixResult,
    PublishResult,
    WireError,
    load_tensors,
    mix,
)

__version__ = "0.1.0"

__all__ = [
    "Broker",
    "GossipClient",
    "Gossip",
    "mix",
    "load_tensors",
    "MixResult",
    "PublishResult",
    "WireError",
    "GossipError",
    "BrokerUnavailable",
    "GossipStopped",
    "GossipTimeout",
    "PROTOCOL_VERSION",
    "__version__",
    "load_policy",
]


def __getattr__(name: str):
    if name == "load_policy":
        from .rl.policy import load_policy

        return load_policy
    raise AttributeError(f"module 'gossiprl' has no attribute {name!r}")
