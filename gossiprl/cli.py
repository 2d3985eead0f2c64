"""The `gossiprl` command: a thin click layer over functions you can also import.

Every option of every command is generated from the config dataclasses (``gossiprl.settings``
is the tree; ``gossiprl.config`` makes the flags): the ``*_SETTINGS`` below say which configs
each command takes. Two options are written by hand: the group's ``-v``, and ``--config``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import click

import topologies

from . import config
from .comms.settings import BrokerConfig, ClientConfig
from .settings import (
    TOPOLOGY_OPTIONS,
    ActorProcess,
    AgentProcess,
    BenchComms,
    BenchLearners,
    BenchMix,
    BenchScale,
    BenchTrain,
    Eval,
    Figures,
    KeyPairs,
    Letter,
    Plot,
    RunDir,
    RunOutput,
    Top,
    TopologyShow,
    TopologyTable,
    make_topology,
)

TOPOLOGY_SETTINGS = config.settings_of("swarm", only=TOPOLOGY_OPTIONS)
"""The flags every command that builds a topology takes; SwarmConfig declares them."""

BROKER_SETTINGS = config.Settings(
    "broker",
    config.settings_of(BrokerConfig, only=("topology", "agents")),
    TOPOLOGY_SETTINGS,
    config.settings_of("swarm", only=("mode", "max_staleness", "data_plane")),
    config.settings_of(BrokerConfig, exclude=("topology", "agents")),
)
"""The broker's own settings, and the swarm's shape it serves."""


def load_topology(
    spec: str,
    n: int | None,
    peers=None,
    time_varying=False,
    peers_per_round=None,
    topology_options=None,
    hint="--topology",
):
    """--topology NAME|FILE and its options -> Topology (``settings.make_topology``), with one-line
    errors that say what is valid; ``hint`` names what the user typed the spec as (`topology show`
    takes it as its argument SPEC). A family's errors are about its options, and name the one at
    fault themselves."""
    if spec in topologies.NAMES and n is None:
        raise click.BadParameter(f"the {spec} topology needs the number of agents", param_hint="--agents")
    try:
        return make_topology(spec, n, peers, time_varying, peers_per_round, topology_options)
    except topologies.TopologyError as err:
        raise click.BadParameter(str(err), param_hint=None if spec in topologies.NAMES else hint) from None


def topology_of(values: dict, n: int | None, hint="--topology"):
    """The topology that ``values`` (a command's flags, or a SwarmConfig's fields) ask for, for ``n`` agents."""
    return load_topology(values["topology"], n, **{name: values[name] for name in TOPOLOGY_OPTIONS}, hint=hint)


@click.group()
@click.option(
    "-v", "--verbose", count=True, help="More log output (-vv for debug)."
)  # the group's own: no command's config
def main(verbose: int) -> None:
    """gossiprl: gossip-based distributed deep RL (PALA / GALA) over ZeroMQ."""
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(name)s %(levelname)s %(message)s")


# ------------------------------------------------------------------ broker


@main.command()
@BROKER_SETTINGS.options
@click.pass_context
def broker(ctx, **_):
    """Run the data proxy (the broker holding the turn locks) in the foreground."""
    cfg = BROKER_SETTINGS.build(BrokerConfig, ctx.params)
    mode = ctx.params["mode"]
    _check_endpoint(cfg.bind, "--bind")
    topo = topology_of(ctx.params, cfg.agents)
    b = _start_broker(cfg, topo, ctx.params)
    listener = _stats_listener(b, cfg)  # a port in use stops the broker before it prints or serves anything
    stats_server = None
    stop_on_sigterm()  # a scheduler's kill stops it as Ctrl-C does, and exits 143
    status = 0
    try:
        b.start()  # before the banner: a signal sent once it is printed finds the broker serving
        click.echo(
            f"gossiprl broker on {b.address}: {topo.name} topology, {topo.n} agents, {mode} mode"
            + (", CURVE keys required" if cfg.curve else "")
        )
        stats_server = _serve_stats(b, cfg, listener)
        _serve(b, cfg, topo.n, as_json=cfg.stats_json or ctx.find_root().params["verbose"] > 0)
    except KeyboardInterrupt:
        status = interrupted_status()
    finally:
        if stats_server is not None:
            stats_server.close()
        b.close()
        click.echo("broker stopped")
    sys.exit(status)


def _start_broker(cfg: BrokerConfig, topo, swarm: dict):
    """The broker ``cfg`` asks for, bound, once its endpoint and keys pass their checks."""
    from .comms.broker import Broker

    _check_keys(cfg)
    try:
        return Broker(
            topo,
            bind=cfg.bind,
            mode=swarm["mode"],
            max_staleness=swarm["max_staleness"],
            peer_timeout=cfg.peer_timeout,
            curve=cfg.curve,
            insecure=cfg.insecure,
            data_plane=swarm["data_plane"],
            max_payload_bytes=cfg.max_payload_mib << 20,
        )
    except (ValueError, OSError) as err:  # a non-loopback bind without keys; a missing or malformed key
        raise click.ClickException(str(err)) from None
    except Exception as err:  # zmq bind errors: address in use, bad endpoint
        raise click.ClickException(f"cannot bind {cfg.bind}: {err}") from None


def _check_endpoint(address: str, flag: str) -> None:
    from .comms.keys import check_endpoint

    try:
        check_endpoint(address)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=flag) from None


def _check_keys(cfg: BrokerConfig) -> None:
    """Both CURVE files or neither; a loopback tcp bind without keys only with --insecure, and then loudly."""
    from .comms.keys import HOW_TO_MAKE_KEYS, is_loopback

    if (cfg.curve_secret is None) != (cfg.curve_allow is None):
        raise click.UsageError("--curve-secret and --curve-allow go together (the broker's key and the agents' keys)")
    if cfg.curve is not None or not cfg.bind.startswith("tcp://") or not is_loopback(cfg.bind):
        return
    if not cfg.insecure:
        raise click.UsageError(
            f"refusing to bind {cfg.bind} without keys: a tcp port, loopback included, is open to every "
            "user of this host, who could register a rank and publish into the swarm. Bind "
            "ipc://PATH in a directory only you can enter, or give the broker keys "
            f"({HOW_TO_MAKE_KEYS}), or pass --insecure to accept that."
        )
    logging.getLogger("gossiprl.comms.keys").warning(
        "broker binds %s WITHOUT authentication (--insecure): every user of this host can register "
        "a rank and publish parameters into the swarm",
        cfg.bind,
    )


def _stats_listener(b, cfg: BrokerConfig):
    """The socket --metrics-port asks for (None without it), bound before the broker says it serves;
    the broker is closed if it cannot be had."""
    if cfg.metrics_port is None:
        return None
    from .monitor import listen

    try:
        require_prometheus()
        return listen(cfg.metrics_port, cfg.metrics_bind)
    except click.ClickException:
        b.close()
        raise
    except OSError as err:
        b.close()
        raise click.ClickException(
            f"cannot serve stats on {cfg.metrics_bind}:{cfg.metrics_port}: {err.strerror}"
        ) from None


def _serve_stats(b, cfg: BrokerConfig, listener):
    """The stats server on ``listener`` (None without one)."""
    if listener is None:
        return None
    from .monitor import StatsServer

    server = StatsServer(b.stats, listener, cfg.metrics_bind)
    click.echo(f"stats on {server.address}/metrics (Prometheus) and /stats; watch with `gossiprl top {server.address}`")
    return server


def _serve(b, cfg: BrokerConfig, n: int, as_json: bool) -> None:
    """Print stats every --stats-every seconds while the broker serves; return when the swarm is
    done (--exit-when-done), fail if the serving thread died."""
    from .monitor import stats_line

    next_stats = time.monotonic() + cfg.stats_every
    while b.wait(min(cfg.stats_every or 3600, DONE_POLL_S if cfg.exit_when_done else 3600)):
        if cfg.stats_every and time.monotonic() >= next_stats:
            next_stats += cfg.stats_every
            click.echo(json.dumps(b.stats()) if as_json else stats_line(b.stats()))
        if cfg.exit_when_done and b.swarm_done():
            click.echo(f"all {n} agents registered and left with BYE: the swarm is done")
            return
    raise click.ClickException(f"the broker stopped serving (a bug: please report it):\n{b.failure}")


DONE_POLL_S = 0.5
"""How often `gossiprl broker --exit-when-done` looks whether its swarm has finished."""


TOP_SETTINGS = config.Settings("top", config.settings_of(Top))


@main.command()
@click.argument("address")
@TOP_SETTINGS.options
def top(address, interval, once):
    """Live view of a broker started with --metrics-port: ADDRESS is its stats server, e.g. 127.0.0.1:9100."""
    from .monitor import fetch_stats
    from .monitor import top as show

    try:
        import rich  # noqa: F401
    except ImportError:
        raise click.ClickException("`gossiprl top` needs rich: pip install 'gossiprl[monitor]'") from None
    try:
        fetch_stats(address)
    except (OSError, ValueError) as err:
        raise click.ClickException(
            f"no broker stats at {address} ({err}): start the broker with --metrics-port and give its HOST:PORT"
        ) from None
    try:
        show(address, interval, once)
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------ keys


@main.group()
def keys():
    """CurveZMQ keys that let only your agents talk to your broker."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@config.Settings("keys generate", config.settings_of(KeyPairs)).options
