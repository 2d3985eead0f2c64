"""Configuration from one source: the dataclasses, read as flags, as files and on resume.

The dataclasses of ``gossiprl.settings`` (SwarmConfig and each command's own), of
``gossiprl.comms.settings`` (BrokerConfig, ClientConfig) and of ``gossiprl.rl.settings``
(AgentConfig, the learners') declare every setting once: its name, type and default, and in the
attribute docstring under it what it means. From them this module makes

* the click options of every command (``Settings.options``): ``--field-name``, the field's
  default, its docstring as the help, a type from the annotation (bool: ``--x/--no-x``;
  ``X | None``: may stay unset; ``Path``: click.Path; ``tuple``: a repeatable flag;
  ``choices``: click.Choice);
* a command's values, from defaults < a config file (TOML, YAML, or a run's config.json) <
  the flags given on the command line (``Settings.resolve``);
* the configs themselves (``Settings.build``), without copying key by key;
* on ``--resume``, the run's own config.json as the base, and the refusal of flags that would
  change what the run has been learning with (``resume_values``);
* one flag per learner hyperparameter name (``--lr`` sets A2C's, PPO's or IMPALA's, whichever ``--algo``
  picks), refused with the valid ones named when the chosen learner has no such setting.

What a flag needs beyond its annotation goes in the field's ``metadata``, beside the field:
``flag`` (its name when not ``--field-name``), ``short`` (a one-letter alias), ``min`` / ``max``
/ ``min_open`` (a range), ``choices`` (the owning module's constant), ``metavar``, ``parse`` (a
function from the flag's text or a file's value to the field's value, raising ValueError that
says what is valid), ``cli_default`` (the command's default, where it deliberately differs from
the library's), ``switch`` (a bool that is a bare ``--x``, with no ``--no-x``), ``path``
(click.Path's checks, e.g. ``{"exists": True}``), ``required`` and ``may_change_on_resume``.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import textwrap
import tomllib
import types
import typing
from pathlib import Path

import click
from click.core import ParameterSource

from .rl.settings import ATARI_LR, LEARNERS
from .settings import RECORDS, AgentConfig, SwarmConfig, learned_with

SECTIONS = {"swarm": SwarmConfig, "agent": AgentConfig}
"""The sections of a run's config.json and the config each holds; each learner's config is
agent.<algo> (agent.a2c, agent.ppo, agent.impala)."""

ALIASES = {"env": "env_id"}
"""Flat keys a file may use for a field: the flag's name where it differs from the field's."""


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """A dataclass's attribute docstrings (the string right under each field), as one line each.

    Python keeps no such docstring at run time, so they are read from the class's source, as
    CleanRL's and tyro's argument parsers do."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of a config as a command takes it."""

    path: tuple[str, ...]
    """Where it sits in a run's config.json, e.g. ("agent", "a2c", "lr")."""
    kind: type
    """The field's type, None taken out."""
    optional: bool
    """The annotation admits None."""
    field: dataclasses.Field
    help: str
    learners: tuple[str, ...] = ()
    """The learners (--algo) that take this hyperparameter; empty for a setting that is no learner's."""
    defaults_differ: bool = False
    """The learners' defaults differ: the flag's default is None, each learner's own default."""

    @property
    def name(self) -> str:
        """The flag's parameter name and the key of a flat config file: the field's name."""
        return self.path[-1]

    @property
    def paths(self) -> tuple[tuple[str, ...], ...]:
        """Every place it sits in a run's config.json: a learner's hyperparameter in each learner's section."""
        if not self.learners:
            return (self.path,)
        return tuple((*self.path[:-2], algo, self.name) for algo in self.learners)

    @property
    def flag(self) -> str:
        return self.field.metadata.get("flag", "--" + self.name.replace("_", "-"))

    @property
    def default(self):
        if self.defaults_differ:
            return None
        if "cli_default" in self.field.metadata:
            return self.field.metadata["cli_default"]
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return self.field.default

    def option(self, default):
        """The click option for this field, with ``default`` (the field's unless a command overrides it)."""
        meta = self.field.metadata
        decls = [self.flag, *([meta["short"]] if "short" in meta else []), self.name]
        attrs = {"default": default, "show_default": True, "help": self.help}
        if self.kind is bool and meta.get("switch"):
            attrs.update(is_flag=True, show_default=False)
        elif self.kind is bool:
            decls[0] = f"{self.flag}/--no-{self.flag[2:]}"
        elif self.kind is tuple:
            attrs["multiple"] = True
        elif self.kind is Path:
            attrs["type"] = click.Path(**meta.get("path", {}), path_type=Path)
        elif self.kind is dict:
            attrs.update(
                multiple=True,
                type=KeyInteger(),
                default=tuple(default.items()),
                show_default=False,
                callback=lambda ctx, param, pairs: dict(pairs),
            )
        elif "parse" in meta:
            attrs["type"] = Parsed(meta["parse"], meta.get("metavar", self.kind.__name__.upper()))
        elif "choices" in meta:
            attrs["type"] = click.Choice(meta["choices"])
        elif self.kind in (int, float):
            bounds = {k: meta[k] for k in ("min", "max", "min_open", "max_open") if k in meta}
            attrs["type"] = (
                (click.IntRange if self.kind is int else click.FloatRange)(**bounds) if bounds else self.kind
            )
        if "metavar" in meta and "parse" not in meta:
            attrs["metavar"] = meta["metavar"]
        if meta.get("required"):
            attrs["required"] = True
        return click.option(*decls, **attrs)

    def from_file(self, value, ctx: click.Context, source: str):
        """A config file's value, checked as the flag would check its text."""
        hint = f"'{self.name}' in {source}"
        if value is None:
            if self.optional:
                return None
            raise click.BadParameter("cannot be null here", param_hint=hint)
        if self.kind is dict:
            if not isinstance(value, dict) or not all(type(v) is int for v in value.values()):
                raise click.BadParameter(f"{value!r}: give a table of integers, e.g. {{degree = 4}}", param_hint=hint)
            return {str(k).replace("-", "_"): v for k, v in value.items()}
        param = next(p for p in ctx.command.params if p.name == self.name)
        try:
            return param.type.convert(value, param, ctx)
        except click.BadParameter as err:
            raise click.BadParameter(err.message, param_hint=hint) from None

    def as_flag(self, value) -> str:
        """The flag that asks for ``value``, as a user would have typed it."""
        if self.kind is bool:
            return self.flag if value else f"--no-{self.flag[2:]}"
        if self.kind is dict:
            return " ".join(f"{self.flag} {k}={v}" for k, v in value.items())
        return f"{self.flag} {'none' if value is None else value}"


