"""One agent of a swarm, whoever started it: ``run_agent`` connects to the broker, wraps the
client in the gossip hook and trains.

It is the one entry point of both roles: `gossiprl agent` (the PALA layout: the broker runs
elsewhere, and this agent may start before it) calls it in its own process, and `gossiprl run`
(``launch``) in each agent process it starts beside its broker.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

from .comms.client import BrokerUnavailable, GossipClient, GossipError, GossipStopped
from .comms.gossip import Gossip
from .comms.settings import CONNECT_TIMEOUT_S, GOSSIP_TIMEOUT_S
from .hosts import RunError, agents_sharing_host
from .rl.settings import host_cores, thread_plan

NO_EPISODE = "n/a (no episode finished yet)"


def format_return(value: float | None) -> str:
    """A mean return for a person to read: Atari episodes last minutes, and until the first one
    ends there is no return to show; 'nan' there reads like a diverged run."""
    return NO_EPISODE if value is None or math.isnan(value) else f"{value:.1f}"


def run_agent(
    address: str | None,
    rank: int,
    agent_cfg,
    run_dir: Path,
    resume: bool = False,
    gossip_timeout: float = GOSSIP_TIMEOUT_S,
    codec: str = "raw",
    stop=None,
    connect_timeout: float | None = CONNECT_TIMEOUT_S,
    echo=print,
    progress_every: float = 10.0,
    size_from_swarm: bool = False,
    progress=None,
    **client_options,
) -> dict:
    """Train agent ``rank``, gossiping through the broker at ``address`` (None: alone, no gossip).

    Agents of a batch job may start before their broker, so registration is retried for
    ``connect_timeout`` seconds, or until ``stop`` is set (Ctrl-C, SIGTERM: each try lasts one
    liveness window, 3 s by default); a refusal that would only repeat (a rank the swarm does not
    have, a CURVE key the broker does not admit) ends it at once with the broker's reason.
    ``connect_timeout=None`` tries once and raises the client's own error: a launcher that
    started the broker first has nothing to wait for. ``resume`` continues from this rank's
    checkpoint, or from the neighbours' parameters when there is none, and takes the rank over
    from a registration the broker may still hold for this agent's previous, dead process.
    ``progress`` gets the training loop's reports; without it, every ``progress_every`` seconds
    (0: never) a progress line is printed, as ``run``'s bar does for a swarm on one host.
    ``size_from_swarm`` (nobody said how many agents share this host) sizes torch threads by
    ``agents_sharing_host``, and says so. ``client_options`` go to ``GossipClient``."""
    from .rl.agent import train

    if agent_cfg.algo == "impala":  # the other learners ignore IMPALA's section, a stray --actors-bind with it
        impala = agent_cfg.impala  # this rank's port for actors from elsewhere, not the one its neighbours bind
        agent_cfg = replace(agent_cfg, impala=replace(impala, actors_bind=impala.actors_endpoint(rank)))
    gossip = None
    if address is not None:
        options = {"timeout": gossip_timeout, "codec": codec, "takeover": resume, "stop": stop, **client_options}
        client = connect(address, rank, options, connect_timeout, stop, echo)
        if size_from_swarm:
            agent_cfg = share_host(agent_cfg, rank, agents_sharing_host(address, client.topology.n), echo)
        gossip = Gossip(
            client,
            aggregate=agent_cfg.aggregate,
            deviation_bound=agent_cfg.deviation_bound,
            overlap=agent_cfg.gossip_overlap,
        )
    if progress is None and progress_every:
        progress = _progress_line(rank, echo, progress_every)
    try:
        return train(agent_cfg, run_dir, rank=rank, gossip=gossip, resume=resume, stop=stop, progress=progress)
    finally:
        if gossip is not None:
            gossip.close()


def connect(address: str, rank: int, options: dict, connect_timeout: float | None, stop, echo) -> GossipClient:
    """Register ``rank`` with the broker at ``address``, trying again until ``connect_timeout``."""
    deadline = None if connect_timeout is None else time.monotonic() + connect_timeout
    while True:
        try:
            return GossipClient(address, rank, **options)
        except GossipStopped:
            raise RunError(f"agent-{rank}: stopped while waiting for the broker at {address}") from None
        except (GossipError, BrokerUnavailable) as err:
            if deadline is None:  # one try: the client's own error, as it is
                raise
            if isinstance(err, GossipError):  # a rank the swarm does not have, a mismatching topology
                raise RunError(f"agent-{rank}: the broker at {address} refused it: {err}") from None
            if "the broker refused" in str(err):  # a key or mechanism it will refuse every time
                raise RunError(f"agent-{rank}: {err}; not retrying") from None
            if stop is not None and stop.is_set():
                raise RunError(f"agent-{rank}: stopped while waiting for the broker at {address}") from None
            if time.monotonic() > deadline:
                raise RunError(f"no broker answered at {address} within {connect_timeout:g}s: {err}") from None
            echo(f"agent-{rank}: waiting for the broker ({err})")


def share_host(agent_cfg, rank: int, sharing: int | None, echo):
    """``agent_cfg`` sized for ``sharing`` agents on this host, unless --torch-threads fixed its threads."""
    if sharing is None or agent_cfg.torch_threads:
        return agent_cfg
    agent_cfg = replace(agent_cfg, agents_per_host=sharing)
    echo(
        f"agent-{rank}: the broker is on this host, so its {sharing} agents may share this host's "
        f"{host_cores()} core(s): {thread_plan(agent_cfg)['env']} env thread(s) each; pass --agents-per-host N "
        "to size it yourself"
    )
    return agent_cfg


def _progress_line(rank: int, echo, every_s: float):
    """A report callback printing frames, frames/s since the last line, the mean of the last 100
    returns and the share of time in gossip. Frames count over a resume, so the rate is taken
    between two reports rather than from the session's start."""
    returns: deque = deque(maxlen=100)
    last: dict = {}

    def report(r: dict) -> None:
        returns.extend(r["returns"])
        if not last:
            last.update(r)
            return
        if r["wall_s"] - last["wall_s"] < every_s:
            return
        fps = (r["frames"] - last["frames"]) / (r["wall_s"] - last["wall_s"])
        last.update(r)
        mean = format_return(sum(returns) / len(returns) if returns else None)
        echo(
            f"agent-{rank}: {r['frames']:,} frames, {fps:,.0f} frames/s, return {mean}, "
            f"gossip {100 * r['gossip_s'] / max(r['wall_s'], 1e-9):.0f}%"
        )

    return report
