"""Every setting of gossiprl, as one tree of dataclasses: the `gossiprl` command is generated from it.

A run's config.json has two sections, ``swarm`` (SwarmConfig, below) and ``agent`` (AgentConfig,
whose learners' hyperparameters are its sub-sections ``agent.a2c``, ``agent.ppo``), and records
beside them (``RECORDS``). A broker and
an agent's connection to it (BrokerConfig, ClientConfig) are the comms layer's and an agent's
learning the RL layer's, so those are declared in ``gossiprl.comms.settings`` and
``gossiprl.rl.settings``, where the layers below can import them; the rest (the swarm, and what
each command takes beyond them) is declared here, and ``gossiprl.cli`` names which of them each
command takes. A field's default and the docstring under it are its one declaration: its flag,
its ``--help`` and its key in a config file are made from them (``gossiprl.config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import topologies

from .comms.dataplane import PLANES
from .comms.settings import GOSSIP_TIMEOUT_S, KEY_FILE, BrokerConfig, ClientConfig
from .comms.turnlocks import MODES
from .comms.wire import CODECS
from .rl.settings import AgentConfig, meant_then

__all__ = ["AgentConfig", "BrokerConfig", "ClientConfig", "SwarmConfig", "make_topology"]

TRANSPORTS = ("ipc", "tcp")

NATURE_CNN_PARAMS = 1_687_719
"""Parameters of Nature-CNN A2C for 6 actions (float32: 6.75 MB): the benchmarks' default letter."""

OUT_FILE = {"dir_okay": False}
"""A file a command writes (metadata ``path``)."""


RECORDS_LEARNER = "learned_with"
"""A run's config.json's record of its learner's settings as its agents resolved them for its env.
Its "agent" section keeps what was asked, None for "the env's default", which may move; a resumed run
keeps what the record says for those (``learned_with``), and a new run given the file as --config
takes its own env's defaults."""
RECORDS = ("topology", RECORDS_LEARNER)
"""Top-level entries of a run's config.json that record what the run was, and set nothing."""


def learned_with(data: Mapping) -> dict:
    """What a run's config.json says its learner learned with: what its "agent" section set, and for
    what it leaves to the env's default (None), its ``RECORDS_LEARNER`` record or, for a run recorded
    before that record, what those settings stood for then (``rl.settings.meant_then``). ValueError
    names a record that is not one."""
    agent = data.get("agent") or {}
    algo = agent.get("algo") or "a2c"
    section = agent.get(algo)
    if not isinstance(section, Mapping):
        return {}
    record = data.get(RECORDS_LEARNER)
    if record is not None and (not isinstance(record, Mapping) or not isinstance(record.get(algo), Mapping)):
        raise ValueError(f"its {RECORDS_LEARNER!r} holds no record of {algo}'s settings")
    unset = record[algo] if record is not None else meant_then(algo, str(agent.get("env_id", "")), section)
    return {**unset, **{k: v for k, v in section.items() if v is not None}}


def return_target(value) -> float | str | None:
    """--stop-at-return's values: a number, 'auto' (the env's reward threshold, which the command
    looks up before it starts) or 'none' / None (never)."""
    if value is None or value == "none":
        return None
    if value == "auto":
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r}: give a number, 'auto' or 'none'") from None


TOPOLOGY_OPTIONS = ("peers", "time_varying", "peers_per_round", "topology_options")
"""SwarmConfig's fields that shape a topology family beyond its name and size."""


def make_topology(
    spec: str, n: int | None, peers=None, time_varying=False, peers_per_round=None, topology_options=None
):
    """The one place a --topology NAME|FILE and its options become a ``topologies.Topology``
    (raising ``topologies.TopologyError``, which says what is valid)."""
    return topologies.from_spec(
        spec, n, peers=peers, time_varying=time_varying, peers_per_round=peers_per_round, **(topology_options or {})
    )


NO_GOSSIP = "none"
"""The --topology of agents that train side by side without gossip."""


