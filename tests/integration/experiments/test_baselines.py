"""experiments/baselines.py: Stable-Baselines3's A2C and PPO get gossiprl's MinAtar network and A2C
settings, a --quick run goes end to end into a fresh directory and resumes, and make_results puts
the SB3 rows beside gossiprl's one agent with the published MinAtar figures. The SB3 tests skip,
with the install line, where the optional extra is missing; the RESULTS.md section needs no SB3."""

import csv
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from experiments import make_results
from experiments.common import cell_key
from experiments.swarm_vs_one import ONE_ATARI
from gossiprl.rl.a2c import ATARI_LR

SB3_MISSING = "Stable-Baselines3 is the optional extra: pip install 'gossiprl[baselines]'"


def baselines():
    pytest.importorskip("stable_baselines3", reason=SB3_MISSING)
    from experiments import baselines

    return baselines


def test_sb3_gets_gossiprl_minatar_network_and_a2c_settings():
    pytest.importorskip("minatar", reason="MinAtar is the optional extra: pip install 'gossiprl[minatar]'")
    bl = baselines()
    import torch

    from gossiprl.rl.envs import make_env
    from gossiprl.rl.models import make_model
    from gossiprl.rl.settings import A2CConfig

    env_id = "MinAtar/Breakout-v1"
    envs = make_env(env_id, 1, seed=1)
    ours = make_model(envs.observation_space, envs.action_space)
    envs.close()
    shapes = [tuple(p.shape) for p in ours.parameters()]
    for algo in ("a2c", "ppo"):
        hyper = bl.settings(algo, env_id)
        model = bl.build(algo, env_id, 1, hyper)
        policy = model.policy
        # one shared trunk, then the two linear heads, parameter for parameter as gossiprl's
        assert [tuple(p.shape) for p in policy.parameters()] == shapes
        assert sum(p.numel() for p in policy.parameters()) == sum(p.numel() for p in ours.parameters())
        assert model.n_envs == hyper["n_envs"]
        model.get_env().close()
    a2c = bl.settings("a2c", env_id)
    cfg = A2CConfig()
    assert (a2c["n_envs"], a2c["n_steps"], a2c["learning_rate"], a2c["ent_coef"]) == (16, 5, ATARI_LR, 0.01)
    model = bl.build("a2c", env_id, 1, a2c)
    group = model.policy.optimizer.param_groups[0]
    assert isinstance(model.policy.optimizer, torch.optim.RMSprop)
    assert (group["alpha"], group["eps"]) == (cfg.rmsprop_alpha, cfg.rmsprop_eps)
    assert model.gae_lambda == 1.0 and model.max_grad_norm == cfg.max_grad_norm and not model.normalize_advantage
    model.get_env().close()


