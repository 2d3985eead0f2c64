"""Where an agent process stands on its host: which rank a batch launcher gave it, how many agents
share the host, and how hard a swarm presses on the host's cores (``HostLoad``).

Apart from the launchers because both roles ask: `gossiprl agent` reads its rank and its host's
share from Slurm, torchrun or MPI, and `gossiprl run` stretches its timeouts when it starts more
agents than there are cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .comms import keys
from .comms.settings import PEER_TIMEOUT_S

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
"""torchrun's RANK comes before Slurm's: under `srun torchrun` every process torchrun starts on a
node inherits that node's one SLURM_PROCID, while RANK is each process's own."""

LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
"""How many processes the launcher starts per host (torchrun, Slurm, Open MPI, MPICH), in the same
precedence as RANK_VARIABLES."""

LOCAL_HEARTBEAT_S = 0.25
"""Heartbeat of agents that share a host with their broker: pings are cheap on one host, so they
come often and a parked agent hears at once that its turn came or its neighbour left."""

LOCAL_BROKER_GRACE_S = 10.0
"""Silence shorter than this never makes an agent take its launcher's broker for gone (the
client's ``broker_grace``). The broker is a thread of the launcher's process and pauses whenever
that process does: a garbage collection of a test runner's heap took 0.44 s here, and under load
it passed the 0.75 s that 3 local heartbeats allowed, failing every agent of a run at
registration. A launcher that dies is noticed at once through its pipe, which sets the agents'
stop, and a wait on the broker ends at the next heartbeat."""

MAX_HEARTBEAT_S = 10.0
"""The stretched heartbeat's ceiling: a broker that really died is still noticed within 30 s."""

AGENT_MEMORY_MB = 130
"""Resident memory of one CartPole agent process (torch, gymnasium, the model): 100 agents took
12.5 GB. Atari agents take more."""


class RunError(RuntimeError):
    """A run that cannot start as asked; the message says why and what to do instead."""


def rank_from_environment(explicit: int | None) -> int:
    """--rank, else the launcher's variable (Slurm, torchrun, Open MPI, MPICH)."""
    if explicit is not None:
        return explicit
    for name in RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise RunError(f"no --rank given and none of {', '.join(RANK_VARIABLES)} is set")


def agents_per_host_from_environment(explicit: int | None) -> int:
    """--agents-per-host, else the launcher's processes per host, else 1.

    Each agent takes cores / agents-per-host torch threads, so a launcher that starts several
    agents on a host must be counted, or they all take every core and slow each other down."""
    return local_size_from_environment(explicit) or 1


def local_size_from_environment(explicit: int | None) -> int | None:
    """--agents-per-host, else the launcher's processes per host, else None: nobody said."""
    if explicit is not None:
        return explicit
    for name in LOCAL_SIZE_VARIABLES:
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return None


def agents_sharing_host(address: str, swarm_size: int) -> int | None:
    """How many agents to size torch threads for when nobody said: the whole swarm when the
    broker is reached over loopback (or ipc), else None (unknown: one agent per host).

    A broker on loopback runs on this host, and agents that reach it that way do too: the
    README's one-host example (100k frames per agent, 2 cores) took 80.0 s instead of 11.0 s with
    each of its two agents taking every core."""
    return swarm_size if swarm_size > 1 and keys.is_loopback(address) else None


@dataclass
class HostLoad:
    """How hard a swarm of ``agents`` processes presses on ``cores``, and the timeouts that allow for it.

    With more agents than cores each agent gets ``cores / agents`` of a core, so everything it
    does (starting up, one update, answering a ping) takes ``oversubscription`` times longer;
    with the one-core timeouts, starving agents were declared gone and rejoined over and over
    (100 agents on 2 cores: load 80, exit 1). Heartbeat and timeouts stretch by that factor."""

    agents: int
    cores: int

    @property
    def oversubscription(self) -> float:
        return max(1.0, self.agents / max(1, self.cores))

    @property
    def heartbeat(self) -> float:
        return min(LOCAL_HEARTBEAT_S * self.oversubscription, MAX_HEARTBEAT_S)

    @property
    def peer_timeout(self) -> float:
        return PEER_TIMEOUT_S * self.oversubscription

    def gossip_timeout(self, asked: float) -> float:
        return asked * self.oversubscription

    def warning(self) -> str | None:
        """What to expect and what to do, when there are more agents than cores; None otherwise."""
        if self.agents <= self.cores:
            return None
        x = self.oversubscription
        return (
            f"warning: {self.agents} agents on {self.cores} core(s): each gets {1 / x:.2g} of a core, so expect "
            f"every agent to run ~{x:.3g}x slower than alone, a slow start and about "
            f"{self.agents * AGENT_MEMORY_MB / 1000:.1f} GB of memory in all; heartbeat {self.heartbeat:.2g}s and "
            f"peer timeout {self.peer_timeout:.0f}s are stretched {x:.3g}x so starving agents are not declared "
            f"gone. For speed, run at most {self.cores} agent(s) here or spread the swarm over hosts "
            f"(gossiprl broker + gossiprl agent)."
        )