@dataclass
class SwarmConfig:
    """A swarm on one host; with AgentConfig (gossiprl.rl.settings), all that ``launch.run`` needs.

    Fields marked ``may_change_on_resume`` are how long and how the swarm runs, not what it
    learns: a resumed run may take new values for them (``gossiprl.config.resume_values``)."""

    agents: int = field(default=4, metadata={"min": 1, "short": "-n"})
    """Number of agents; 1 with no topology is plain A2C (no broker)."""
    total_frames: int = field(default=2_000_000, metadata={"min": 1, "may_change_on_resume": True})
    """Frames for the whole swarm, split evenly: each agent trains total_frames // agents (its
    AgentConfig.total_frames, which run sets). Counted over a resume, so resuming with a larger
    budget extends the run. Atari frames count the 4 skipped frames, as the papers do."""
    topology: str | None = field(default=None, metadata={"metavar": "NAME|FILE|none"})
    """A family (ring, sparse, full, ...: `gossiprl topology table` lists them) or a .npy/.csv
    row-stochastic mixing matrix. 'none': no gossip and no broker, the agents train side by side
    (the control a topology ablation compares against: agent r still draws from (seed, rank r) and
    starts from the swarm's initial network). None: ring with several agents, plain A2C with one."""
    peers: int | None = field(default=None, metadata={"min": 1})
    """Out-peers per agent for the sparse topology (default ceil(log2 n))."""
    time_varying: bool = False
    """Sparse, hypercube: one rotating peer per round, as GALA/SGP."""
    peers_per_round: int | None = field(default=None, metadata={"min": 1})
    """GALA/SGP families: phone-book entries used per round (their peers_per_itr; default 1)."""
    topology_options: dict = field(default_factory=dict, metadata={"flag": "--option", "metavar": "KEY=VALUE"})
    """Any other integer option of the family, e.g. degree=4, seed=1 (random-regular), rows=2 (torus)."""
    mode: str = field(default="sync", metadata={"choices": MODES})
    """sync: PALA's turn locks; async: GALA-style non-blocking (but see max_staleness)."""
    max_staleness: int | None = field(default=None, metadata={"min": 1})
    """async: an agent waits for an in-peer after this many rounds without its letter."""
    codec: str = field(default="raw", metadata={"choices": CODECS})
    """Parameters on the wire: raw float32, or bf16 / fp16 (half the bytes)."""
    transport: str = field(default="ipc", metadata={"choices": TRANSPORTS, "may_change_on_resume": True})
    """ipc (a unix socket in a 0700 directory, fastest on one host) or tcp (loopback, with
    throwaway CURVE keys: loopback is open to every user of the host)."""
    data_plane: str = field(default="broker", metadata={"choices": PLANES, "may_change_on_resume": True})
    """Where parameter bytes travel: through the broker, shared memory (shm), agent to agent
    (direct), or auto (shm on one host, direct across hosts). PROTOCOL.md section 10."""
    gossip_timeout: float = field(
        default=GOSSIP_TIMEOUT_S, metadata={"min": 0, "min_open": True, "may_change_on_resume": True}
    )
    """Seconds an agent waits for a turn lock before it skips the round and trains on."""
    stop_at_return: float | None = field(
        default=None,
        metadata={
            "parse": return_target,
            "cli_default": "auto",
            "metavar": "RETURN|auto|none",
            "may_change_on_resume": True,
        },
    )
    """Stop the swarm once the mean of the last 100 episodes of all agents pooled reaches this;
    None: never. `gossiprl run` defaults to 'auto', the env's reward threshold; the library
    default is None, so studies compare settings at equal frames."""
    max_seconds: float | None = field(default=None, metadata={"min": 0, "min_open": True, "may_change_on_resume": True})
    """Stop the swarm after this much wall-clock time (this session's)."""
    fail_fast: bool = field(default=False, metadata={"may_change_on_resume": True})
    """Stop every agent when one fails; by default the others carry on, rewired around it."""

    def __post_init__(self):
        if self.topology is None and self.agents > 1:
            self.topology = "ring"

    @property
    def gossips(self) -> bool:
        """Whether the agents exchange parameters (through a broker)."""
        return self.topology not in (None, NO_GOSSIP)

    def unused_gossip_settings(self) -> list[str]:
        """The gossip settings given other values than their defaults in a swarm that does not gossip,
        which therefore ignores them (a config file shared by an ablation's arms sets them for all)."""
        if self.gossips:
            return []
        names = (*TOPOLOGY_OPTIONS, "mode", "max_staleness", "codec", "transport", "data_plane", "gossip_timeout")
        default = SwarmConfig(agents=self.agents, topology=self.topology)
        return [name for name in names if getattr(self, name) != getattr(default, name)]

    def make_topology(self):
        """The swarm's topology (``make_topology``), or None where it does not gossip."""
        if not self.gossips:
            return None
        return make_topology(self.topology, self.agents, **{k: getattr(self, k) for k in TOPOLOGY_OPTIONS})


