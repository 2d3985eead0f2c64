"""Configuration from one source: flags generated from the dataclasses, config files, resume rules.

The commands are invoked for real, with launch.run / launch.run_agent replaced by a recorder
that keeps the configs they were handed and stops there, so nothing trains."""

import json
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field

import pytest

from gossiprl import cli, config, launch
from gossiprl.launch import SwarmConfig
from gossiprl.rl.settings import A2CConfig, AgentConfig
from helpers import invoke


@pytest.fixture
def recorded(monkeypatch):
    """What launch.run and launch.run_agent were asked to do; each call ends the command."""
    calls = []

    def record(*args, **kw):
        calls.append((args, kw))
        raise launch.RunError("recorded")

    monkeypatch.setattr(launch, "run", record)
    monkeypatch.setattr(launch, "run_agent", record)
    return calls


def squash(text: str) -> str:
    """--help wraps lines (and words at hyphens) anywhere: compare without any whitespace."""
    return "".join(text.split())


@pytest.mark.parametrize(
    "command,settings,at_least",
    [
        (["run"], cli.RUN_SETTINGS, 5),
        (["agent"], cli.AGENT_SETTINGS, 5),
        (["bench", "train"], cli.BENCH_TRAIN_SETTINGS, 3),  # env, device, data plane: the rows fix the rest
    ],
)
def test_help_shows_every_fields_docstring_and_default(command, settings, at_least):
    shown = squash(invoke(*command, "--help").output)
    assert len(settings.by_name) >= at_least
    for name, setting in settings.by_name.items():
        assert squash(setting.help) in shown, name
        default = settings.defaults.get(name, setting.default)
        if setting.kind is bool and default is not None:
            assert f"default:{'' if default else 'no-'}{setting.flag[2:]}]" in shown, name
        elif default not in (None, {}):
            assert f"default:{default}" in shown, name


def test_help_keeps_the_documented_flag_names_and_defaults():
    shown = squash(invoke("run", "--help").output)
    for flag in (
        "--env",
        "--total-frames",
        "--seed",
        "--device",
        "--torch-threads",
        "--num-envs",
        "--n-steps",
        "--lr",
        "--entropy-coef",
        "--gossip-every",
        "--aggregate",
        "--deviation-bound",
        "--codec",
        "--run-dir",
        "--resume",
        "--topology",
        "-n,--agents",
        "--mode",
        "--max-staleness",
        "--transport",
        "--data-plane",
        "--stop-at-return",
        "--max-seconds",
        "--fail-fast",
        "--peers",
        "--time-varying",
        "--peers-per-round",
        "--option",
        "--config",
    ):
        assert flag in shown, flag
    assert "[default:2000000;x>=1]" in shown and "[default:auto]" in shown  # --total-frames, --stop-at-return
    assert "--agents-per-host" in squash(invoke("agent", "--help").output)


def test_field_docs_reads_the_string_under_each_field():
    @dataclass
    class Example:
        plain: int = 1
        """One line."""
        spread: float = field(default=2.0, metadata={"min": 0})
        """Two
        lines."""
        undocumented: str = "x"

    assert config.field_docs(Example) == {"plain": "One line.", "spread": "Two lines."}


def test_choices_come_from_the_modules_constants():
    from gossiprl.comms.dataplane import PLANES
    from gossiprl.comms.gossip import AGGREGATES
    from gossiprl.comms.turnlocks import MODES
    from gossiprl.comms.wire import CODECS

    for name, valid in (("mode", MODES), ("codec", CODECS), ("data_plane", PLANES), ("aggregate", AGGREGATES)):
        assert cli.RUN_SETTINGS.by_name[name].field.metadata["choices"] is valid


