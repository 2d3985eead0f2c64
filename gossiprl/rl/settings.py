"""The agent's settings, the learners' (A2CConfig, PPOConfig, ImpalaConfig) and AgentConfig: plain dataclasses,
importable without torch.

They live apart from the learners (``a2c``, ``ppo``, ``impala``) and the loop (``agent``), which need torch, because
the command line is built from them (``gossiprl.config``) and must start, and print its help,
on the comms-only install. Each field's default and attribute docstring are its one
declaration: ``gossiprl run --help`` shows that docstring. ``field(metadata=...)`` carries what
a flag needs beyond the type (a range, the valid choices); ``gossiprl.config`` says which keys.

The learners' hyperparameters share one flag per name (--lr, --num-envs ...): a learner's section
of AgentConfig is named as its ``--algo``, and a name that means the same in two learners is
spelt the same in both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from gossiprl.comms import keys
from gossiprl.comms.gossip import AGGREGATES
from gossiprl.comms.settings import KEY_FILE

ACTOR_PLACEMENTS = ("process", "thread")

DEVICES = ("auto", "cpu", "cuda")


def deviation_factor(value) -> float | None:
    """The command line's --deviation-bound: 0 turns the bound off (None), else a factor > 1."""
    factor = None if value is None else float(value)
    if not factor:
        return None
    if factor <= 1:
        raise ValueError(f"{factor:g}: give a factor > 1, or 0 to turn the bound off")
    return factor


ATARI_LR = 7e-4
"""A2C's RMSProp rate for Atari with 16 envs x 5 steps (Mnih et al. 2016; GALA and PALA keep it)."""
MINATAR_LR = 4 * ATARI_LR
"""MinAtar's, 2.8e-3: at 1M frames per agent, a ring of 4 at 4x ATARI_LR ended above one agent at
that rate on both Breakout and SpaceInvaders, on seeds fixed before the test ran
(experiments.lr_confirm), and far above a ring at 2x; one agent at 4x scored above 2x on Breakout
and could not be told from it on SpaceInvaders. Measured for 1 and 4 agents only
(docs/swarm-learning.md). Runs recorded before this default (2026-11-28) learned at 2x with an
unset rate, and a resume keeps it (``gossiprl.settings.learned_with``; a lone `gossiprl agent
--resume`: its checkpoint, ``rl.agent.resume_checkpoint``)."""

PREVIOUS_MINATAR_LR = 2 * ATARI_LR
"""MinAtar's default from 2026-11-27 until MINATAR_LR: what an A2C run recorded then with an unset
rate learned at, which its resume keeps. Runs record the settings they learn with since."""


def with_unset_from(section, values: Mapping):
    """``section`` (a learner's settings) with each field it leaves to the env's default (None) taken
    from ``values`` where that holds one: what a resume fills from the run's record of what it learned
    with, so a default that moved since does not change it."""
    return replace(
        section,
        **{
            f.name: values[f.name]
            for f in fields(section)
            if getattr(section, f.name) is None and values.get(f.name) is not None
        },
    )


def meant_then(algo: str, env_id: str, section: Mapping) -> dict:
    """What the unset (None) settings of a learner section recorded before runs recorded what they
    learned with stood for, where the env's default has moved since: MinAtar's A2C rate was
    PREVIOUS_MINATAR_LR (an unset rate there dates from then: before, records held 7e-4). Every other
    unset setting is read as the env's default today. That is what it stood for but in one case no
    record tells apart: IMPALA on a control task took batches of 2 unrolls before 4 of 5 steps, when
    its records set 20 steps outright and left the batch unset, as does a later run given
    --n-steps 20; such an older run resumes at today's batch, as it did before runs recorded theirs.
    Read from the env's id alone (rl.envs' test), so the config layer can ask without the RL stack."""
    if algo == "a2c" and env_id.startswith("MinAtar/") and section.get("lr", 0) is None:
        return {"lr": PREVIOUS_MINATAR_LR}
    return {}