# ------------------------------------------------------------------ what each command takes beyond those


@dataclass
class RunDir:
    """Where a training command writes, and whether it continues what is there."""

    run_dir: Path | None = field(default=None, metadata={"path": {"file_okay": False}})
    """Where the run writes (default runs/ENV__TOPOLOGY__SEED__TIME)."""
    resume: bool = field(default=False, metadata={"switch": True})
    """Continue the run in --run-dir from its checkpoints."""


@dataclass
class RunOutput:
    """What `gossiprl run` shows and mirrors while the swarm trains."""

    progress: bool = True
    """Show the progress line."""
    track: bool = field(default=False, metadata={"switch": True})
    """Mirror the swarm's TensorBoard run (RUN_DIR/swarm) to Weights & Biases (the track extra)."""
    wandb_project: str = "gossiprl"
    """W&B project, with --track."""
    wandb_entity: str | None = None
    """W&B entity (user or team), with --track; default: your W&B default."""


@dataclass
class AgentProcess:
    """What `gossiprl agent` is told beyond its learning and its connection."""

    rank: int | None = field(default=None, metadata={"min": 0})
    """This agent's rank; default from RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK."""
    progress_every: float = field(default=10.0, metadata={"min": 0})
    """Seconds between progress lines (frames, frames/s, return, gossip share); 0: none."""
    stop_at_return: float | None = field(
        default=None, metadata={"parse": return_target, "cli_default": "auto", "metavar": "RETURN|auto|none"}
    )
    """Stop once THIS agent's last 100 episodes average this; 'auto': the env's reward threshold, 'none': never."""


@dataclass
class ActorProcess:
    """What `gossiprl actor` is told beyond its env: where its learner is, and the keys to reach it."""

    connect: str | None = field(default=None, metadata={"required": True})
    """The learner's endpoint, as its agent printed it (--actors-bind), e.g. tcp://HOST:5600."""
    curve_secret: Path | None = field(default=None, metadata={"path": KEY_FILE})
    """This actor's CURVE secret key (NAME.key_secret), for a learner that requires keys."""
    curve_learner: Path | None = field(default=None, metadata={"path": KEY_FILE})
    """The learner's public key (the NAME.key of its --actors-curve-secret)."""


@dataclass
class Top:
    """`gossiprl top`: how often the view is redrawn."""

    interval: float = field(default=2.0, metadata={"min": 0.1})
    """Seconds between views; rates are measured over it."""
    once: bool = field(default=False, metadata={"switch": True})
    """Print one view and exit."""


@dataclass
class KeyPairs:
    names: tuple[str, ...] = field(default=("broker", "agent"), metadata={"flag": "--name"})
    """Key pair to make, NAME.key (public) and NAME.key_secret (mode 0600); repeat for several."""


@dataclass
class TopologyShow:
    agents: int = field(default=8, metadata={"min": 1, "short": "-n"})
    """Number of agents, for a named family."""
    plot_path: Path | None = field(default=None, metadata={"flag": "--plot", "path": OUT_FILE})
    """Also draw each round's edges to this PNG."""


@dataclass
class TopologyTable:
    sizes: str = "8,16,64"
    """Comma-separated swarm sizes."""
    peers_per_round: int = field(default=1, metadata={"min": 1})
    """For the GALA/SGP families."""


