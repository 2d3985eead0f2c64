"""A run resumed through the CLI: config.json is its settings, and the summary covers every session."""

import json
import shutil

import pytest

from helpers import invoke


@pytest.mark.timeout(180)
def test_resume_extends_the_budget_records_it_and_counts_every_sessions_time(tmp_path):
    run_dir = tmp_path / "run"
    config_path = tmp_path / "cartpole.toml"
    config_path.write_text('env = "CartPole-v1"\nagents = 2\nstop_at_return = "none"\nlog_every = 5\n')
    result = invoke("run", "--config", config_path, "--total-frames", 4000, "--run-dir", run_dir, "--no-progress")
    assert result.exit_code == 0, result.output
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["frames"] == 4000 and first["wall_seconds"] == first["session_wall_seconds"]
    recorded = json.loads((run_dir / "config.json").read_text())
    assert recorded["swarm"]["total_frames"] == 4000
    # the env's default (null), and beside it what that was for this run, which a resume keeps
    assert (recorded["agent"]["a2c"]["lr"], recorded["agent"]["a2c"]["entropy_coef"]) == (None, None)
    assert (recorded["learned_with"]["a2c"]["lr"], recorded["learned_with"]["a2c"]["entropy_coef"]) == (7e-4, 0.0)

    refused = invoke("run", "--run-dir", run_dir, "--resume", "--agents", 4, "--total-frames", 8000, "--no-progress")
    assert refused.exit_code == 1 and "--agents 4 conflicts with the run's agents=2" in refused.output
    assert json.loads((run_dir / "summary.json").read_text()) == first  # nothing ran

    # every other setting (2 agents, no stop at a return, log every 5) comes from config.json
    result = invoke("run", "--run-dir", run_dir, "--resume", "--agents", 2, "--total-frames", 8000, "--no-progress")
    assert result.exit_code == 0, result.output
    second = json.loads((run_dir / "summary.json").read_text())
    assert second["frames"] == 8000 and second["agents"] == 2 and second["stopped_by"] == "total frames"
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["swarm"]["total_frames"] == 8000 and saved["agent"]["total_frames"] == 4000
    assert saved["agent"]["a2c"]["lr"] is None and saved["learned_with"] == recorded["learned_with"]  # still asks
    assert second["wall_seconds"] == pytest.approx(first["wall_seconds"] + second["session_wall_seconds"])
    assert [a["frames"] for a in second["per_agent"].values()] == [4000, 4000]
    assert second["fps"] == pytest.approx(4000 / second["session_wall_seconds"])  # the frames this session trained
    assert "fps only this one" in second["time_definition"]


def _strict_json(path):
    def refuse(word):
        raise ValueError(f"{path} holds {word}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


FINISHED = ("--agents", 1, "--total-frames", 1000, "--stop-at-return", "none", "--no-progress")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished one-agent run of FINISHED, trained once for the module; each test resumes its own copy."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    result = invoke("run", *FINISHED, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.mark.timeout(180)  # the first test to ask for finished_run pays for it
def test_resuming_a_finished_run_keeps_its_return_and_writes_strict_json(finished_run, tmp_path):
    """Issue 19 F15: --resume of a finished run trained nothing, then rewrote summary.json with NaN
    (invalid JSON) in place of the run's real return."""
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    flags = (*FINISHED, "--run-dir", run_dir)
    first = _strict_json(run_dir / "summary.json")
    assert isinstance(first["mean_return"], float)
    result = invoke("run", *flags, "--resume")
    assert result.exit_code == 0, result.output
    second = _strict_json(run_dir / "summary.json")
    assert second["frames"] == first["frames"] and second["episodes"] == 0, second  # nothing left to train
    assert second["mean_return"] == first["mean_return"], second


@pytest.mark.timeout(120)
def test_resuming_a_run_stopped_before_any_checkpoint_starts_its_agents_afresh(tmp_path):
    """Issue 19 F15: every agent of such a run waited to adopt its neighbours' parameters, which had
    none: 60 s of silence, then a GossipTimeout traceback and half the budget trained."""
    run_dir = tmp_path / "run"
    flags = ("--agents", 2, "--stop-at-return", "none", "--run-dir", run_dir, "--no-progress")
    assert invoke("run", *flags, "--total-frames", 1000).exit_code == 0
    for checkpoint in run_dir.glob("agent-*/checkpoint.pt"):
        checkpoint.unlink()  # as if it had stopped before its first checkpoint
    result = invoke("run", *flags, "--total-frames", 1000, "--resume", "--gossip-timeout", 20)
    assert result.exit_code == 0, result.output
    assert "no agent of" in result.output and "start afresh" in result.output, result.output
    summary = _strict_json(run_dir / "summary.json")
    assert summary["frames"] >= 1000 and summary["failed"] == {}, summary


@pytest.mark.timeout(120)
@pytest.mark.parametrize("edit", [{"deviation_bound": None}, {"a2c": {"lr": 0.5}}])
def test_a_resume_whose_config_json_changes_what_the_agents_learn_with_is_refused(finished_run, tmp_path, edit):
    """Issue 19 F14: a resumed run whose config.json said deviation_bound: null turned the bound off
    silently (the command line refuses such a flag; config.json is data)."""
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    config = json.loads((run_dir / "config.json").read_text())
    for key, value in edit.items():
        config["agent"][key] = {**config["agent"][key], **value} if isinstance(value, dict) else value
    (run_dir / "config.json").write_text(json.dumps(config))
    result = invoke("run", *FINISHED, "--total-frames", 2000, "--run-dir", run_dir, "--resume")
    assert result.exit_code == 1, result.output
    name = next(iter(edit)) if "a2c" not in edit else "a2c.lr"
    assert f"was trained with {name}=" in result.output and "config.json edited?" in result.output, result.output