@pytest.mark.timeout(180)
def test_quick_runs_both_algorithms_then_resumes(tmp_path):
    bl = baselines()
    out = tmp_path / "baselines"
    args = ["--quick", "--out", str(out)]
    first = CliRunner().invoke(bl.main, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    rows = {r["algo"]: r for r in (json.loads(p.read_text()) for p in (out / "cells").glob("*.json"))}
    assert set(rows) == {"a2c", "ppo"}
    assert rows["a2c"]["settings"]["ent_coef"] == 0.0  # gossiprl's default on a control task
    for algo, row in rows.items():
        assert row["frames"] >= 4_000 and row["fps"] > 0 and row["env"] == "CartPole-v1"
        with open(out / "curves" / f"{cell_key(bl.ALGOS[algo], 1)}.csv", newline="") as f:
            episodes = list(csv.DictReader(f))
        assert len(episodes) == row["episodes"] > 0
        assert [int(e["frames"]) for e in episodes] == sorted(int(e["frames"]) for e in episodes)
        assert row["last100"] == pytest.approx(np.mean([float(e["return"]) for e in episodes[-100:]]))
        assert row["per_agent_last100"] == [row["last100"]]
    assert (out / "results.csv").read_text().count("\n") == 3

    second = CliRunner().invoke(bl.main, args, catch_exceptions=False)
    assert second.output.count("done before, kept") == 2

    # a row run under other settings is not this cell's result: the cell runs again
    stale = out / "cells" / f"{cell_key('SB3 A2C', 1)}.json"
    stale.write_text(json.dumps({**json.loads(stale.read_text()), "fingerprint": "other-settings"}))
    third = CliRunner().invoke(bl.main, [*args, "--algos", "a2c"], catch_exceptions=False)
    assert "done before" not in third.output and json.loads(stale.read_text())["fingerprint"] != "other-settings"
    # that run named one algorithm: a window, which leaves the plan (and RESULTS.md's rows) whole
    plan = json.loads((out / "study.json").read_text())
    assert plan["settings"] == ["SB3 A2C", "SB3 PPO"] and plan["seeds"] == [1]
    assert plan["command"] == f"python -m experiments.baselines --quick --out {out} --seeds 1 --algos a2c,ppo"


@pytest.mark.timeout(120)
def test_a_window_stopped_by_sigterm_says_how_to_go_on_and_exits_143(tmp_path):
    """A scheduler's kill ended the script at once, saying nothing, with -15."""
    baselines()
    out = tmp_path / "baselines"
    command = [sys.executable, "-m", "experiments.baselines", "--quick", "--frames", "10000000", "--out", str(out)]
    window = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert window.stdout.readline().startswith("SB3 "), "the window never started its first cell"
    time.sleep(2)  # into the cell's training
    window.send_signal(signal.SIGTERM)
    _, err = window.communicate(timeout=60)
    assert window.returncode == 143, err
    assert f"baselines stopped: the same command with --out {shlex.quote(str(out))} goes on" in err
    assert not list((out / "cells").glob("*.json"))  # the cut cell wrote no row


def test_without_out_a_quick_run_writes_a_fresh_temporary_dir():
    bl = baselines()
    result = CliRunner().invoke(bl.main, ["--quick", "--frames", "80", "--algos", "a2c"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = Path(result.output.split(" -> ")[1].splitlines()[0])
    try:
        assert out.parent.parent == Path(tempfile.gettempdir()) and out.parent.name.startswith("baselines-quick-")
        assert (out / "results.csv").exists()
    finally:
        shutil.rmtree(out.parent)


def test_bad_algos_and_atari_say_what_is_valid():
    bl = baselines()
    bad = CliRunner().invoke(bl.main, ["--quick", "--algos", "a2c,dqn"])
    assert bad.exit_code == 2 and "subset of a2c, ppo" in bad.output
    atari = CliRunner().invoke(bl.main, ["--env", "ALE/Pong-v5"])
    assert atari.exit_code == 2 and "MinAtar or vector-observation id" in atari.output


def _study(folder: Path, meta: dict, rows: list[dict], curve: list[str]) -> None:
    """A finished study of ``rows``; every cell's curve CSV holds ``curve`` (header first)."""
    for sub in ("cells", "curves"):
        (folder / sub).mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps(meta))
    for r in rows:
        (folder / "cells" / f"{cell_key(r['setting'], r['seed'])}.json").write_text(json.dumps(r))
        (folder / "curves" / f"{cell_key(r['setting'], r['seed'])}.csv").write_text("\n".join(curve) + "\n")


def test_episode_curve_is_the_last_100_mean_after_each_episode(tmp_path):
    episodes = [f"{10 * k},{k / 10},{k}" for k in range(1, 151)]  # episode k returns k
    _study(tmp_path, {}, [{"setting": "SB3 A2C", "seed": 1}], ["frames,train_s,return", *episodes])
    curve = make_results.episode_curve(tmp_path, cell_key("SB3 A2C", 1))
    assert [c["frames"] for c in curve] == [10 * k for k in range(1, 151)]
    assert curve[9]["mean_return_100"] == 5.5 and curve[-1]["mean_return_100"] == 100.5  # mean of 51..150


def test_results_md_puts_sb3_beside_gossiprl_one_agent_with_the_published_figures(tmp_path):
    env, seeds = "MinAtar/Breakout-v1", [1, 2, 3, 4, 5]
    sb3 = {"SB3 A2C": [6.0, 6.1, 6.2, 6.3, 6.4], "SB3 PPO": [1.0, 1.1, 1.2, 1.3, 1.4]}
    _study(
        tmp_path / "baselines",
        {"env": env, "frames_per_cell": 1_000_000, "seeds": seeds, "settings": list(sb3), "command": "b"},
        [
            {"setting": s, "seed": k, "per_agent_last100": [v], "fps": 2000.0}
            for s, values in sb3.items()
            for k, v in zip(seeds, values)
        ],
        ["frames,train_s,return", "500000,100.0,2", "1000000,200.0,6"],
    )
    gossip = {
        "1 agent": [[9.1], [9.2], [9.3], [9.0], [9.4]],
        ONE_ATARI: [[6.1], [6.2], [6.3], [6.0], [6.4]],
        "ring of 4": [[7.0, 7.1, 7.2, 7.3]] * 5,
    }
    # the swarm_vs_one study of another game is not set beside these: the one of the same env is
    _study(
        tmp_path / "swarm_vs_one",
        {"env": "MinAtar/SpaceInvaders-v1", "frames_per_cell": 1_000_000},
        [{"setting": "1 agent", "seed": 1, "per_agent_last100": [30.0], "fps": 3000.0}],
        ["agent,frames,wall_s,mean_return_100,wait_s,mix_s", "0,1000000,300.0,30.0,0,0"],
    )
    _study(
        tmp_path / "swarm_vs_one_breakout",
        {"env": env, "frames_per_cell": 1_000_000},
        [
            {"setting": s, "seed": k, "per_agent_last100": v, "fps": 3000.0}
            for s, values in gossip.items()
            for k, v in zip(seeds, values)
        ],
        ["agent,frames,wall_s,mean_return_100,wait_s,mix_s", "0,500000,150.0,3.0,0,0", "0,1000000,300.0,6.0,0,0"],
    )
    text = "\n".join(make_results.baselines_sections(tmp_path))
    assert "## Reference: Stable-Baselines3 A2C and PPO on MinAtar/Breakout-v1" in text
    assert (
        "| SB3 A2C | 1,000,000 | 5 | 6.20 [" in text
        and "| gossiprl, ring of 4 (swarm_vs_one_breakout) | 1,000,000 | 5 | 7.15" in text
    )
    assert "(swarm_vs_one)" not in text
    assert "Young & Tian 2019" in text and "read off the paper's curves, approximate" in text
    # the same five scores on both sides: P = 0.5, and an interval that holds it says nothing of equality
    # SB3 A2C runs at A2C's Atari rate, so the one agent it is compared with is gossiprl's at that rate
    assert f"SB3 A2C's rate (gossiprl, {ONE_ATARI} (swarm_vs_one_breakout))" in text
    assert "| gossiprl, 1 agent (swarm_vs_one_breakout) | 1,000,000 | 5 | 9.20" in text
    assert "P(gossiprl's one agent > SB3 A2C) = 0.50 [" in text
    assert "this data cannot tell them apart, which does not show them equal" in text
    assert "P(gossiprl's one agent > SB3 PPO) = 1.00 [1.00, 1.00]: gossiprl's one agent ends higher" in text
    assert "![SB3 reference on MinAtar/Breakout-v1](results/baselines/figure.png)" in text
    assert (tmp_path / "baselines" / "figure.png").stat().st_size > 10_000
    assert make_results.baselines_sections(tmp_path / "nothing")[2].startswith("**Not run**")