@dataclass
class A2CConfig:
    num_envs: int = field(default=16, metadata={"min": 1})
    """Environments stepped in lockstep by this agent's learner (the papers' actors per learner)."""
    n_steps: int = field(default=5, metadata={"min": 1})
    """Steps per env before each update; the return bootstraps from V after n_steps."""
    lr: float | None = field(default=None, metadata={"min": 0, "min_open": True})
    """RMSProp learning rate. None means 2.8e-3 on MinAtar (``MINATAR_LR``) and A2C's Atari rate,
    7e-4, elsewhere. At 2.8e-3 a ring of 4 learned more per agent frame than one agent on MinAtar
    Breakout and SpaceInvaders; no rule in the number of agents is applied (docs/swarm-learning.md)."""
    rmsprop_eps: float = field(default=1e-5, metadata={"min": 0, "min_open": True})
    """RMSProp epsilon, larger than torch's 1e-8 default as in the A2C papers, so steps stay
    bounded while the squared-gradient average is still near zero."""
    rmsprop_alpha: float = field(default=0.99, metadata={"min": 0, "max": 1})
    """RMSProp smoothing constant for the squared-gradient average."""
    entropy_coef: float | None = field(default=None, metadata={"min": 0})
    """Weight of the entropy bonus that keeps the policy from collapsing early. None means 0.01 on
    Atari and MinAtar (the papers'; with 0, one agent on MinAtar Breakout scored 6.25 after 1M
    frames, with 0.01 7.99, its policy entropy fallen to 0.05-0.1 nats of 1.10) and 0 on control
    tasks: on CartPole 0.01 keeps the sampled policy too random to average 475 (seeds 3, 4, 5 sat
    at 200-260 for 2M frames; with 0, seeds 3 and 4 solved by 0.72M), and 0 is also RL Zoo's tuned
    A2C setting for CartPole."""
    value_coef: float = field(default=0.5, metadata={"min": 0})
    """Weight of the value loss against the policy loss (one shared optimizer)."""
    gamma: float = field(default=0.99, metadata={"min": 0, "max": 1})
    """Discount factor."""
    max_grad_norm: float = field(default=0.5, metadata={"min": 0, "min_open": True})
    """Global gradient-norm clip, which keeps a lucky large return from blowing up an update."""
    clip_rewards: bool | None = None
    """Use sign(r) in the loss, as DeepMind does so one lr fits every game. None means: on
    for Atari, off otherwise. Logged episode returns are always the raw score."""


@dataclass
class PPOConfig:
    num_envs: int | None = field(default=None, metadata={"min": 1})
    """Environments stepped in lockstep by this agent. None: CleanRL's 4 on control tasks
    (ppo.py), 8 on Atari and MinAtar games (ppo_atari.py)."""
    n_steps: int = field(default=128, metadata={"min": 1})
    """Steps per env in each rollout (CleanRL's num_steps); the batch is n_steps x num_envs."""
    lr: float = field(default=2.5e-4, metadata={"min": 0, "min_open": True})
    """Adam learning rate (CleanRL's, on control tasks and Atari alike)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over this agent's --total-frames, as CleanRL does."""
    adam_eps: float = field(default=1e-5, metadata={"min": 0, "min_open": True})
    """Adam epsilon (CleanRL's 1e-5, not torch's 1e-8)."""
    gamma: float = field(default=0.99, metadata={"min": 0, "max": 1})
    """Discount factor."""
    gae_lambda: float = field(default=0.95, metadata={"min": 0, "max": 1})
    """GAE's lambda: 1 gives the n-step return's advantage, 0 the one-step TD error."""
    update_epochs: int = field(default=4, metadata={"min": 1})
    """Passes over each rollout (CleanRL's K epochs)."""
    num_minibatches: int = field(default=4, metadata={"min": 1})
    """Minibatches per epoch: each epoch shuffles the rollout and takes this many optimizer steps."""
    norm_adv: bool = True
    """Normalise the advantages within each minibatch to mean 0, standard deviation 1."""
    clip_coef: float | None = field(default=None, metadata={"min": 0, "min_open": True})
    """The surrogate's clip range on the probability ratio, also the value clip's range. None:
    CleanRL's 0.2 on control tasks (ppo.py), 0.1 on Atari and MinAtar games (ppo_atari.py)."""
    clip_vloss: bool = True
    """Clip the value loss around the rollout's values, as CleanRL (and PPO's baselines code) do."""
    entropy_coef: float = field(default=0.01, metadata={"min": 0})
    """Weight of the entropy bonus (CleanRL's 0.01 on every env)."""
    value_coef: float = field(default=0.5, metadata={"min": 0})
    """Weight of the value loss against the policy loss (one shared optimizer)."""
    max_grad_norm: float = field(default=0.5, metadata={"min": 0, "min_open": True})
    """Global gradient-norm clip of each minibatch step."""
    clip_rewards: bool | None = None
    """Use sign(r) in the loss (CleanRL's ClipRewardEnv). None means: on for Atari, off otherwise.
    Logged episode returns are always the raw score."""