def keys_generate(directory, names):
    """Make CURVE key pairs in DIRECTORY (created with mode 0700; existing keys are never overwritten)."""
    from .comms import keys as keyfiles

    for name in names:
        try:
            public, secret = keyfiles.generate(directory, name)
        except (ValueError, OSError) as err:
            raise click.ClickException(str(err)) from None
        click.echo(f"{name}: public {public}, secret {secret}")
    click.echo(
        "broker: --curve-secret BROKER.key_secret --curve-allow DIR_OF_AGENT_PUBLIC_KEYS; "
        "agents: --curve-secret AGENT.key_secret --curve-broker BROKER.key"
    )


# ------------------------------------------------------------------ topology


@main.group()
def topology():
    """Inspect mixing matrices."""


TOPOLOGY_SHOW_SETTINGS = config.Settings(
    "topology show",
    config.settings_of(TopologyShow, only=("agents",)),
    TOPOLOGY_SETTINGS,
    config.settings_of(TopologyShow, exclude=("agents",)),
)


@topology.command("show")
@click.argument("spec")
@TOPOLOGY_SHOW_SETTINGS.options
@click.pass_context
def topology_show(ctx, spec, agents, plot_path, **_):
    """Print a topology's mixing matrix, peers, and how fast it reaches consensus."""
    if spec in topologies.NAMES and agents > MAX_SHOWN_AGENTS:
        raise click.BadParameter(
            f"{agents} agents is more than `topology show` builds ({MAX_SHOWN_AGENTS}: its "
            "matrices are dense n x n); query such a swarm with topologies.make() in Python",
            param_hint="-n",
        )
    n = None if spec not in topologies.NAMES and Path(spec).is_file() else agents
    topo = topology_of({**ctx.params, "topology": spec}, n, hint="SPEC")
    try:
        click.echo(topo.describe())
        if plot_path:
            from .draw import draw_rounds

            draw_rounds(topo, plot_path)
            click.echo(f"each round's edges drawn to {plot_path}")
    except topologies.TopologyError as err:
        raise click.ClickException(str(err)) from None