def test_a_toml_file_sets_values(tmp_path, recorded):
    path = tmp_path / "run.toml"
    path.write_text(
        'lr = 1e-3\nenv = "Acrobot-v1"\nagents = 3\ntopology = "full"\nfail_fast = true\n[topology_options]\n'
    )
    result = invoke("run", "--config", path, "--run-dir", tmp_path / "r", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (swarm, cfg, _), _ = recorded[0]
    assert cfg.a2c.lr == 1e-3 and cfg.env_id == "Acrobot-v1"
    assert swarm.agents == 3 and swarm.topology == "full" and swarm.fail_fast is True
    assert cfg.a2c.n_steps == A2CConfig().n_steps  # what the file leaves out keeps its default


def test_a_yaml_file_in_sections_sets_values(tmp_path, recorded):
    path = tmp_path / "run.yaml"
    path.write_text(
        "swarm:\n  agents: 2\n  mode: async\n  max_staleness: 3\n  topology_options: {}\n"
        "agent:\n  seed: 7\n  deviation_bound: null\n  a2c:\n    n_steps: 3\n    entropy_coef: 0.02\n"
    )
    result = invoke("run", "--config", path, "--run-dir", tmp_path / "r", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (swarm, cfg, _), _ = recorded[0]
    assert (swarm.agents, swarm.mode, swarm.max_staleness) == (2, "async", 3)
    assert cfg.seed == 7 and cfg.deviation_bound is None
    assert cfg.a2c.n_steps == 3 and cfg.a2c.entropy_coef == 0.02


def test_a_runs_config_json_sets_values(tmp_path, recorded):
    """The whole record of a run: run takes the swarm's budget, not agent.total_frames (per agent)."""
    saved = {
        "swarm": asdict(SwarmConfig(agents=3, topology="full", total_frames=6000, codec="bf16")),
        "agent": asdict(AgentConfig(seed=5, total_frames=2000, agents_per_host=3, a2c=A2CConfig(num_envs=8))),
        "topology": {"name": "full", "n": 3},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    result = invoke("run", "--config", path, "--run-dir", tmp_path / "r", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (swarm, cfg, _), _ = recorded[0]
    assert (swarm.agents, swarm.topology, swarm.total_frames, swarm.codec) == (3, "full", 6000, "bf16")
    assert cfg.seed == 5 and cfg.a2c.num_envs == 8
    # an agent of a multi-host swarm takes its own part of the same record: its budget, and the codec
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    result = invoke("agent", "--connect", "tcp://127.0.0.1:9", "--rank", 0, "--config", path, "--run-dir", tmp_path)
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    # and gives back the signal handlers it set: in-process, they swallowed Ctrl-C for whatever ran next
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    (_, _, agent_cfg, _), kw = recorded[1]
    assert agent_cfg.total_frames == 2000 and agent_cfg.a2c.num_envs == 8 and kw["codec"] == "bf16"


def test_a_flag_beats_the_file(tmp_path, recorded):
    path = tmp_path / "run.toml"
    path.write_text("lr = 1e-3\nseed = 9\n")
    result = invoke("run", "--config", path, "--lr", 2e-3, "--run-dir", tmp_path / "r", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, cfg, _), _ = recorded[0]
    assert cfg.a2c.lr == 2e-3 and cfg.seed == 9


@pytest.mark.parametrize(
    "text,words",
    [
        ("lrr = 1e-3\n", ["'lrr' is not a setting of `gossiprl run`", "did you mean 'lr'?", "valid: "]),
        ("n_steps = 0\n", ["'n_steps' in", "0 is not in the range x>=1"]),
        ('mode = "eventual"\n', ["'mode' in", "'eventual' is not one of 'sync', 'async'"]),
        ("agents_per_host = 2\n", ["'agents_per_host' is not a setting of `gossiprl run`"]),
        ("[agent.a2c]\nlearning_rate = 1\n", ["'agent.a2c.learning_rate' is not a setting"]),
        ("lr = \n", ["is not valid TOML"]),
    ],
)
def test_unknown_keys_and_bad_values_are_refused_in_one_line_and_nothing_starts(tmp_path, recorded, text, words):
    _refused_in_one_line(tmp_path, recorded, "run.toml", text, words)


def _refused_in_one_line(tmp_path, recorded, name, text, words):
    """`run --config` a file holding ``text``: one Error line with ``words``, and nothing started."""
    path = tmp_path / name
    path.write_text(text)
    result = invoke("run", "--config", path, "--run-dir", tmp_path / "r", "--no-progress")
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and all(w in error[0] for w in words), result.output
    assert recorded == [] and not (tmp_path / "r").exists()


def _saved_run(tmp_path, **swarm):
    run_dir = tmp_path / "x"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(
        json.dumps(
            {
                "swarm": asdict(SwarmConfig(**{"agents": 4, "total_frames": 8000, **swarm})),
                "agent": asdict(AgentConfig(seed=5, agents_per_host=4, total_frames=2000)),
                "topology": None,
            }
        )
    )
    return run_dir


def test_resume_refuses_a_conflicting_flag_naming_it(tmp_path, recorded):
    run_dir = _saved_run(tmp_path)
    result = invoke("run", "--run-dir", run_dir, "--resume", "--agents", 2, "--no-progress")
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: cannot resume {run_dir}: --agents 2 conflicts with the run's agents=4 "
        "(config.json); drop the flag or start a new --run-dir"
    )
    result = invoke("run", "--run-dir", run_dir, "--resume", "--seed", 6, "--mode", "async", "--no-progress")
    assert result.exit_code == 1
    assert (
        "--mode async conflicts with the run's mode=sync, --seed 6 conflicts with the run's seed=5 "
        "(config.json); drop these flags"
    ) in result.output
    assert recorded == []


def test_resume_accepts_equal_flags_and_the_ones_that_may_change(tmp_path, recorded):
    run_dir = _saved_run(tmp_path, max_seconds=100.0)
    result = invoke(
        "run",
        "--run-dir",
        run_dir,
        "--resume",
        "--agents",
        4,
        "--seed",
        5,
        "--total-frames",
        16000,
        "--max-seconds",
        50,
        "--device",
        "cpu",
        "--no-progress",
    )
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (swarm, cfg, _), kw = recorded[0]
    assert kw["resume"] is True
    assert (swarm.agents, swarm.total_frames, swarm.max_seconds, swarm.topology) == (4, 16000, 50.0, "ring")
    assert cfg.seed == 5 and cfg.device == "cpu"


def test_resume_takes_the_saved_settings_not_the_defaults(tmp_path, recorded):
    run_dir = _saved_run(tmp_path, codec="fp16", stop_at_return=None)
    result = invoke("run", "--run-dir", run_dir, "--resume", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (swarm, cfg, _), _ = recorded[0]
    assert swarm.codec == "fp16" and swarm.total_frames == 8000 and swarm.stop_at_return is None and cfg.seed == 5


def test_resume_without_run_dir_is_refused_and_makes_no_directory(tmp_path, monkeypatch, recorded):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "--resume", "--no-progress")
    assert result.exit_code == 2 and "Error: --resume needs --run-dir: the run to continue" in result.output
    assert recorded == [] and list(tmp_path.iterdir()) == []


def test_resume_with_a_config_file_is_refused(tmp_path, recorded):
    run_dir = _saved_run(tmp_path)
    path = tmp_path / "run.toml"
    path.write_text("lr = 1e-3\n")
    result = invoke("run", "--run-dir", run_dir, "--resume", "--config", path)
    assert result.exit_code == 2 and "drop --config" in result.output and recorded == []


def test_a_config_json_from_before_agents_per_host_still_resumes(tmp_path, recorded):
    """Runs started before the rename saved agent.agents and no swarm budget."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    agent = {**asdict(AgentConfig(total_frames=1500)), "agents": 2}
    del agent["agents_per_host"]
    swarm = asdict(SwarmConfig(agents=2))
    del swarm["total_frames"]
    (run_dir / "config.json").write_text(json.dumps({"swarm": swarm, "agent": agent, "topology": None}))
    result = invoke("run", "--run-dir", run_dir, "--resume", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (swarm_cfg, _, _), _ = recorded[0]
    assert swarm_cfg.total_frames == 3000


def test_a_config_json_from_before_shared_init_resumes_with_what_it_learned_with(tmp_path, recorded):
    """Runs started before shared_init drew one network per agent, and their MinAtar entropy_coef
    of None meant 0 then: a resume keeps both, while a new run takes today's defaults."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    agent = asdict(AgentConfig(env_id="MinAtar/Breakout-v1", total_frames=1500))
    del agent["shared_init"], agent["gossip_overlap"]
    swarm = asdict(SwarmConfig(agents=2))
    (run_dir / "config.json").write_text(json.dumps({"swarm": swarm, "agent": agent, "topology": None}))
    result = invoke("run", "--run-dir", run_dir, "--resume", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, agent_cfg, _), _ = recorded[0]
    assert (agent_cfg.shared_init, agent_cfg.gossip_overlap, agent_cfg.a2c.entropy_coef) == (False, False, 0.0)
    invoke("run", "--env", "MinAtar/Breakout-v1", "--run-dir", tmp_path / "new", "--no-progress")
    (_, fresh, _), _ = recorded[1]
    assert (fresh.shared_init, fresh.gossip_overlap, fresh.a2c.entropy_coef) == (True, False, None)


def _old_dump(run_dir, env, algo="a2c", asked=None, **learned_with):
    """A run's config.json as gossiprl wrote it before it recorded what its learner learned with
    (or with that record, given)."""
    run_dir.mkdir()
    agent = AgentConfig(env_id=env, total_frames=1500, algo=algo, a2c=asked or A2CConfig())
    data = {"swarm": asdict(SwarmConfig(agents=1)), "agent": asdict(agent)}
    if learned_with:
        data["learned_with"] = learned_with
    (run_dir / "config.json").write_text(json.dumps(data))
    return run_dir


@pytest.mark.parametrize(
    "env, algo, asked, learned",
    [
        ("MinAtar/Breakout-v1", "a2c", None, {"lr": 1.4e-3}),
        ("MinAtar/Breakout-v1", "a2c", A2CConfig(lr=7e-4), {"lr": 7e-4}),
        ("MinAtar/Breakout-v1", "ppo", None, {}),
        ("CartPole-v1", "a2c", None, {}),
    ],
)
def test_what_a_run_recorded_before_the_learned_with_record_learned_with(tmp_path, env, algo, asked, learned):
    """MinAtar's A2C rate moved from 7e-4 (recorded outright) to 1.4e-3 (unset) to 2.8e-3. A run recorded
    before config.json said what it learned with resumes at what it learned with, though a caller of the
    Python API leaves the rate unset: 1.4e-3 for A2C on MinAtar with its rate unset, what it asked for where
    it asked; a PPO run's A2C section and a run off MinAtar stood for the env's defaults, then as now."""
    run_dir = _old_dump(tmp_path / "run", env, algo, asked)
    cfg = AgentConfig(env_id=env, algo=algo)
    section = getattr(launch._resumed_learner(run_dir, cfg), algo)
    assert {k: v for k, v in asdict(section).items() if v != getattr(getattr(cfg, algo), k)} == learned


def test_what_unset_settings_stood_for_where_a_default_has_moved_since():
    """MinAtar's A2C rate was 1.4e-3 until it moved to 2.8e-3: what a record from before says, read by
    the env's id."""
    from gossiprl.rl.settings import PREVIOUS_MINATAR_LR, meant_then

    assert meant_then("a2c", "MinAtar/Breakout-v1", {"lr": None}) == {"lr": PREVIOUS_MINATAR_LR}
    assert (
        meant_then("a2c", "MinAtar/Breakout-v1", {"lr": 1e-3}) == meant_then("a2c", "CartPole-v1", {"lr": None}) == {}
    )
    # no record tells an IMPALA control-task run of 20-step unrolls in batches of 2 from a later one given
    # --n-steps 20 (batches of 4): read as today's
    assert meant_then("impala", "CartPole-v1", {"n_steps": 20, "batch_size": None}) == {}


def test_a_resume_is_checked_against_what_the_run_learned_with_and_keeps_the_env_default_asked(tmp_path, recorded):
    """The flags of a resume are checked against the settings the run learned with, not the None its
    agent section keeps for "the env's default"; the values passed on keep that None, a flag repeating
    the learned value too, and the launcher reads it as the run learned with (so config.json keeps
    asking for the env's default)."""
    run_dir = _old_dump(tmp_path / "run", "MinAtar/Breakout-v1")
    refused = invoke("run", "--run-dir", run_dir, "--resume", "--lr", 0.0028, "--no-progress")
    assert refused.exit_code == 1 and "--lr 0.0028 conflicts with the run's lr=0.0014" in refused.output
    for flags in ([], ["--lr", 0.0014]):
        result = invoke("run", "--run-dir", run_dir, "--resume", *flags, "--no-progress")
        assert result.exit_code == 1 and "recorded" in result.output, result.output
        (_, agent_cfg, _), kwargs = recorded[-1]
        assert kwargs["resume"] and agent_cfg.a2c.lr is None


def test_a_resumed_run_keeps_the_settings_it_recorded_learning_with_and_a_new_one_takes_its_envs(tmp_path, recorded):
    """config.json's agent section leaves a setting to the env's default (None) and records beside it
    what that was for the run ("learned_with"): a resume keeps that, whatever the default is by then;
    a new run given the file as --config, on another env, takes that env's defaults. A record that is
    none is refused in one line."""
    learned = {**asdict(A2CConfig()), "lr": 0.005, "entropy_coef": 0.02, "clip_rewards": False}
    run_dir = _old_dump(tmp_path / "run", "MinAtar/Breakout-v1", a2c=learned)
    resumed = launch._resumed_learner(run_dir, AgentConfig(env_id="MinAtar/Breakout-v1")).a2c
    assert (resumed.lr, resumed.entropy_coef, resumed.clip_rewards) == (0.005, 0.02, False)
    given = launch._resumed_learner(run_dir, AgentConfig(env_id="MinAtar/Breakout-v1", a2c=A2CConfig(lr=0.001))).a2c
    assert (given.lr, given.entropy_coef) == (0.001, 0.02)  # a setting given is the resume's, and was checked
    invoke("run", "--config", run_dir / "config.json", "--env", "CartPole-v1", "--run-dir", tmp_path / "new")
    (_, fresh, _), kwargs = recorded[-1]
    assert (fresh.env_id, fresh.a2c.lr, fresh.a2c.entropy_coef, kwargs["resume"]) == ("CartPole-v1", None, None, False)
    broken = _old_dump(tmp_path / "broken", "MinAtar/Breakout-v1", a2c="oops")
    with pytest.raises(
        launch.RunError, match="cannot resume: .*config.json: its 'learned_with' holds no record of a2c"
    ):
        launch._resumed_learner(broken, AgentConfig(env_id="MinAtar/Breakout-v1"))
    result = invoke("run", "--run-dir", broken, "--resume", "--no-progress")
    assert result.exit_code == 1 and "holds no record of a2c's settings" in result.output, result.output


def test_a_ppo_run_from_before_minatars_a2c_rate_resumes(tmp_path, recorded):
    """A PPO run's record holds A2C's section too, at the default of its day: 7e-4 before the A2C
    rate became None (the env's rate). That section never decided anything the run did, so it is
    no setting of the wrong learner and the run resumes; an A2C run keeps the 7e-4 it learned with."""
    for algo in ("ppo", "a2c"):
        run_dir = tmp_path / algo
        run_dir.mkdir()
        agent = asdict(AgentConfig(env_id="MinAtar/Breakout-v1", total_frames=1500, algo=algo))
        agent["a2c"]["lr"] = 7e-4
        (run_dir / "config.json").write_text(json.dumps({"swarm": asdict(SwarmConfig(agents=1)), "agent": agent}))
        result = invoke("run", "--run-dir", run_dir, "--resume", "--no-progress")
        assert result.exit_code == 1 and "recorded" in result.output, result.output
        (_, agent_cfg, _), _ = recorded[-1]
        assert (agent_cfg.algo, agent_cfg.a2c.lr) == (algo, None if algo == "ppo" else 7e-4)


def test_an_overlapped_run_from_before_the_lr_rule_resumes_with_its_learning_rate(tmp_path, recorded):
    """Overlapped runs started before overlap_lr_scale used the learning rate as given."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    agent = asdict(AgentConfig(total_frames=1500, gossip_overlap=True))
    del agent["overlap_lr_scale"]
    (run_dir / "config.json").write_text(json.dumps({"swarm": asdict(SwarmConfig(agents=2)), "agent": agent}))
    result = invoke("run", "--run-dir", run_dir, "--resume", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, agent_cfg, _), _ = recorded[0]
    assert (agent_cfg.gossip_overlap, agent_cfg.overlap_lr_scale) == (True, False)
    invoke("run", "--gossip-overlap", "--run-dir", tmp_path / "new", "--no-progress")
    (_, fresh, _), _ = recorded[1]
    assert (fresh.gossip_overlap, fresh.overlap_lr_scale) == (True, True)


def test_the_command_line_is_built_without_importing_torch():
    """The settings dataclasses are torch-free so `gossiprl broker` starts on the comms-only install."""
    code = "import sys, gossiprl.cli; print(sorted({'torch', 'gymnasium'} & sys.modules.keys()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abc", "bcd")
)  # 9**4 items here; the 530-byte classic nests nine levels deep (9**9)


@pytest.mark.parametrize(
    "name,text,words",
    [
        ("bomb.yaml", BOMB, ["not valid YAML", "aliases (*name) are not allowed"]),
        ("big.toml", "# " + "x" * config.MAX_CONFIG_BYTES + "\n", ["is over 1,048,576 bytes"]),
    ],
)
def test_a_yaml_alias_bomb_or_an_oversized_file_is_refused_before_it_is_expanded(tmp_path, recorded, name, text, words):
    """Issue 19 F14: a 530-byte YAML alias bomb took the config loader to 2.3 GB."""
    _refused_in_one_line(tmp_path, recorded, name, text, words)


# ------------------------------------------------------------------ the learner (--algo) and its hyperparameters


def test_algo_picks_the_section_the_shared_flags_set(tmp_path, recorded):
    from gossiprl.rl.settings import PPOConfig

    result = invoke("run", "--algo", "ppo", "--lr", 1e-3, "--clip-coef", 0.3, "--run-dir", tmp_path / "r")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, cfg, _), _ = recorded[0]
    assert cfg.algo == "ppo" and (cfg.ppo.lr, cfg.ppo.clip_coef, cfg.ppo.n_steps) == (1e-3, 0.3, 128)
    assert cfg.a2c == A2CConfig()  # the learner not chosen keeps its defaults
    invoke("run", "--lr", 1e-3, "--run-dir", tmp_path / "s")
    (_, cfg, _), _ = recorded[1]
    assert cfg.algo == "a2c" and cfg.a2c.lr == 1e-3 and cfg.ppo == PPOConfig()


@pytest.mark.parametrize(
    "args,words",
    [
        (["--algo", "sac"], ["'sac' is not one of 'a2c', 'ppo', 'impala'"]),
        (
            ["--algo", "ppo", "--rmsprop-alpha", 0.9],
            ["--rmsprop-alpha: a setting of --algo a2c / impala, not of --algo ppo; ppo takes", "--gae-lambda"],
        ),
        (
            ["--algo", "impala", "--clip-coef", 0.1],
            ["--clip-coef: a setting of --algo ppo, not of --algo impala; impala takes", "--rho-bar", "--queue-size"],
        ),
        (
            ["--algo", "a2c", "--actors-per-agent", 4],
            ["--actors-per-agent: a setting of --algo impala, not of --algo a2c"],
        ),
        (
            ["--clip-coef", 0.1, "--update-epochs", 2],
            ["--clip-coef, --update-epochs: settings of --algo ppo, not of --algo a2c", "a2c takes --num-envs"],
        ),
    ],
)
def test_an_unknown_algo_or_another_learners_flag_is_refused_in_one_line(tmp_path, recorded, args, words):
    result = invoke("run", *args, "--run-dir", tmp_path / "r", "--no-progress")
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and all(w in error[0] for w in words), result.output
    assert recorded == []


@pytest.mark.parametrize(
    "text,words",
    [
        (
            'algo = "ppo"\nrmsprop_alpha = 0.9\n',
            ["--rmsprop-alpha: a setting of --algo a2c / impala, not of --algo ppo"],
        ),
        ("[agent]\nseed = 2\n[agent.ppo]\nclip_coef = 0.3\n", ["agent.ppo.clip_coef is a setting of --algo ppo"]),
    ],
)
def test_a_file_setting_another_learners_hyperparameter_is_refused(tmp_path, recorded, text, words):
    _refused_in_one_line(tmp_path, recorded, "run.toml", text, words)


def test_a_ppo_run_resumes_as_ppo_and_refuses_another_algo(tmp_path, recorded):
    from gossiprl.rl.settings import PPOConfig

    run_dir = tmp_path / "x"
    run_dir.mkdir()
    agent = asdict(AgentConfig(algo="ppo", total_frames=2000, ppo=PPOConfig(lr=1e-3, num_envs=2)))
    (run_dir / "config.json").write_text(json.dumps({"swarm": asdict(SwarmConfig(agents=1)), "agent": agent}))
    result = invoke("run", "--run-dir", run_dir, "--resume", "--lr", 1e-3, "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, cfg, _), _ = recorded[0]
    assert cfg.algo == "ppo" and (cfg.ppo.lr, cfg.ppo.num_envs) == (1e-3, 2) and cfg.a2c == A2CConfig()
    result = invoke("run", "--run-dir", run_dir, "--resume", "--algo", "a2c", "--no-progress")
    assert result.exit_code == 1 and "--algo a2c conflicts with the run's algo=ppo" in result.output
    result = invoke("run", "--run-dir", run_dir, "--resume", "--lr", 2e-3, "--no-progress")
    assert result.exit_code == 1 and "--lr 0.002 conflicts with the run's lr=0.001" in result.output
    assert len(recorded) == 1


def test_an_impala_run_resumes_as_impala_and_refuses_another_algo(tmp_path, recorded):
    from gossiprl.rl.settings import ImpalaConfig

    run_dir = tmp_path / "x"
    run_dir.mkdir()
    agent = asdict(AgentConfig(algo="impala", total_frames=2000, impala=ImpalaConfig(actors_per_agent=3)))
    agent["impala"]["n_steps"] = 20  # as a run recorded it before control tasks got 5-step unrolls by default
    (run_dir / "config.json").write_text(json.dumps({"swarm": asdict(SwarmConfig(agents=1)), "agent": agent}))
    result = invoke("run", "--run-dir", run_dir, "--resume", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, cfg, _), _ = recorded[0]
    assert cfg.algo == "impala" and cfg.impala.actors_per_agent == 3 and cfg.impala.n_steps == 20
    for other in ("a2c", "ppo"):
        result = invoke("run", "--run-dir", run_dir, "--resume", "--algo", other, "--no-progress")
        assert result.exit_code == 1 and f"--algo {other} conflicts with the run's algo=impala" in result.output
    assert len(recorded) == 1


def test_a_config_json_from_before_algo_resumes_as_a2c(tmp_path, recorded):
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    agent = asdict(AgentConfig(total_frames=1500, a2c=A2CConfig(lr=1e-3)))
    del agent["algo"], agent["ppo"], agent["impala"]
    (run_dir / "config.json").write_text(json.dumps({"swarm": asdict(SwarmConfig(agents=1)), "agent": agent}))
    result = invoke("run", "--run-dir", run_dir, "--resume", "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, cfg, _), _ = recorded[0]
    assert cfg.algo == "a2c" and cfg.a2c.lr == 1e-3
    result = invoke("run", "--run-dir", run_dir, "--resume", "--algo", "ppo", "--no-progress")
    assert result.exit_code == 1 and "--algo ppo conflicts with the run's algo=a2c" in result.output


@pytest.mark.parametrize("text", ['run_dir = "elsewhere"\n', "metrics_port = 9100\n", "track = true\n"])
def test_a_commands_own_flags_are_not_settings_a_config_file_may_give(tmp_path, recorded, text):
    """Where a run writes, what it mirrors and serves are the command's, not what is trained: a file
    describing a run cannot move its run dir or open a port."""
    key = text.split(" ")[0]
    _refused_in_one_line(tmp_path, recorded, "run.toml", text, [f"'{key}' is not a setting of `gossiprl run`"])


def test_every_flag_but_verbose_and_config_is_generated_from_a_config_dataclass():
    """A hand-written option drifts from the dataclass that declares its default and help. Two are
    left: the group's -v belongs to no command, and --config says where settings come from."""
    import ast
    from pathlib import Path

    import gossiprl

    written = sorted(
        node.args[0].value
        for path in Path(gossiprl.__file__).parent.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "click.option"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    )
    assert written == ["--config", "-v"]


def test_the_broker_and_the_client_take_their_defaults_from_the_comms_settings():
    import inspect

    from gossiprl.comms import Broker, GossipClient
    from gossiprl.comms.settings import BrokerConfig, ClientConfig

    broker, client = inspect.signature(Broker).parameters, inspect.signature(GossipClient).parameters
    assert broker["peer_timeout"].default == BrokerConfig().peer_timeout
    assert (client["heartbeat"].default, client["liveness"].default) == (
        ClientConfig().heartbeat,
        ClientConfig().liveness,
    )
    one_agent = inspect.signature(launch.run_agent).parameters["gossip_timeout"].default
    assert SwarmConfig().gossip_timeout == one_agent  # a swarm's agents and one started alone wait alike


@pytest.mark.parametrize("command", [["run"], ["agent", "--connect", "tcp://127.0.0.1:9", "--rank", 0]])
@pytest.mark.parametrize(
    "flags,words",
    [
        (["--actors-curve-secret", "SECRET"], ["--actors-curve-secret and --actors-curve-allow go together"]),
        (["--actors-curve-allow", "ALLOWED"], ["--actors-curve-secret and --actors-curve-allow go together"]),
        (["--actors-bind", "tcp://0.0.0.0:5600"], ["0.0.0.0:5600 is reachable from other hosts", "--actors-curve"]),
        (["--actors-bind", "5600"], ["5600 is not a ZeroMQ endpoint: give tcp://HOST:PORT"]),
    ],
)
def test_actor_keys_without_their_pair_or_an_open_bind_without_keys_are_refused_before_anything_starts(
    tmp_path, recorded, command, flags, words
):
    """These were raised inside each agent process, once `gossiprl run` had made the run dir and
    started the broker and the agents."""
    from gossiprl.comms import keys

    _, secret = keys.generate(tmp_path / "learner", "learner")
    keys.generate(tmp_path / "allowed", "remote")
    flags = [{"SECRET": secret, "ALLOWED": tmp_path / "allowed"}.get(f, f) for f in flags]
    result = invoke(*command, "--algo", "impala", *flags, "--run-dir", tmp_path / "r")
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and all(w in error[0] for w in words), result.output
    assert recorded == [] and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--actors-per-agent", 0],
        ["--actors-per-agent", 0, "--actor-placement", "thread", "--actors-bind", "tcp://127.0.0.1:5600"],
    ],
)
def test_no_actors_of_its_own_without_actors_from_elsewhere_is_refused_naming_what_is_valid(tmp_path, recorded, flags):
    result = invoke("run", "--algo", "impala", *flags, "--run-dir", tmp_path / "r", "--no-progress")
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    words = ["--actors-per-agent 0", "--actor-placement process", "tcp://HOST:PORT (from other hosts) or ipc://PATH"]
    words.append("give 1 or more")
    assert len(error) == 1 and all(w in error[0] for w in words), result.output
    assert recorded == [] and not (tmp_path / "r").exists()


def test_a_learner_fed_only_by_actors_from_elsewhere_is_accepted(tmp_path, recorded):
    args = ["--actors-per-agent", 0, "--actors-bind", "tcp://127.0.0.1:5600", "--run-dir", tmp_path / "r"]
    result = invoke("run", "--algo", "impala", *args, "--no-progress")
    assert result.exit_code == 1 and "recorded" in result.output, result.output
    (_, cfg, _), _ = recorded[0]
    assert (cfg.impala.actors_per_agent, cfg.impala.actors_bind) == (0, "tcp://127.0.0.1:5600")


@pytest.mark.parametrize(
    "command", [["run", "--agents", 4, "--no-progress"], ["agent", "--connect", "tcp://127.0.0.1:9", "--rank", 3]]
)
def test_an_actors_port_that_some_agents_rank_would_push_past_65535_is_refused(tmp_path, recorded, command):
    """Agent r binds PORT + r: agent 3 of 65534 would bind 65537, which no socket can."""
    result = invoke(*command, "--algo", "impala", "--actors-bind", "tcp://127.0.0.1:65534", "--run-dir", tmp_path / "r")
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    words = ["agent 3 would bind port 65537 (agent r binds PORT + r), past 65535", "give a lower PORT, or *"]
    assert len(error) == 1 and all(w in error[0] for w in words), result.output
    assert recorded == [] and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "command", [["run", "--no-progress"], ["agent", "--connect", "tcp://127.0.0.1:9", "--rank", 0]]
)
def test_actors_bind_with_actor_threads_is_refused_naming_what_is_valid(tmp_path, recorded, command):
    """Threads have no channel for actors from elsewhere: the bind was ignored without a word."""
    flags = ["--actor-placement", "thread", "--actors-bind", "tcp://127.0.0.1:5600"]
    result = invoke(*command, "--algo", "impala", *flags, "--run-dir", tmp_path / "r")
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    words = ["--actors-bind takes actors from elsewhere", "--actor-placement thread leave it out", "process"]
    assert len(error) == 1 and all(w in error[0] for w in words), result.output
    assert recorded == [] and not (tmp_path / "r").exists()