@dataclass
class ImpalaConfig:
    actors_per_agent: int = field(default=2, metadata={"min": 0})
    """Actors per learner, each stepping its own --num-envs envs with the newest parameters it has
    been given (the paper's actors; one agent is one IMPALA learner). 0, with --actors-bind: only
    actors from other hosts feed the learner, which waits for the first to join."""
    actor_placement: str = field(
        default="process", metadata={"choices": ACTOR_PLACEMENTS, "may_change_on_resume": True}
    )
    """Where the actors run: 'process', each a process of its own that sends its unrolls to the
    learner over ZeroMQ (and may run on another host, with --actors-bind), or 'thread', threads of
    the learner's process handing them over through an in-process queue (docs/algorithm.md, IMPALA)."""
    actors_bind: str | None = field(default=None, metadata={"may_change_on_resume": True})
    """With --actor-placement process: the endpoint (tcp://HOST:PORT, or ipc://PATH for actors of
    this host) where actors from elsewhere join this learner with `gossiprl actor --connect`, beside
    its own --actors-per-agent (at most --queue-size of them: more could never all hold a credit at
    once); a port of * picks a free one (printed). A fixed port or a path is agent 0's: agent r
    binds PORT + r, or PATH-r, so that the learners of one host each have their own (each prints
    its endpoint). None: a private ipc:// socket for the learner's own actors only."""
    actors_curve_secret: Path | None = field(default=None, metadata={"path": KEY_FILE, "may_change_on_resume": True})
    """The learner's CURVE secret key for --actors-bind (NAME.key_secret from `gossiprl keys generate`):
    required on an address other hosts can reach."""
    actors_curve_allow: Path | None = field(
        default=None, metadata={"path": {"exists": True, "file_okay": False}, "may_change_on_resume": True}
    )
    """Directory of the public keys (*.key) of the actors this learner admits, with --actors-curve-secret."""
    num_envs: int = field(default=4, metadata={"min": 1})
    """Environments each actor steps in lockstep: one unroll is --n-steps x this many env steps."""
    n_steps: int | None = field(default=None, metadata={"min": 1})
    """Unroll length: steps per env in each trajectory an actor hands over. None: the paper's 20 on
    Atari and MinAtar games, 5 on control tasks (A2C's; docs/algorithm.md)."""
    batch_size: int | None = field(default=None, metadata={"min": 1})
    """Unrolls per update. None: 8 on Atari and MinAtar games (with 4 envs per actor, the paper's
    batch of 32 trajectories of 20 steps), 4 on control tasks, whose unrolls are 5 steps: A2C's 80
    transitions an update. On CartPole, 20-step unrolls in batches of 2 solved 4 of 8 one-agent runs
    within 500k frames (the others rose past 400, then fell back to 200-370); 5 x 4 solved 5 of 5,
    and 3 of 3 rings of 2 (docs/algorithm.md)."""
    queue_size: int | None = field(default=None, metadata={"min": 1})
    """Unrolls the trajectory queue holds; a full queue blocks the actors (back-pressure) rather
    than dropping their work, which bounds the policy lag. None: two batches."""
    lr: float = field(default=6e-4, metadata={"min": 0, "min_open": True})
    """RMSProp learning rate (the paper's Atari 6e-4), annealed linearly to 0 with --anneal-lr."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over this agent's --total-frames, as the paper does."""
    rmsprop_alpha: float = field(default=0.99, metadata={"min": 0, "max": 1})
    """RMSProp smoothing constant (the paper's decay 0.99)."""
    rmsprop_eps: float = field(default=1e-5, metadata={"min": 0, "min_open": True})
    """RMSProp epsilon. The paper's 0.01 divides a loss summed over its 32 x 20 samples; this loss
    is their mean, whose gradient is 640 times smaller, so 0.01 / 640 = 1.6e-5 does the same; 1e-5 is A2C's."""
    gamma: float = field(default=0.99, metadata={"min": 0, "max": 1})
    """Discount factor."""
    rho_bar: float = field(default=1.0, metadata={"min": 0, "min_open": True})
    """V-trace's truncation of the importance weight pi/mu in the value targets and the policy
    gradient (the paper's rho-bar, 1): the target is the value of a policy between mu and pi."""
    c_bar: float = field(default=1.0, metadata={"min": 0, "min_open": True})
    """V-trace's truncation of the trace-cutting weights (the paper's c-bar, 1): how far back a TD
    error of a later step reaches."""
    entropy_coef: float | None = field(default=None, metadata={"min": 0})
    """Weight of the entropy bonus. None: the paper's 0.01 on Atari and MinAtar games, 0 on control
    tasks (A2C's reason: on CartPole a bonus keeps the sampled policy from averaging 475)."""
    value_coef: float = field(default=0.5, metadata={"min": 0})
    """Weight of the squared V-trace error (v_s - V)^2 against the policy loss (the paper's baseline cost)."""
    max_grad_norm: float = field(default=0.5, metadata={"min": 0, "min_open": True})
    """Global gradient-norm clip (A2C's; the paper's 40 is on a summed loss)."""
    clip_rewards: bool | None = None
    """Clip rewards to [-1, 1] in the loss, as the paper does. None means: on for Atari, off
    otherwise. Logged episode returns are always the raw score."""

    def actors_endpoint(self, rank: int) -> str | None:
        """Where agent ``rank``'s learner binds for actors from elsewhere: --actors-bind, a fixed tcp
        port moved up by the rank, an ipc:// path suffixed with it (agent 0's as given). The
        learners of one host (`gossiprl run --agents 4`, or the `gossiprl agent`s a scheduler starts
        side by side) all bound the one port, and all but the first failed; on one path ZeroMQ let
        each take the socket file over from the one before, without an error, so every actor
        joined the last. PORT + rank and PATH-rank keep each learner's endpoint known before it
        starts, for the scripts that start its actors. A port or path of * (each picks a free one)
        is as given."""
        if self.actors_bind is None:
            return None
        transport, _, rest = keys.check_endpoint(self.actors_bind).partition("://")
        if transport == "ipc" and rest != "*":
            return self.actors_bind if rank == 0 else f"{self.actors_bind}-{rank}"
        head, _, port = self.actors_bind.rpartition(":")
        if transport != "tcp" or not port.isdigit():
            return self.actors_bind
        if int(port) + rank > 65535:
            raise ValueError(
                f"--actors-bind {self.actors_bind}: agent {rank} would bind port {int(port) + rank} (agent r binds "
                "PORT + r), past 65535; give a lower PORT, or * for free ones"
            )
        return f"{head}:{int(port) + rank}"

    def check_actors(self, last_rank: int = 0) -> None:
        """Refuse, in one line naming what is valid, actor settings no learner could start with (or
        one with no actors at all, or one that would ignore --actors-bind), for agents ranked up to
        ``last_rank``. `gossiprl run`, `gossiprl agent` and ``launch.run`` ask before anything
        starts (inside the agents each failed on its own, once the run had begun); the learner asks
        again for callers of ``train``."""
        if self.actors_per_agent == 0 and (self.actors_bind is None or self.actor_placement != "process"):
            raise ValueError(
                "--actors-per-agent 0 leaves the learner only actors from elsewhere, which join with "
                "--actor-placement process and --actors-bind tcp://HOST:PORT (from other hosts) or ipc://PATH "
                "(from this one); without them give 1 or more"
            )
        if self.actors_bind is not None and self.actor_placement != "process":
            raise ValueError(
                "--actors-bind takes actors from elsewhere, which only actor processes have a channel for: with "
                f"--actor-placement {self.actor_placement} leave it out, or give --actor-placement process"
            )
        if (self.actors_curve_secret is None) != (self.actors_curve_allow is None):
            raise ValueError(
                "--actors-curve-secret and --actors-curve-allow go together (the learner's key, its actors' keys)"
            )
        endpoint = self.actors_endpoint(last_rank)  # a malformed endpoint, or a port past 65535, stops here
        if endpoint is not None and not keys.is_loopback(endpoint) and self.actors_curve_secret is None:
            raise ValueError(
                f"--actors-bind {self.actors_bind} is reachable from other hosts, whose actors could then feed this "
                "learner: give it --actors-curve-secret and --actors-curve-allow (made by `gossiprl keys generate`)"
            )