@topology.command("table")
@config.Settings("topology table", config.settings_of(TopologyTable)).options
def topology_table(sizes, peers_per_round):
    """A Markdown table of every named family: letters per round, contraction per period, rounds to 1%."""
    from topologies.diagnostics import table

    try:
        ns = [int(s) for s in sizes.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"{sizes!r}: give sizes as integers separated by commas, e.g. 8,16,64", param_hint="--sizes"
        ) from None

    def build(name, n):
        options = {"peers_per_round": peers_per_round} if "peers_per_round" in topologies.options(name) else {}
        return topologies.make(name, n, **options)

    click.echo(table(build, list(topologies.NAMES), ns))


MAX_SHOWN_AGENTS = 4096


# ------------------------------------------------------------------ bench


@main.group()
def bench():
    """Benchmarks that print measured figures beside their baselines."""


def ring_sizes(text: str, flag: str, what: str = "ring sizes") -> list[int]:
    """A comma-separated list of ring sizes ('' for none), each at least 2."""
    try:
        sizes = [int(a) for a in text.split(",") if a.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: give comma-separated integers like 2,4,8", param_hint=flag) from None
    if any(a < 2 for a in sizes):
        raise click.BadParameter(f"{what} must be >= 2", param_hint=flag)
    return sizes


def write_figures(result: dict, json_path: Path | None, say: bool = True) -> None:
    """--json: the figures as JSON too."""
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
        if say:
            click.echo(f"figures written to {json_path}")


@bench.command("comms")
@config.Settings(
    "bench comms", config.settings_of(BenchComms), config.settings_of(Letter), config.settings_of(Figures)
).options
def bench_comms(agents, params, rounds, transport, json_path, planes_only):
    """One gossip round: memcpy floor, raw ZeroMQ relay, gossiprl, and the PALA paper's path."""
    from .bench import comms as bc
    from .bench import planes

    ring = ring_sizes(agents, "--agents")
    result = {} if planes_only else bc.run(ring, params, rounds, transport=transport, echo=click.echo)
    result["planes"] = planes.run(ring, params, rounds, echo=click.echo)
    write_figures(result, json_path)


@bench.command("mix")
@config.Settings("bench mix", config.settings_of(Letter), config.settings_of(BenchMix)).options
def bench_mix(params, reps, cpu_time):
    """Mixing one letter in against a plain axpy over the same bytes, timed alternately in one run."""
    from .bench import comms as bc

    clock = time.thread_time if cpu_time else time.perf_counter
    rows = []
    for cache in ("hot", "cold"):
        cold = cache == "cold"
        rows.append((f"numpy array, {cache}", bc.measure_mix(params, reps, cold=cold, clock=clock)))
        try:
            rows.append(
                (f"torch CPU tensor, {cache}", bc.measure_mix(params, reps, torch_tensor=True, cold=cold, clock=clock))
            )
        except ImportError:
            pass
    click.echo(
        f"{params:,} float32 = {params * 4 / 1e6:.2f} MB, median of {reps} ({'CPU' if cpu_time else 'wall'} time); "
        f"hot: one pair of arrays that stays in cache, cold: pairs over {bc.COLD_BYTES >> 20} MiB, as a letter "
        "that has just arrived"
    )
    for label, r in rows:
        click.echo(
            f"  mix ({label}) {r['mix_ms']:.3f} ms, axpy (x += m; x *= 0.5) {r['axpy_ms']:.3f} ms: "
            f"{r['ratio']:.2f}x (target <= 2x)"
        )


@bench.command("scale")
@config.Settings(
    "bench scale", config.settings_of(BenchScale), config.settings_of(Letter), config.settings_of(Figures)
).options
def bench_scale(hosts, rate, params, rounds, plot_path, quick, json_path):
    """Ring round time vs hosts (network namespaces behind shaped links): broker relay vs direct."""
    from .bench import scale as bs

    ns = ring_sizes(hosts, "--hosts", "host counts")
    if not ns:
        raise click.BadParameter("host counts must be >= 2", param_hint="--hosts")
    deadline = 600.0
    if quick:  # a smoke run: a ring that has not finished in a minute is stuck, and says where
        ns, params, rounds, deadline = [2, 4], 100_000, 5, 60.0
    result = bs.run(ns, numel=params, rounds=rounds, rate=rate, plot=plot_path, echo=click.echo, deadline_s=deadline)
    write_figures(result, json_path, say=False)


BENCH_AGENT = (
    config.settings_of("agent", only=("env_id", "device")),
    config.settings_of("swarm", only=("data_plane",)),
)
BENCH_DEFAULTS = {"env_id": "MinAtar/Breakout-v1", "device": "cpu"}
"""The training benchmarks' env defaults to MinAtar Breakout, the CPU stand-in for the papers' Atari games."""

BENCH_TRAIN_SETTINGS = config.Settings(
    "bench train",
    *BENCH_AGENT,
    defaults=BENCH_DEFAULTS,
    flags_only=(config.settings_of(BenchTrain), config.settings_of(Figures)),
)
BENCH_LEARNERS_SETTINGS = config.Settings(
    "bench learners",
    *BENCH_AGENT,
    defaults=BENCH_DEFAULTS,
    flags_only=(config.settings_of(BenchLearners), config.settings_of(Figures)),
)


@bench.command("train")
@BENCH_TRAIN_SETTINGS.options
@click.pass_context
def bench_train(ctx, seconds, agent_counts, quick, json_path, **_):
    """Frames/s of the agent loop next to its limits, every row in one run: the raw env, a minimal
    A2C loop, one agent (idle host and one core busy), and rings with blocking, overlapped and
    async gossip, with each row's time split."""
    require_rl("bench train")
    from .bench import train as bt

    values = BENCH_TRAIN_SETTINGS.resolve(ctx)
    counts = (2,) if quick else counts_of(agent_counts, 2, "ring sizes", "2,4", "--agents")
    seconds, allowances = (1.0, bt.QUICK_ALLOWANCES) if quick else (seconds, bt.STARTUP_ALLOWANCES)
    run_bench(
        lambda: bt.run(
            values["env_id"], seconds, counts, values["data_plane"], values["device"], click.echo, allowances
        ),
        values,
        json_path,
    )


@bench.command("learners")
@BENCH_LEARNERS_SETTINGS.options
@click.pass_context
def bench_learners(ctx, seconds, actor_counts, quick, json_path, **_):
    """Frames/s and CPU time per frame of IMPALA (1, 4, 8 actors as threads and as processes; one
    agent and a ring of 2) against A2C, every row in one run, with IMPALA's policy lag and queue depth."""
    require_rl("bench learners")
    from .bench import learners as bl

    values = BENCH_LEARNERS_SETTINGS.resolve(ctx)
    counts = (1,) if quick else counts_of(actor_counts, 1, "actor counts", "1,4,8", "--actors")
    seconds = 1.0 if quick else seconds
    run_bench(lambda: bl.run(values["env_id"], seconds, counts, values["device"], echo=click.echo), values, json_path)


def counts_of(text: str, least: int, what: str, example: str, flag: str) -> tuple[int, ...]:
    """A benchmark's comma-separated counts, each at least ``least``, or a one-line error."""
    try:
        counts = tuple(int(n) for n in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < least:
        raise click.BadParameter(
            f"{text!r}: give {what} >= {least} separated by commas, e.g. {example}", param_hint=flag
        )
    return counts


def run_bench(measure, values: dict, json_path: str | None) -> None:
    """Check the env and device, run ``measure`` (it prints its table) and write its figures as JSON if asked."""
    from . import launch

    check_device(values["device"])
    check_env(values["env_id"])
    try:
        result = measure()
    except launch.RunError as err:
        raise click.ClickException(str(err)) from None
    write_figures(result, json_path)


# ------------------------------------------------------------------ training

RUN_SETTINGS = config.Settings(
    "run",
    config.settings_of("swarm"),
    config.settings_of("agent", exclude=("total_frames", "agents_per_host", "stop_at_return")),
    flags_only=(
        config.settings_of(RunDir),
        config.settings_of(RunOutput),
        config.settings_of(BrokerConfig, only=("metrics_port",)),
    ),
)
"""A swarm's settings and its agents'. The swarm's budget, size and stop rule take the place of
the agents' own: launch.run gives each agent total_frames // agents and agents_per_host = agents."""

AGENT_SETTINGS = config.Settings(
    "agent",
    config.settings_of("agent", exclude=("stop_at_return",)),
    config.settings_of("swarm", only=("codec", "gossip_timeout")),
    flags_only=(
        config.settings_of(ClientConfig, only=("connect", "curve_secret", "curve_broker")),
        config.settings_of(AgentProcess),
        config.settings_of(RunDir),
    ),
)
"""One agent's settings, and the two of the swarm's that are the agent's to follow."""


def require_rl(command: str) -> None:
    """Training commands need torch and gymnasium, which the comms-only install leaves out."""
    try:
        import gymnasium  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        raise click.ClickException(
            f"`gossiprl {command}` needs {err.name}, which is not installed: "
            "install the rl extra: pip install -e '.[rl]'"
        ) from None


def require_prometheus() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise click.ClickException("--metrics-port needs prometheus-client: pip install 'gossiprl[monitor]'") from None


def metrics_listener(port: int | None, gossips: bool):
    """--metrics-port of `gossiprl run`, bound before the run prints or makes anything: a port in use
    is then an error before start-up (it used to come after the run's header, from the launcher)."""
    if port is None:
        return None
    if not gossips:
        raise click.BadParameter(
            "serves the broker's stats, and a run without gossip (one agent, or --topology none) has no broker",
            param_hint="--metrics-port",
        )
    from .monitor import listen

    require_prometheus()
    try:
        return listen(port)
    except OSError as err:
        raise click.ClickException(f"cannot serve stats on 127.0.0.1:{port}: {err.strerror}") from None


def check_actors(cfg, last_rank: int) -> None:
    """Refuse IMPALA actor settings no learner of ranks up to ``last_rank`` could start with
    (``ImpalaConfig.check_actors``) before anything starts: inside the agents each failed on its
    own, once the run had begun."""
    try:
        cfg.check_actors(last_rank)
    except ValueError as err:
        raise click.UsageError(str(err)) from None


def check_device(device: str) -> None:
    """Refuse --device cuda up front: otherwise every agent dies on its own with a torch error."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter(
            "no CUDA GPU is visible to torch on this host; use --device cpu or auto", param_hint="--device"
        )


def check_env(env_id: str):
    """Fail fast, in the launcher, on an env id no agent could make; return the env's solve threshold."""
    from .rl.envs import env_spec

    try:
        return env_spec(env_id)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--env") from None


def stop_target(value: float | str | None, threshold: float | None) -> float | None:
    """A parsed --stop-at-return (``settings.return_target``) -> the mean return to stop at: 'auto'
    is the env's threshold."""
    return threshold if value == "auto" else value


def default_run_dir(env_id: str, topology: str | None, seed: int, algo: str = "a2c") -> Path:
    env = env_id.rpartition(":")[2].replace("/", "-")  # MODULE:ENV_ID names the run after ENV_ID
    layout = Path(topology).stem if topology else algo
    if topology and algo != "a2c":
        layout = f"{algo}-{layout}"
    name = f"{env}__{layout}__{seed}__{int(time.time())}"
    return Path("runs") / name


@main.command()
@config.config_option
@RUN_SETTINGS.options
@click.pass_context
def run(ctx, config_file, run_dir, resume, progress, track, wandb_project, wandb_entity, metrics_port, **_):
    """Train a swarm of gossiping A2C, PPO or IMPALA (--algo) agents on this host (broker + one process per agent).

    --resume continues the run in --run-dir with the settings in its config.json; flags may
    change only how long and how it runs (budget, time limit, stop rule, transport, data plane,
    device, threads, log and checkpoint periods), not what it learns."""
    require_rl("run")
    from . import launch
    from .settings import AgentConfig, SwarmConfig

    values = (
        config.resume_values(ctx, RUN_SETTINGS, run_dir, config_file)
        if resume
        else config.file_values(ctx, RUN_SETTINGS, config_file)
    )
    swarm = RUN_SETTINGS.build(SwarmConfig, values)
    cfg = RUN_SETTINGS.build(AgentConfig, values)
    check_actors(cfg, last_rank=swarm.agents - 1)
    check_device(cfg.device)
    threshold = check_env(cfg.env_id)
    if swarm.gossips:
        topology_of(vars(swarm), swarm.agents)
    unused = [(swarm, name) for name in swarm.unused_gossip_settings()]
    unused += [(cfg, name) for name in cfg.unused_gossip_settings(swarm.gossips)]
    if unused:
        # as it was given: a switch turned off is its --no- form
        flags = ", ".join(
            "--no-" + RUN_SETTINGS.flags[name].flag[2:]
            if getattr(owner, name) is False
            else RUN_SETTINGS.flags[name].flag
            for owner, name in unused
        )
        click.echo(f"warning: this swarm does not gossip, so it ignores {flags}", err=True)
    swarm = replace(swarm, stop_at_return=stop_target(swarm.stop_at_return, threshold))
    if track:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise click.ClickException("--track needs wandb: pip install 'gossiprl[track]'") from None
    stats_listener = metrics_listener(metrics_port, gossips=swarm.gossips)
    run_dir = run_dir or default_run_dir(cfg.env_id, swarm.topology, cfg.seed, cfg.algo)
    layout = f"{swarm.topology} topology, {swarm.mode} mode" if swarm.gossips else "no gossip"
    click.echo(
        f"{swarm.agents} {cfg.algo} agent(s) on {cfg.env_id}, {layout}; run dir {run_dir}"
        + (f"; stops at mean return {swarm.stop_at_return}" if swarm.stop_at_return is not None else "")
    )
    click.echo(threads_line(replace(cfg, agents_per_host=swarm.agents), gossips=swarm.gossips))
    stop_on_sigterm()  # a scheduler's kill gets the same clean stop as Ctrl-C
    try:
        summary = launch.run(
            swarm,
            cfg,
            run_dir,
            resume=resume,
            echo=click.echo,
            show_progress=progress,
            track={"project": wandb_project, "entity": wandb_entity} if track else None,
            metrics_port=stats_listener,
        )
    except (launch.RunError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    for line in end_lines(summary, run_dir):
        click.echo(line)
    for rank, why in summary["failed"].items():
        click.echo(f"agent-{rank} failed: {why}", err=True)
    if summary["stopped_by"] == "interrupted":  # a signal that also ended agents (one to the whole group) stops
        sys.exit(interrupted_status())
    if summary["failed"]:
        sys.exit(1)


def threads_line(cfg, gossips: bool) -> str:
    """The run header's line on how each agent uses the host: its threads, and whether gossip waits."""
    from .rl.settings import thread_plan

    plan = thread_plan(cfg)
    why = "--torch-threads N sets both" if cfg.torch_threads else "the default: --torch-threads N sets both"
    line = f"each agent: {plan['torch']} torch thread(s), {plan['env']} env thread(s) ({why})"
    if gossips:
        line += (
            "; gossip overlapped with training, letters mixed one update later (--gossip-overlap)"
            if cfg.gossip_overlap
            else "; gossip blocking, every update waits for its in-peers' letters (--gossip-overlap overlaps)"
        )
    return line


def _returns_line(summary: dict) -> str:
    """An agent's end line return: the mean over its last 100 episodes, or that none finished (not 'nan')."""
    from .agent_process import format_return

    if not summary["episodes"]:
        return f"mean return {format_return(None)}"
    return f"mean return {format_return(summary['mean_return'])} over the last {min(100, summary['episodes'])} episodes"


def end_lines(summary: dict, run_dir: Path) -> list[str]:
    """What a finished `gossiprl run` tells a person: why it stopped, its returns, and what next.

    The stop rule's mean was taken when the swarm was told to stop; agents finish their update
    before they leave, so the final window differs a little. Both are labelled, with each agent's
    own last-100 mean beside the pooled one (the pooled window holds mostly the fastest agents)."""
    from .agent_process import format_return
    from .launch import CONSENSUS_EPISODES

    lines = []
    reason = summary["stopped_by"]
    if summary["solved_at"]:
        at = summary["solved_at"]
        reason = "solved"
        lines.append(
            f"solved after {at['frames']:,} frames and {at['wall_seconds']:.1f}s: the last 100 episodes "
            f"of all agents, pooled, averaged {format_return(at['mean_return'])}"
        )
    lines.append(
        f"done ({reason}): {summary['frames']:,} frames in {summary['wall_seconds']:.1f}s "
        f"({summary['fps']:,.0f} frames/s), {100 * summary['gossip_share']:.1f}% of time in gossip"
    )
    if not summary["episodes"]:
        lines.append(f"mean return {format_return(None)}")
    else:
        own = [a["mean_return"] for a in summary["per_agent"].values() if not math.isnan(a["mean_return"])]
        spread = f"; each agent's own last 100: {min(own):.1f} to {max(own):.1f}" if len(own) > 1 else ""
        lines.append(
            f"mean return {format_return(summary['mean_return'])} over the last "
            f"{min(100, summary['episodes'])} episodes of all agents, pooled{spread}"
        )
    if summary.get("consensus_return") is not None:
        lines.append(
            f"consensus policy (the mean of the agents' parameters): mean return "
            f"{summary['consensus_return']:.1f} over {CONSENSUS_EPISODES} fresh episodes"
        )
    lines += [
        f"run dir {run_dir}",
        f"  watch:  tensorboard --logdir {run_dir}",
        f"  play:   gossiprl eval {run_dir}   (each agent's and the consensus policy; --video DIR for MP4s)",
        f'  use:    gossiprl.load_policy("{run_dir}")   (in Python: act(obs), predict(obs))',
    ]
    return lines


def stop_on_sigterm() -> None:
    """Make SIGTERM (a scheduler's kill: scancel, docker stop, kill) stop this process as Ctrl-C does:
    the first raises KeyboardInterrupt, which ``launch.run`` answers by having its agents checkpoint and
    stop. ``interrupted_status`` then names the signal. The experiments' studies use it too."""
    signal.signal(signal.SIGTERM, _interrupt)


def interrupted_status(signum: int | None = None) -> int:
    """128 + the signal, as a shell reports a process the signal ended: ``signum``, else the first that
    stop_on_sigterm caught, else SIGINT. 130 for Ctrl-C, 143 for SIGTERM, so a scheduler or script tells
    a stopped run from a finished one (0) or a failed one (1) though the process caught the signal to
    checkpoint."""
    return 128 + (signum if signum is not None else _caught[0] if _caught else signal.SIGINT)


def _interrupt(signum, frame):
    """The first SIGTERM stops; a later one is noted only. scancel signals every process of the job, and a
    wrapper (experiments.readme_seeds) passes its own on: a second KeyboardInterrupt would cut short the
    stop the first began (the wait for the agents' final reports, the summary). Ctrl-C is Python's own."""
    first = not _caught
    _caught.append(signum)
    if first:
        raise KeyboardInterrupt


_caught: list[int] = []
"""Signals stop_on_sigterm turned into KeyboardInterrupt, the first first."""


@main.command()
@config.config_option
@AGENT_SETTINGS.options
@click.pass_context
def agent(ctx, config_file, **_):
    """One agent of a swarm spread over hosts (PALA layout); the broker runs elsewhere.

    --total-frames is this agent's own budget here."""
    client = AGENT_SETTINGS.build(ClientConfig, ctx.params)
    own = AGENT_SETTINGS.build(AgentProcess, ctx.params)
    where = AGENT_SETTINGS.build(RunDir, ctx.params)
    _check_endpoint(client.connect, "--connect")
    require_rl("agent")
    from . import launch
    from .rl.agent import CheckpointError
    from .settings import AgentConfig

    values = config.file_values(ctx, AGENT_SETTINGS, config_file)
    _check_agent_keys(client)
    cfg = AGENT_SETTINGS.build(AgentConfig, values)
    try:
        rank = launch.rank_from_environment(own.rank)
    except launch.RunError as err:
        raise click.UsageError(str(err)) from None
    check_actors(cfg, last_rank=rank)
    check_device(cfg.device)
    target = stop_target(own.stop_at_return, check_env(cfg.env_id))
    per_host = launch.local_size_from_environment(cfg.agents_per_host)
    cfg = replace(cfg, agents_per_host=per_host or 1, stop_at_return=target)
    run_dir = where.run_dir or Path("runs") / "agents"
    click.echo(
        f"agent-{rank} -> broker {client.connect}; run dir {run_dir}"
        + (f"; stops at mean return {target:g} (its own last 100 episodes)" if target is not None else "")
    )
    with _stop_on_signals() as (stop, received):
        try:
            summary = launch.run_agent(
                client.connect,
                rank,
                cfg,
                run_dir,
                resume=where.resume,
                codec=values["codec"],
                gossip_timeout=values["gossip_timeout"],
                stop=stop,
                connect_timeout=client.connect_timeout,
                echo=click.echo,
                curve=client.curve,
                progress_every=own.progress_every,
                size_from_swarm=per_host is None,
            )
        except (launch.RunError, FileNotFoundError, CheckpointError) as err:
            if received:  # stopped while waiting for the broker: say so, and exit as interrupted
                click.echo(str(err), err=True)
                sys.exit(interrupted_status(received[0]))
            raise click.ClickException(str(err)) from None
        _agent_done(rank, summary)
        if received:
            sys.exit(interrupted_status(received[0]))


ACTOR_SETTINGS = config.Settings(
    "actor",
    config.settings_of("agent", only=("env_id", "sticky_actions", "torch_threads")),
    flags_only=(config.settings_of(ActorProcess),),
)
"""An actor's env, and where its learner is: the learner tells it the rest when it joins."""


DROPPED_STATUS = 3
"""`gossiprl actor`'s exit status when it lost its learner after joining (dropped, or the learner
silent past the actor's patience), so that a supervisor starts it again to rejoin; it exits 0 when
the learner ended and 1 on an error or a refused JOIN."""


@main.command()
@ACTOR_SETTINGS.options
@click.pass_context
def actor(ctx, **_):
    """One IMPALA actor for a learner on another host (started with --algo impala --actors-bind).

    It plays --env with the newest parameters its learner gives it and sends the learner its
    unrolls, until the learner stops; the learner sets its envs' seed and the unroll's shape.
    Exit status: 0 when the learner ended (done, or itself stopped), 3 when this actor lost its
    learner after joining it (dropped, or silent past 60 s: start it again to rejoin), 1 on an error
    or a refused join, 128 + N on signal N."""
    where = ACTOR_SETTINGS.build(ActorProcess, ctx.params)
    _check_endpoint(where.connect, "--connect")
    require_rl("actor")
    from .comms.trajectories import LEARNER_DONE, LearnerGone, LearnerLost
    from .rl.actor_processes import run_actor
    from .rl.settings import AgentConfig, host_cores

    cfg = ACTOR_SETTINGS.build(AgentConfig, ctx.params)
    check_env(cfg.env_id)
    if (where.curve_secret is None) != (where.curve_learner is None):
        raise click.UsageError("--curve-secret and --curve-learner go together (this actor's key and the learner's)")
    curve = (where.curve_secret, where.curve_learner) if where.curve_secret else None
    with _stop_on_signals() as (stop, received):
        click.echo(f"actor -> learner {where.connect}, playing {cfg.env_id}")
        try:
            unrolls, said = run_actor(
                where.connect,
                cfg.env_id,
                cfg.sticky_actions,
                env_threads=cfg.torch_threads or host_cores(),
                stop=stop,
                curve=curve,
                torch_threads=cfg.torch_threads or 1,
            )
        except (LearnerGone, ValueError, OSError) as err:
            if received:  # a signal while it joined or waited: the signal's status, as for any stop
                sys.exit(interrupted_status(received[0]))
            if isinstance(err, LearnerLost):
                click.echo(f"actor lost its learner: {err}", err=True)
                sys.exit(DROPPED_STATUS)
            raise click.ClickException(str(err)) from None
        click.echo(f"actor done: {unrolls:,} unrolls sent" + (f"; its learner said: {said}" if said else ""))
        if received:
            sys.exit(interrupted_status(received[0]))
    if said not in (None, LEARNER_DONE):  # dropped, and told so when it spoke again: start it again
        sys.exit(DROPPED_STATUS)


def _check_agent_keys(client: ClientConfig) -> None:
    """Both CURVE files or neither; a malformed key fails here, before the envs are built."""
    from .comms.keys import client_options

    if (client.curve_secret is None) != (client.curve_broker is None):
        raise click.UsageError("--curve-secret and --curve-broker go together (this agent's key and the broker's)")
    if client.curve is not None:
        try:
            client_options(*client.curve)
        except (ValueError, OSError) as err:
            raise click.ClickException(str(err)) from None


@contextlib.contextmanager
def _stop_on_signals():
    """SIGTERM (scancel) or Ctrl-C: set the event (the agent finishes its update, checkpoints and
    leaves) and note the signal, for the exit status; yields (the event, the signals). The handlers
    before it are back when the command ends: run in-process (CliRunner, a test), it left Ctrl-C
    swallowed for whatever ran next."""
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, frame):
        received.append(signum)
        stop.set()

    before = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop, received
    finally:
        for sig, handler in before.items():  # None: set outside Python, which Python cannot set back
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _agent_done(rank: int, summary: dict) -> None:
    """An agent's last lines: one for a person, then the summary as JSON for a script."""
    click.echo(
        f"agent-{rank} done: {summary['frames']:,} frames in {summary['wall_seconds']:.1f}s "
        f"({summary['fps']:,.0f} frames/s), {_returns_line(summary)}"
    )
    click.echo(
        json.dumps(
            {
                k: None if isinstance(v, float) and math.isnan(v) else v  # JSON has no NaN
                for k, v in summary.items()
                if not isinstance(v, dict)
            },
            default=str,
        )
    )


@main.command("eval")
@click.argument("run_dir", type=click.Path(path_type=Path))
@config.Settings("eval", config.settings_of(Eval)).options
def eval_cmd(run_dir, episodes, greedy, device, as_json, video_dir, video_episodes, import_env_module):
    """Play the final policies of a run: mean +- std per agent and overall (Table 1's protocol)."""
    require_rl("eval")
    check_device(device)
    from .rl.consensus import evaluate_consensus
    from .rl.evaluate import evaluate

    try:
        result = evaluate(run_dir, episodes=episodes, greedy=greedy, device=device, import_env_module=import_env_module)
        result["consensus"] = evaluate_consensus(
            run_dir, episodes=episodes, greedy=greedy, device=device, import_env_module=import_env_module
        )
    except (FileNotFoundError, ValueError) as err:  # CheckpointError is one; a module env id refused, another
        raise click.ClickException(str(err)) from None
    if video_dir is not None:
        from .rl.policy import load_policy, record_videos

        for agent in ["consensus", *sorted(result["agents"])]:
            policy = load_policy(run_dir, agent, device, import_env_module)
            files = record_videos(policy, video_dir, video_episodes, deterministic=greedy)
            click.echo(
                f"video: {len(files)} episode(s) in {files[0].parent}" if files else f"video: none written for {agent}",
                err=as_json,
            )
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for rank, r in sorted(result["agents"].items()):
        click.echo(f"agent-{rank}: {r['mean']:.1f} +- {r['std']:.1f} over {len(r['returns'])} episodes")
    o = result["overall"]
    click.echo(f"overall: {o['mean']:.1f} +- {o['std']:.1f} over {o['episodes']} episodes")
    c = result["consensus"]
    click.echo(
        f"consensus (mean of the {c['agents']} agents' parameters): {c['mean']:.1f} +- {c['std']:.1f} "
        f"over {len(c['returns'])} episodes"
    )


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@config.Settings("plot", config.settings_of(Plot)).options
def plot(run_dirs, output):
    """Draw return vs frames and vs wall-clock time, one line per run."""
    from .draw import plot_runs

    try:
        plot_runs(run_dirs, output)
    except FileNotFoundError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"curves drawn to {output}")


if __name__ == "__main__":
    main()