@dataclass
class Letter:
    """The letter every communication benchmark moves."""

    params: int = field(default=NATURE_CNN_PARAMS, metadata={"min": 1})
    """float32 values per parameter set (default: Nature-CNN A2C, 6.75 MB)."""


@dataclass
class Figures:
    json_path: Path | None = field(default=None, metadata={"flag": "--json", "path": OUT_FILE})
    """Also write the figures here as JSON."""


@dataclass
class BenchComms:
    agents: str = "2,4,8,16"
    """Comma-separated ring sizes for the per-round overhead table ('' to skip)."""
    rounds: int = field(default=30, metadata={"min": 1})
    """Rounds timed per row."""
    transport: str = field(default="tcp", metadata={"choices": TRANSPORTS})
    """The broker's transport: tcp (loopback) or ipc."""
    planes_only: bool = field(default=False, metadata={"switch": True})
    """Only the data planes next to GALA-style shm and gloo."""


@dataclass
class BenchMix:
    reps: int = field(default=50, metadata={"min": 1})
    """Mixes timed; the median is shown."""
    cpu_time: bool = field(default=False, metadata={"switch": True})
    """Time with this thread's CPU clock, which preemption on a loaded host does not inflate (BLAS
    threads are not counted: set OPENBLAS_NUM_THREADS=1)."""


@dataclass
class BenchScale:
    hosts: str = "2,4,8,16"
    """Comma-separated numbers of hosts (ring sizes)."""
    rate: str = "1gbit"
    """Each host link's rate each way (tc tbf syntax)."""
    rounds: int = field(default=10, metadata={"min": 1})
    """Rounds timed per row."""
    plot_path: Path = field(default=Path("scale.png"), metadata={"flag": "--plot", "path": OUT_FILE})
    """Where the round-time plot is drawn."""
    quick: bool = field(default=False, metadata={"switch": True})
    """n = 2, 4 with 100,000 values and 5 rounds: a smoke run."""


@dataclass
class BenchTrain:
    seconds: float = field(default=30, metadata={"min": 1})
    """Seconds each row trains after its warm-up (the raw env is timed for up to 10 s)."""
    agent_counts: str = field(default="2,4", metadata={"flag": "--agents"})
    """Comma-separated ring sizes for the swarm rows."""
    quick: bool = field(default=False, metadata={"switch": True})
    """1 s per row and a ring of 2 only: a smoke test of every row."""


@dataclass
class BenchLearners:
    seconds: float = field(default=30, metadata={"min": 1})
    """Seconds each row trains."""
    actor_counts: str = field(default="1,4,8", metadata={"flag": "--actors"})
    """Comma-separated actors per IMPALA agent; each count is measured with thread and process actors."""
    quick: bool = field(default=False, metadata={"switch": True})
    """1 s per row and 1 actor only: a smoke test of every row."""


EVAL_DEVICES = ("cpu", "cuda")


@dataclass
class Eval:
    episodes: int = field(default=10, metadata={"min": 1})
    """Episodes played per policy."""
    greedy: bool = field(default=False, metadata={"switch": True})
    """argmax actions instead of sampling from the policy."""
    device: str = field(default="cpu", metadata={"choices": EVAL_DEVICES})
    """Where the policies run."""
    as_json: bool = field(default=False, metadata={"flag": "--json", "switch": True})
    """Print the result as JSON."""
    video_dir: Path | None = field(default=None, metadata={"flag": "--video", "path": {"file_okay": False}})
    """Also record MP4s here: DIR/consensus/ and DIR/agent-<rank>/."""
    video_episodes: int = field(default=1, metadata={"min": 1})
    """Episodes recorded per policy with --video."""
    import_env_module: bool = field(default=False, metadata={"switch": True})
    """Import the module a MODULE:ENV_ID env id of the run names (runs its code): only for a run you trust."""


@dataclass
class Plot:
    output: Path = field(default=Path("curves.png"), metadata={"short": "-o", "path": OUT_FILE})
    """The PNG to draw."""