LEARNERS = {"a2c": A2CConfig, "ppo": PPOConfig, "impala": ImpalaConfig}
"""Each --algo and its hyperparameters: AgentConfig holds one section per learner, of the same name."""


@dataclass
class AgentConfig:
    env_id: str = field(default="CartPole-v1", metadata={"flag": "--env"})
    """A gymnasium id, or an Atari id ('ALE/Pong-v5', 'PongNoFrameskip-v4') run on ale-py's C++
    vector env."""
    total_frames: int = field(default=2_000_000, metadata={"min": 1, "may_change_on_resume": True})
    """Frames for THIS agent, counted over a resume (launch.run sets it from the swarm's budget,
    SwarmConfig.total_frames). On Atari a frame is an emulator frame, i.e. env steps x 4
    (frameskip), as the papers count them; elsewhere one env step."""
    seed: int = 1
    """Base seed; agent ``rank`` draws its episodes and actions from (seed, rank), so agents explore
    differently and no two seeds of a swarm share an agent's stream."""
    agents_per_host: int | None = field(default=None, metadata={"min": 1, "may_change_on_resume": True})
    """How many agents share this host's cores; only sizes the default torch_threads. None: 1, or
    for `gossiprl agent` the launcher's processes per host (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE,
    OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS); launch.run sets it to the swarm's size."""
    device: str = field(default="auto", metadata={"choices": DEVICES, "may_change_on_resume": True})
    """'auto', 'cpu' or 'cuda'; on cuda agent ``rank`` takes GPU rank % device_count."""
    torch_threads: int = field(default=0, metadata={"min": 0, "may_change_on_resume": True})
    """Intra-op threads for torch and ALE; 0 means one torch thread (more buy nothing for these
    networks and stall whenever another process shares a core) and this agent's share of the
    cores, cores // agents_per_host, for ALE's env threads (gossiprl.rl.agent.thread_plan)."""
    shared_init: bool = True
    """Every agent of the swarm starts from the same initial network, drawn from --seed (as GALA
    does); off, each agent draws its own from (seed, rank). Actions and episodes are each agent's
    own either way."""
    sticky_actions: float = field(default=0.0, metadata={"min": 0, "max": 1})
    """Atari repeat_action_probability (0 as in the papers)."""
    gossip_every: int = field(default=1, metadata={"min": 1})
    """Exchange parameters after every this many updates (1 = after every step, as PALA)."""
    gossip_overlap: bool = False
    """Overlap gossip with training: the letters travel while the next rollout and update run and
    are mixed in one update later (one round of delay, as GALA's non-blocking gossip). Faster on a
    busy host (no agent idles on its neighbours' jitter), but the stale mix advances the swarm's
    mean by only 1 / (2 - p_ii) of each update (2/3 on a ring; --overlap-lr-scale makes up for it);
    off, every update waits until the in-peers' letters of the same round are mixed in (PALA's
    Algorithm 2). See docs/algorithm.md and experiments/RESULTS.md."""
    overlap_lr_scale: bool = True
    """With --gossip-overlap, multiply the learning rate by 2 - p_ii (p_ii: the agent's own weight in
    the mixing matrix; 1.5 on a ring), so the swarm's mean moves as far per round as with blocking
    gossip. Without it a ring of 4 on MinAtar Breakout learned less per frame overlapped than
    blocking (4.58 against 4.81 at 250k frames per agent, 3 seeds)."""
    aggregate: str = field(default="mean", metadata={"choices": AGGREGATES})
    """How letters are mixed in: 'mean' (the mixing matrix's weights, PALA), or the robust
    'trimmed-mean' / 'median' over our parameters and the letters (gossiprl.comms.gossip.mix)."""
    deviation_bound: float | None = field(default=10.0, metadata={"parse": deviation_factor, "metavar": "FACTOR"})
    """Drop a letter farther from our parameters than this many times the recent distances
    (counted in gossip/dropped), and cap how far letters may drag us over the rounds (gossip/clipped;
    gossiprl.comms.gossip.DeviationBound); None, or 0 on the command line, turns both off."""
    log_every: int = field(default=100, metadata={"min": 1, "may_change_on_resume": True})
    """Updates between rows of metrics.csv / TensorBoard points."""
    checkpoint_every: int = field(default=1000, metadata={"min": 1, "may_change_on_resume": True})
    """Updates between checkpoints (one is also written at the end)."""
    stop_at_return: float | None = field(default=None, metadata={"may_change_on_resume": True})
    """Stop early once the mean of this agent's last 100 finished episodes reaches this."""
    algo: str = field(default="a2c", metadata={"choices": tuple(LEARNERS)})
    """The learner, i.e. the update rule between two rollouts: 'a2c' (the PALA / GALA papers'), 'ppo'
    (CleanRL's clipped PPO) or 'impala' (actors apart from a V-trace learner, Espeholt et al. 2018).
    Its hyperparameters are the flags marked with its name."""
    a2c: A2CConfig = field(default_factory=A2CConfig)
    """A2C's hyperparameters (paper defaults), used with --algo a2c."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO's hyperparameters (CleanRL's defaults), used with --algo ppo."""
    impala: ImpalaConfig = field(default_factory=ImpalaConfig)
    """IMPALA's hyperparameters (the paper's defaults), used with --algo impala."""

    def check_actors(self, last_rank: int = 0) -> None:
        """``ImpalaConfig.check_actors`` when --algo is impala: the other learners have no actors,
        and ignore IMPALA's section whatever it holds."""
        if self.algo == "impala":
            self.impala.check_actors(last_rank)

    def unused_gossip_settings(self, gossips: bool) -> list[str]:
        """The gossip settings given other values than their defaults where the swarm does not
        gossip, which therefore ignores them (``SwarmConfig.unused_gossip_settings``' agent half).
        shared_init is not one: agents that never mix still start from the swarm's one network."""
        if gossips:
            return []
        names = ("gossip_every", "gossip_overlap", "overlap_lr_scale", "aggregate", "deviation_bound")
        default = AgentConfig()
        return [name for name in names if getattr(self, name) != getattr(default, name)]


def host_cores() -> int:
    """Cores this process may run on (its affinity mask, as taskset or a container's cpuset set it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_plan(cfg: AgentConfig) -> dict[str, int]:
    """Intra-op threads for torch and worker threads for the env (ALE), chosen apart.

    torch gets one thread unless told otherwise: the agents themselves are the parallelism, the
    networks gossiprl trains on a CPU are too small for more threads to pay, and a torch that
    spreads over cores other processes also use stalls at every op (one agent with two threads
    on 2 cores fell from 9.3k to under 500 frames/s while one other process kept a core busy;
    with one thread it kept its pace). ALE's C++ envs run in threads of their own while torch
    waits for them, so they get this agent's share of the host's cores.
    """
    cores = max(1, host_cores() // (cfg.agents_per_host or 1))
    return {"torch": cfg.torch_threads or 1, "env": cfg.torch_threads or cores}