class KeyInteger(click.ParamType):
    """KEY=INTEGER, for the integer options of a topology family."""

    name = "KEY=INTEGER"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        key, sep, number = str(value).partition("=")
        if not sep or not number.lstrip("-").isdigit():
            self.fail(f"{value!r}: give KEY=INTEGER, e.g. degree=4", param, ctx)
        return key.replace("-", "_"), int(number)


class Parsed(click.ParamType):
    """A value with a syntax of its own, read by the field's ``parse`` function."""

    def __init__(self, parse, metavar: str):
        self.parse = parse
        self.name = metavar

    def convert(self, value, param, ctx):
        try:
            return self.parse(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


def settings_of(
    section: str | type, only: tuple[str, ...] | None = None, exclude: tuple[str, ...] = ()
) -> list[Setting]:
    """The fields of a config.json section, or of a config no run records (a dataclass: a
    command's own), nested configs flattened, as settings; ``only`` and ``exclude`` pick by field name."""
    found = []

    def walk(cls, path):
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if dataclasses.is_dataclass(kind):
                walk(kind, (*path, f.name))
                continue
            if (only is not None and f.name not in only) or f.name in exclude:
                continue
            if f.name not in docs:
                raise TypeError(f"{cls.__name__}.{f.name} has no docstring: --help would not say what it is")
            args = typing.get_args(kind) if isinstance(kind, types.UnionType) else ()
            optional = type(None) in args
            base = next((a for a in args if a is not type(None)), kind)
            found.append(Setting((*path, f.name), typing.get_origin(base) or base, optional, f, docs[f.name]))

    walk(SECTIONS.get(section, section), (section_of(section),))
    return merge_learners(found)


def section_of(source: str | type) -> str:
    """The first step of a setting's path: a config.json section's name, or the config class's."""
    if isinstance(source, str):
        return source
    return next((name for name, cls in SECTIONS.items() if cls is source), source.__name__)


def merge_learners(found: list[Setting]) -> list[Setting]:
    """One setting per learner hyperparameter name, in place of one per learner section.

    A name two learners share takes one flag: its help gives each learner's docstring and default
    where they differ, and its default is then None, which ``Settings.build`` leaves to the chosen
    learner's own. The flag's type and range must be the same in every learner that has it."""
    merged, groups = [], {}
    for s in found:
        if len(s.path) == 3 and s.path[:2] in {("agent", algo) for algo in LEARNERS}:
            if s.name not in groups:
                merged.append(s.name)
            groups.setdefault(s.name, []).append(s)
        else:
            merged.append(s)
    return [one_flag(groups[item]) if isinstance(item, str) else item for item in merged]


def one_flag(group: list[Setting]) -> Setting:
    """The one setting behind a learner hyperparameter's flag; ``group`` holds it once per learner."""
    first = group[0]
    if any((s.kind, s.field.metadata) != (first.kind, first.field.metadata) for s in group):
        raise TypeError(f"{first.name}: its learners give it different types or ranges; one flag cannot take both")
    defaults = [s.default for s in group]
    differ = any(d != defaults[0] for d in defaults)
    if not differ and all(s.help == first.help for s in group) and len(group) == len(LEARNERS):
        help_text = first.help
    else:
        help_text = " ".join(f"[{s.path[1]}{f', default {s.default}' if differ else ''}] {s.help}" for s in group)
    return dataclasses.replace(
        first,
        optional=differ or any(s.optional for s in group),
        help=help_text,
        learners=tuple(s.path[1] for s in group),
        defaults_differ=differ,
    )


class Settings:
    """The settings one command takes, as flags and in files, and the configs they build.

    ``flags_only`` are the command's own (where it writes, how it reports, where its broker is):
    flags, never read from a config file, which describes what is trained and how."""

    def __init__(self, command: str, *groups: list[Setting], defaults: dict | None = None, flags_only: tuple = ()):
        self.command = command
        self.by_name: dict[str, Setting] = {}
        """The settings a config file may give too."""
        self.flags: dict[str, Setting] = {}
        """Every setting the command takes as a flag: by_name's, then flags_only's."""
        for i, group in enumerate((*groups, *flags_only)):
            for setting in group:
                if setting.name in self.flags:
                    raise TypeError(f"`gossiprl {command}` would take {setting.name} twice")
                self.flags[setting.name] = setting
                if i < len(groups):
                    self.by_name[setting.name] = setting
        self.by_path = {path: s for s in self.flags.values() for path in s.paths}
        self.defaults = defaults or {}

    def options(self, fn):
        """Decorate a click command with one option per setting, in the configs' order."""
        for setting in reversed(self.flags.values()):
            fn = setting.option(self.defaults.get(setting.name, setting.default))(fn)
        return fn

    def given(self, ctx: click.Context) -> set[str]:
        """The settings whose flags were typed on the command line."""
        return {name for name in self.by_name if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE}

    def resolve(self, ctx: click.Context, base: dict | None = None) -> dict:
        """Every setting's value: the flag's where it was given, else ``base``'s, else the default."""
        given = self.given(ctx)
        values = {name: ctx.params[name] for name in self.by_name}
        values.update({name: value for name, value in (base or {}).items() if name not in given})
        self.check_learner(values, given | set(base or {}))
        return values

    def check_learner(self, values: dict, chosen: set[str]) -> None:
        """Refuse a hyperparameter, given as a flag or in a file, that the chosen --algo does not take."""
        algo = values.get("algo")
        foreign = sorted(n for n in chosen if self.by_name[n].learners and algo not in self.by_name[n].learners)
        if algo is None or not foreign:
            return
        valid = " ".join(s.flag for s in self.by_name.values() if algo in s.learners)
        owners = " / ".join(sorted({a for n in foreign for a in self.by_name[n].learners}))
        raise click.BadParameter(
            f"{'a setting' if len(foreign) == 1 else 'settings'} of --algo {owners}, not of --algo {algo}; "
            f"{algo} takes {valid}",
            param_hint=", ".join(self.by_name[n].flag for n in foreign),
        )

    def build(self, cls, values: dict, path: tuple[str, ...] | None = None):
        """``cls`` (SwarmConfig, AgentConfig, a command's own) from the values (a command's
        ``ctx.params`` will do for flags only); fields this command does not take keep their default."""
        path = path or (section_of(cls),)
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            setting = self.by_path.get((*path, f.name))
            if dataclasses.is_dataclass(hints[f.name]):
                # another learner's section than --algo's keeps its defaults
                other = path == ("agent",) and f.name in LEARNERS and values.get("algo", f.name) != f.name
                kwargs[f.name] = hints[f.name]() if other else self.build(hints[f.name], values, (*path, f.name))
            elif setting is not None and not (setting.learners and values[f.name] is None):
                kwargs[f.name] = values[f.name]
        return cls(**kwargs)

    def read(self, ctx: click.Context, data: dict, source: str) -> dict:
        """A config file's settings by name, checked. Flat keys (``lr = 1e-3``) must be settings of
        this command. In the sectioned shape of a run's config.json ({"swarm", "agent": {...,
        "a2c"}, "topology"}) fields this command does not take are passed over: the file
        describes a whole run, of which an agent, say, takes only its own part."""
        values = {}
        if "swarm" in data or "agent" in data:
            for key in data.keys() - {*SECTIONS, *RECORDS}:
                self._unknown(key, source, ["swarm", "agent", *RECORDS])
            known = {p for name in SECTIONS for s in settings_of(name) for p in s.paths}
            data = _upgrade(data)
            algo = data["agent"].get("algo") or ctx.params.get("algo") or "a2c"
            for path, value in _leaves(data):
                if path in self.by_path and path[:2] in {("agent", a) for a in LEARNERS} - {("agent", algo)}:
                    self._other_learner(path, value, algo, source)
                elif path in self.by_path:
                    values[path[-1]] = self.by_path[path].from_file(value, ctx, source)
                elif path not in known:
                    self._unknown(".".join(path), source, sorted(".".join(p) for p in known))
            return values
        for key, value in data.items():
            name = ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
            if name not in self.by_name:
                self._unknown(key, source, sorted(self.by_name))
            values[name] = self.by_name[name].from_file(value, ctx, source)
        return values

    def _other_learner(self, path: tuple[str, ...], value, algo: str, source: str) -> None:
        """A run's record holds every learner's section, the others at their defaults: those are
        passed over; a value set in another learner's section than the file's algo is refused."""
        if value != getattr(LEARNERS[path[1]](), path[-1]):
            raise click.BadParameter(
                f"{source}: {'.'.join(path)} is a setting of --algo {path[1]}, and this run's algo is {algo}; "
                f"move it to [agent.{algo}] if {algo} takes it, or set algo = {path[1]!r}",
                param_hint="--config",
            )

    def _unknown(self, key: str, source: str, valid: list[str]):
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise click.BadParameter(
            f"{source}: {key!r} is not a setting of `gossiprl {self.command}`{hint}; valid: {', '.join(valid)}",
            param_hint="--config",
        )


def _leaves(data: dict, path: tuple[str, ...] = ()):
    """(path, value) of every setting in a sectioned config; the top-level records (``RECORDS``)
    are no settings."""
    for key, value in data.items():
        if not path and key in RECORDS:
            continue
        if isinstance(value, dict) and (not path or key in LEARNERS):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def _upgrade(data: dict) -> dict:
    """A run's config.json written by an older gossiprl, in today's terms, so a resumed run learns
    with what it started with.

    Before the swarm held its budget and agents_per_host had that name, agent.agents was agents
    per host, and the swarm's budget was agent.total_frames x agents. Before shared_init existed
    (a whole run's dump has checkpoint_every and a2c; a file a person wrote need not), every agent
    drew its own initial network, and an unset entropy_coef meant 0 on MinAtar, where it now means
    the papers' 0.01. Before overlap_lr_scale existed, overlapped gossip kept the learning rate as
    given. Before there was more than one learner, every run was A2C. Before MinAtar had its own A2C
    rate, the A2C section of a PPO or IMPALA run recorded the then default 7e-4, which is None now
    (an A2C run keeps the 7e-4 it learned with). What an unset learner setting stood for is read on
    resume (``settings.learned_with``), not here: a file given as --config asks for its env's default."""
    swarm, agent = dict(data.get("swarm") or {}), dict(data.get("agent") or {})
    if "agents" in agent:
        agent["agents_per_host"] = agent.pop("agents")
        if "total_frames" not in swarm and "total_frames" in agent and "agents" in swarm:
            swarm["total_frames"] = agent["total_frames"] * swarm["agents"]
    if {"checkpoint_every", "a2c"} <= agent.keys() and "shared_init" not in agent:
        agent["shared_init"] = False
        a2c = dict(agent["a2c"] or {})
        if a2c.get("entropy_coef") is None and str(agent.get("env_id", "")).startswith("MinAtar/"):
            a2c["entropy_coef"] = 0.0  # rl.envs.is_minatar's test, without importing the RL stack
        agent["a2c"] = a2c
    if {"checkpoint_every", "gossip_overlap"} <= agent.keys() and "overlap_lr_scale" not in agent:
        agent["overlap_lr_scale"] = False
    if {"checkpoint_every", "a2c"} <= agent.keys() and "algo" not in agent:
        agent["algo"] = "a2c"
    if agent.get("algo", "a2c") != "a2c" and (agent.get("a2c") or {}).get("lr") == ATARI_LR:
        agent["a2c"] = {**agent["a2c"], "lr": None}
    return {**data, "swarm": swarm, "agent": agent}


def _learned_view(data: dict, path: Path) -> dict:
    """A run's config.json with the learner settings it left to the env's default (None) as the run
    learned with them (``settings.learned_with``): what a resume's flags are checked against."""
    agent = dict(data.get("agent") or {})
    algo = agent.get("algo") or "a2c"
    if not isinstance(agent.get(algo), dict):
        return data
    try:
        learned = learned_with(data)
    except ValueError as err:
        raise click.ClickException(f"cannot resume: {path}: {err}") from None
    return {**data, "agent": {**agent, algo: {**agent[algo], **learned}}}


MAX_CONFIG_BYTES = 1 << 20
"""A config file is a page of settings: a larger one is refused before it is parsed."""


def _yaml(text: str):
    """YAML without aliases: a settings file needs none, and a 530-byte file of nested aliases
    (a "billion laughs") once took the loader to 2.3 GB expanding them."""
    import yaml  # the rl extra's; imported here so the comms-only install never needs it

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise ValueError(f"aliases (*name) are not allowed in a config file ({self.peek_event().start_mark})")
            return super().compose_node(parent, index)

    return yaml.load(text, Loader=NoAliases)


READERS = {".toml": tomllib.loads, ".yaml": _yaml, ".yml": _yaml, ".json": json.loads}


def load_file(path: Path) -> dict:
    """A TOML, YAML or JSON file's table of settings, or one line saying why not."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in READERS:
        raise click.BadParameter(f"{path}: give a .toml, .yaml / .yml or .json file", param_hint="--config")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise click.BadParameter(
                f"{path} is over {MAX_CONFIG_BYTES:,} bytes: a config file holds a page of settings",
                param_hint="--config",
            )
        data = READERS[suffix](raw.decode())
    except click.BadParameter:
        raise
    except OSError as err:
        raise click.BadParameter(f"cannot read {path}: {err.strerror}", param_hint="--config") from None
    except ImportError:
        raise click.BadParameter("YAML files need PyYAML: pip install pyyaml", param_hint="--config") from None
    except Exception as err:  # tomllib, yaml and json each raise their own error type
        raise click.BadParameter(
            f"{path} is not valid {suffix[1:].upper()}: {' '.join(str(err).split())}", param_hint="--config"
        ) from None
    if data is None:  # an empty YAML file
        return {}
    if not isinstance(data, dict):
        raise click.BadParameter(
            f"{path} holds a {type(data).__name__}, not a table of settings", param_hint="--config"
        )
    return data


def config_option(fn):
    """--config FILE, for the commands that take settings from a file. Written by hand: it says where
    settings come from, and is no setting itself."""
    return click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Settings from a TOML or YAML file, or a run's config.json: flat keys (lr = 1e-3, env = "
        "'Acrobot-v1') or [swarm] / [agent] / [agent.a2c] / [agent.ppo] / [agent.impala] sections. "
        "Flags given here win over the file.",
    )(fn)


def file_values(ctx: click.Context, settings: Settings, config_file: Path | None) -> dict:
    """Defaults < the --config file < flags: the command's values."""
    base = settings.read(ctx, load_file(config_file), str(config_file)) if config_file is not None else {}
    return settings.resolve(ctx, base)


def resume_values(ctx: click.Context, settings: Settings, run_dir: Path | None, config_file: Path | None) -> dict:
    """The values of a resumed run: its config.json < flags given now.

    A resumed run goes on learning what it learned, so a flag may differ from the saved value
    only for a field marked ``may_change_on_resume``: how long and how the swarm runs (its
    budget, time limit, stop rule, transport and data plane, the device, threads, logging and
    checkpoint periods), never what the agents learn with (agents, topology, mode, env, seed,
    the learner and its hyperparameters, codec, aggregation). Flags equal to the saved value are fine."""
    if run_dir is None:
        raise click.UsageError("--resume needs --run-dir: the run to continue")
    if config_file is not None:
        raise click.UsageError(f"--resume takes its settings from {run_dir / 'config.json'}: drop --config")
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise click.ClickException(f"cannot resume: {run_dir} holds no run (no config.json)")
    data = load_file(path)
    saved = settings.read(ctx, data, str(path))
    try:
        learned = settings.read(ctx, _learned_view(data, path), str(path))
    except click.BadParameter as err:  # the agent section read above: the record's value is the bad one
        raise click.ClickException(f"cannot resume: {path}'s learned_with: {err.format_message()}") from None
    conflicts, given = [], settings.given(ctx)
    for name, setting in settings.by_name.items():
        if (
            name in given
            and name in learned
            and ctx.params[name] != learned[name]
            and not setting.field.metadata.get("may_change_on_resume")
        ):
            conflicts.append(f"{setting.as_flag(ctx.params[name])} conflicts with the run's {name}={learned[name]}")
    if conflicts:
        flags = "the flag" if len(conflicts) == 1 else "these flags"
        raise click.ClickException(
            f"cannot resume {run_dir}: {', '.join(conflicts)} (config.json); drop {flags} or start a new --run-dir"
        )
    values = settings.resolve(ctx, saved)
    # a flag repeating what an unset setting learned with leaves it asking for the env's default
    return {k: None if saved.get(k, 0) is None and k in given and v == learned.get(k) else v for k, v in values.items()}
