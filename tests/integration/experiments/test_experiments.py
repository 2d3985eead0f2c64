"""Every study's --quick runs end to end through the real launcher, resumes without re-running
a finished cell, and RESULTS.md is generated from what the studies wrote.

The studies share one results dir, so cells two studies have in common (the 4-agent sync ring
and the independent agents) run once: seven real CartPole cells in all, one seed each (the layout
study's netns cell only where root can make network namespaces)."""

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from experiments import (
    batch_period,
    layout,
    lr_confirm,
    lr_sweep,
    make_results,
    ordering_ablation,
    scaling,
    swarm_vs_one,
    table1,
    topology_ablation,
)
from experiments.common import (
    QUICK_ENV,
    Cell,
    CellPlan,
    cell_fingerprint,
    cell_key,
    cell_plan,
    ci95,
    run_study,
    start_session,
    swarm_curve,
)
from gossiprl import launch
from gossiprl.rl.agent import AgentConfig
from helpers import wait_until_training

FRAMES = "8000"
QUARTER = "2000"
"""Each agent's frames in the ordering, topology and scaling studies: their ring of 4 then runs the
8,000 frames batch_period gives its whole ring, and the three share that cell."""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


def run_quick(module, out, frames=FRAMES):
    result = CliRunner().invoke(
        module.main, ["--quick", "--seeds", "1", "--frames", frames, "--out", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.timeout(300)
def test_ordering_quick_runs_every_cell_then_resumes_without_rerunning(results):
    out = results / "ordering_ablation"
    first = run_quick(ordering_ablation, out, QUARTER)
    assert first.count("consensus eval") >= 2 and "seed 1:" in first
    rows = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    assert {r["setting"] for r in rows} == {"sync (turn locks)", "none (independent)"}
    for r in rows:
        assert r["frames"] >= int(FRAMES) - 4 * 80 and len(r["per_agent_last100"]) == 4
        assert r["agents_min"] <= r["agents_mean"] <= r["agents_max"]
        assert r["solved"] is (r["agents_min"] >= 475)
    sync = next(r for r in rows if r["mode"] == "sync")
    indep = next(r for r in rows if r["mode"] == "none")
    # without gossip the loop's gossip time is the skipped branch, microseconds an update
    assert sync["gossip_share"] > 0.01 and indep["gossip_share"] < 1e-3
    # the independent agents are one broker-less swarm, so agent r draws from (seed, rank r), as a
    # gossiping swarm's does, not a lone run seeded seed + r that the next seed's agent r - 1 repeats
    indep_dir = out / "runs" / "none--independent-__seed1"
    configs = [json.loads(p.read_text()) for p in sorted(indep_dir.glob("agent-*/config.json"))]
    assert [(c["rank"], c["seed"]) for c in configs] == [(r, 1) for r in range(4)]
    assert (out / "figure.png").stat().st_size > 10_000
    assert (out / "results.csv").read_text().count("\n") == 3

    second = run_quick(ordering_ablation, out, QUARTER)
    assert second.count("done before, kept") == 2

    # a row left by an older loop version is not this cell's result: the cell is run (here: taken
    # from the shared cache, which holds it under today's fingerprint) and the row replaced
    stale = sorted((out / "cells").glob("*.json"))[0]
    stale.write_text(json.dumps({**json.loads(stale.read_text()), "fingerprint": "from-loop-3"}))
    third = run_quick(ordering_ablation, out, QUARTER)
    assert third.count("done before, kept") == 1 and third.count("from an older loop") == 1
    assert third.count("reused") == 1 and json.loads(stale.read_text())["fingerprint"] != "from-loop-3"


@pytest.mark.timeout(400)
def test_other_studies_quick_reuse_shared_cells_and_results_md_is_generated(results):
    topology = run_quick(topology_ablation, results / "topology_ablation", QUARTER)
    assert topology.count("reused") == 2  # ring-4 and independent-4 ran in the ordering study
    batch = run_quick(batch_period, results / "batch_period")
    assert batch.count("reused") == 1
    run_quick(scaling, results / "scaling", QUARTER)
    scaling_rows = [json.loads(p.read_text()) for p in (results / "scaling" / "cells").glob("*.json")]
    assert sorted(r["agents"] for r in scaling_rows) == [1, 2]
    for r in scaling_rows:
        # one agent has no gossip: what its loop times there is the skipped branch, microseconds
        assert r["rollout_s"] > 0 and r["learn_s"] > 0 and (r["agents"] == 1) == (r["gossip_wait_s"] < 0.01)

    run_quick(layout, results / "layout")
    layouts = {json.loads(p.read_text())["layout"] for p in (results / "layout" / "cells").glob("*.json")}
    assert layouts == ({"one host"} if layout.netns_unavailable() else {"one host", "netns"})

    # on CartPole the default rate is 7e-4, so the 7e-4 arms are the default arms' runs, reused
    vs_one = run_quick(swarm_vs_one, results / "swarm_vs_one").splitlines()
    for arm in (swarm_vs_one.ONE_ATARI, swarm_vs_one.RING_ATARI):
        assert any(f"] {arm}, seed 1: " in line and line.endswith("reused)") for line in vs_one), vs_one
    arms = {
        json.loads(p.read_text())["setting"]: json.loads(p.read_text())
        for p in (results / "swarm_vs_one" / "cells").glob("*.json")
    }
    # --frames is per agent there: the ring of 4 trains 4x the single agent's frames, and the
    # third arm gives one agent the ring's total
    ring, one, total = arms["ring of 4"], arms["1 agent"], arms[swarm_vs_one.EQUAL_TOTAL]
    assert ring["frames"] >= 4 * (int(FRAMES) - 80) > one["frames"] >= int(FRAMES) - 80
    assert total["agents"] == 1 and total["frames"] >= 4 * (int(FRAMES) - 80)
    # a window that runs one setting keeps every finished setting in the tables (it trimmed them to its own)
    again = CliRunner().invoke(
        swarm_vs_one.main,
        ["--quick", "--seeds", "1", "--frames", FRAMES, "--only", "1 agent", "--out", str(results / "swarm_vs_one")],
        catch_exceptions=False,
    )
    assert again.exit_code == 0 and "1 agent, seed 1: done before, kept" in again.output, again.output
    assert (results / "swarm_vs_one" / "results.csv").read_text().count("\n") == 6
    # and the command RESULTS.md shows plans every cell again: the window's --only is not in it
    command = json.loads((results / "swarm_vs_one" / "study.json").read_text())["command"]
    out = results / "swarm_vs_one"
    assert command == f"python -m experiments.swarm_vs_one --quick --frames {FRAMES} --seeds 1 --out {out}"
    # a cell is named by its rate: the sweep's 7e-4 agent is swarm_vs_one's default one on CartPole
    sweep = run_quick(lr_sweep, results / "lr_sweep")
    assert [line.endswith("reused)") for line in sweep.splitlines() if ", seed 1: " in line] == [True, False], sweep
    confirm = run_quick(lr_confirm, results / "lr_confirm")
    assert confirm.count(" frames in ") == 2, confirm  # its 2.8e-3 arms: none of them in the sweep's quick

    output = results / "RESULTS.md"
    result = CliRunner().invoke(
        make_results.main, ["--results", str(results), "--output", str(output)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    text = output.read_text()
    for title in (
        "Ordering ablation",
        "Topology ablation",
        "Agent-count scaling",
        "Batch size and gossip period",
        "Layout: one host vs network-namespace hosts",
        "A ring of 4 against one agent",
        "A2C's learning rate on MinAtar",
        lr_confirm.STUDY.title,
    ):
        assert f"## {title}" in text
    assert "frames for each agent (a ring of 4 trains 4x as many in all)" in text
    assert re.search(
        r"IQM of every agent's own last-100 score at equal frames per agent.*: 1 agent [\d.]+ \(1 seed\(s\); too few",
        text,
    )
    assert re.search(
        r"At equal total frames: ring of 4, lr 7e-4 [\d.]+ against 1 agent at lr 7e-4, the ring's total frames [\d.]+, "
        "too few",
        text,
    )
    assert re.search(
        r"P\(ring of 4 > 1 agent\): at equal frames per agent [\d.]+ \(no interval: fewer than 3 seeds", text
    )
    assert "**Untrained policy** on CartPole-v1: " in text and "not measured on CartPole-v1" not in text
    assert "Missing cells" not in text  # --quick plans exactly the cells it ran
    # one seed per arm decides no claim, and no seed count is written by hand
    assert "**cannot decide** it: fewer than 3 seeds" in text and "This data **supports**" not in text
    assert "(1 and 1 seeds)" in text and "with 3 seeds" not in text


@pytest.mark.timeout(200)
def test_table1_quick_reuses_swarm_vs_ones_cells_and_runs_only_the_async_ring(results):
    """After the test above ran swarm_vs_one --quick into the same results: Table 1's A2C and
    PALA-A2C arms are those runs, so only GALA-A2C's ring trains."""
    out = results / "table1"
    first = run_quick(table1, out)
    assert first.count("(same run as in another study, reused)") == 2
    rows = {json.loads(p.read_text())["setting"]: json.loads(p.read_text()) for p in (out / "cells").glob("*.json")}
    assert set(rows) == {"A2C, 1 agent", table1.PALA, table1.GALA}
    ring = json.loads((results / "swarm_vs_one" / "cells" / "ring-of-4__seed1.json").read_text())
    assert rows[table1.PALA]["per_agent_last100"] == ring["per_agent_last100"]
    gala = rows[table1.GALA]
    assert gala["mode"] == "async" and gala["frames"] >= 4 * (int(FRAMES) - 80) and gala["gossip_share"] > 0
    assert run_quick(table1, out).count("done before, kept") == 3

    text = "\n".join(make_results.table1_section(results))
    assert f"| {table1.GALA} | 4 | {int(FRAMES):,} | 1 |" in text and "Missing cells" not in text
    # counted by fingerprint in the other studies' dirs (the ordering study's quick async ring has other frames)
    reuse = text.split("3 of 3 cells finished; ")[1].split(")")[0]
    assert reuse.startswith("2 of them are runs other studies hold too (") and "swarm_vs_one" in reuse, reuse
    assert "; 0 read from the shared cell cache, not yet copied into the study's directory)" in text


@pytest.mark.timeout(200)
def test_a_cell_cut_short_goes_on_from_its_checkpoints(tmp_path):
    """A study stopped mid-cell (a machine session's end) loses at most a tenth of the cell: run
    again, it resumes each agent from its last checkpoint and says in the row how many sessions the
    run took, its time split over the frames its last session trained. Stopped after training, while
    it scored the policies, it trains no more. A run of other settings left under the cell's name,
    or one stopped before any checkpoint, is not resumed."""
    cell = Cell("ring of 2", 1, 2, 8000, launch.SwarmConfig(agents=2, topology="ring"))
    fingerprint = cell_fingerprint(cell, QUICK_ENV, 2)
    out = tmp_path / "study"
    run_dir = out / "runs" / cell.key
    # the first session, stopped once each agent had trained half its budget (and checkpointed)
    assert start_session(run_dir, fingerprint, resumable=True) == (1, False)
    agent = AgentConfig(env_id=QUICK_ENV, seed=1, device="cpu", log_every=2, checkpoint_every=5)
    launch.run(replace(cell.swarm, total_frames=4000), agent, run_dir, show_progress=False, echo=lambda *a: None)
    # --plan reads the same state run_study will go on from: the checkpoints' frames, not the budget
    cut = CellPlan("cut", 4000, "session 2 goes on from 4,000 frames in its checkpoints")
    assert cell_plan(cell, out, QUICK_ENV, 2) == cut

    lines = []
    (row,) = run_study([cell], out, QUICK_ENV, 475.0, 2, echo=lines.append)
    assert cell_plan(cell, out, QUICK_ENV, 2) == CellPlan("done", 0)
    assert row["sessions"] == 2 and row["frames"] == 8000, lines
    assert row["timed_frames"] == pytest.approx(2000) and row["steps_per_update"] == 80  # its last session: 25 updates
    curve = (out / "curves" / f"{cell.key}.csv").read_text().splitlines()[1:]
    frames = sorted({int(line.split(",")[1]) for line in curve})
    # the first session's rows are kept (it logged every 2 updates, 160 frames; run_cell logs every
    # update here), and each agent trained its 4,000
    assert frames[0] == 160 and frames[-1] == 4000
    checkpoint = torch.load(run_dir / "agent-1" / "checkpoint.pt", weights_only=False)
    assert checkpoint["counters"]["frames"] == 4000

    # stopped while it scored the policies: the row is made again from the finished run's summary
    (out / "cells" / f"{cell.key}.json").unlink()
    assert cell_plan(cell, out, QUICK_ENV, 2) == CellPlan("cached", 0)
    (out.parent / "_shared" / f"{fingerprint}.json").unlink()
    assert cell_plan(cell, out, QUICK_ENV, 2) == CellPlan("trained", 0)
    (again,) = run_study([cell], out, QUICK_ENV, 475.0, 2, echo=lines.append)
    assert again["sessions"] == 2 and again["timed_frames"] == pytest.approx(2000)
    # its wall-clock is the call's that trained it, not this one's: no window to compare it in
    assert row["window"] and again["window"] is None
    assert again["per_agent_last100"] == row["per_agent_last100"]

    # another cell's run under this name: cleared, not resumed
    assert start_session(run_dir, "another-cell", resumable=True) == (1, False) and not run_dir.exists()
    # a run stopped before its first checkpoint has nothing to go on from: a fresh first session
    (run_dir / "agent-0").mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    assert start_session(run_dir, "another-cell", resumable=True) == (1, False) and not run_dir.exists()


@pytest.mark.timeout(200)
def test_agents_without_gossip_resume_each_from_its_own_checkpoint_or_afresh(tmp_path):
    """Independent agents never wait for each other, so a stop can find one checkpointed and the
    next not yet: the first goes on, the second starts afresh (it has no neighbours to take
    parameters from), and neither fails."""
    control = launch.SwarmConfig(agents=2, topology="none", total_frames=4000)
    agent = AgentConfig(env_id=QUICK_ENV, seed=1, device="cpu", log_every=5, checkpoint_every=5)
    run_dir = tmp_path / "run"
    launch.run(control, agent, run_dir, show_progress=False, echo=lambda *a: None)
    (run_dir / "agent-1" / "checkpoint.pt").unlink()
    summary = launch.run(
        replace(control, total_frames=8000), agent, run_dir, resume=True, show_progress=False, echo=lambda *a: None
    )
    assert summary["failed"] == {} and [summary["per_agent"][r]["frames"] for r in (0, 1)] == [4000, 4000]
    first = [int(line.split(",")[0]) for line in (run_dir / "agent-0" / "metrics.csv").read_text().splitlines()[1:]]
    fresh = [int(line.split(",")[0]) for line in (run_dir / "agent-1" / "metrics.csv").read_text().splitlines()[1:]]
    assert first[0] == fresh[0] == 400 and first[-1] == fresh[-1] == 4000
    went_on, afresh = summary["per_agent"][0], summary["per_agent"][1]
    assert went_on["run_wall_seconds"] > went_on["wall_seconds"]  # its first session's training counts
    assert afresh["run_wall_seconds"] == afresh["wall_seconds"]


@pytest.mark.timeout(180)
def test_a_study_stopped_by_sigterm_checkpoints_the_cell_it_cut_and_exits_143(tmp_path):
    """A scheduler's kill (scancel, systemd, timeout) reaches the study's own process: it stops the
    cell in progress as Ctrl-C does, so its agents checkpoint and the cell stays to be resumed. Before,
    the study died at once, saying nothing, and its agents stopped only on finding their launcher gone."""
    out = tmp_path / "study"
    cell = cell_key("2 agents, ring", 1)
    command = [sys.executable, "-m", "experiments.scaling", "--quick", "--seeds", "1", "--frames", "400000"]
    study = subprocess.Popen(
        [*command, "--only", "2 agents, ring", "--out", str(out)], stderr=subprocess.PIPE, text=True
    )
    wait_until_training(out / "runs" / cell, study, 120, "the ring never logged a row")
    study.send_signal(signal.SIGTERM)
    _, err = study.communicate(timeout=60)
    assert study.returncode == 143, err
    assert f"scaling stopped: the same command with --out {shlex.quote(str(out))} goes on, from the cell it cut" in err
    assert all((out / "runs" / cell / f"agent-{r}" / "checkpoint.pt").exists() for r in (0, 1))
    assert not (out / "cells" / f"{cell}.json").exists()  # no row: the cell is not done

    # --plan on the stopped study: says what is left, and runs and writes nothing
    tree = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    plan = CliRunner().invoke(scaling.main, [*command[3:], "--plan", "--out", str(out)], catch_exceptions=False)
    assert plan.exit_code == 0, plan.output
    went_on = r"2 agents, ring, seed 1: cut: [\d,]+ frames \(session 2 goes on from [\d,]+ frames in its checkpoints\)"
    assert re.search(went_on, plan.output), plan.output
    assert "1 agent (plain A2C), seed 1: to run: 400,000 frames\n" in plan.output
    assert "No finished cell of this study yet to time the rest by." in plan.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == tree


@pytest.mark.timeout(240)
def test_readme_seeds_stopped_by_sigterm_lets_its_run_checkpoint_and_goes_on_from_it(tmp_path):
    """readme_seeds ran each seed with subprocess.run, which kills its child 0.25 s after Ctrl-C, and a
    SIGTERM killed readme_seeds alone; the next window started the seed afresh either way. Now the
    run stops with its checkpoints, the same command resumes it, and the row says it was resumed."""
    out = tmp_path / "seeds"
    command = [sys.executable, "-m", "experiments.readme_seeds", "--seeds", "1", "--total-frames", "80000"]
    command += ["--eval-episodes", "1", "--out", str(out)]
    seeds = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    wait_until_training(out / "runs" / "seed1", seeds, 120, "the ring never logged a row", agents=4)
    seeds.send_signal(signal.SIGTERM)
    _, err = seeds.communicate(timeout=90)
    assert seeds.returncode == 143, err
    assert f"--out {shlex.quote(str(out))} goes on, from the seed it cut" in err
    summary = json.loads((out / "runs" / "seed1" / "summary.json").read_text())
    assert summary["stopped_by"] == "interrupted" and summary["failed"] == {}, summary
    cut_at = summary["frames"]
    assert 0 < cut_at < 80000 and not (out / "cells" / "seed1.json").exists()
    again = subprocess.run(command, capture_output=True, text=True, timeout=200)
    assert again.returncode == 0, again.stderr
    row = json.loads((out / "cells" / "seed1.json").read_text())
    assert row["frames"] >= 80000 and "--resume" not in row["command"] and row["resumed"]
    assert row["wall_s"] > summary["wall_seconds"]  # the first window's training counts


@pytest.mark.parametrize(
    "summary, ended",
    [
        (None, False),  # never started, or killed
        ({"stopped_by": "interrupted", "failed": {}}, False),
        ({"stopped_by": "total frames", "failed": {"1": "process exited with code -9 without a report"}}, False),
        ({"stopped_by": "total frames", "failed": {}}, True),
        ({"stopped_by": "solved: mean return 480.1 >= 475.0", "failed": {}}, True),
    ],
)
def test_readme_seeds_runs_again_only_a_run_that_did_not_end_as_the_readme_command_does(tmp_path, summary, ended):
    """A window stopped after its run ended (while it scored it) resumed the ended run, whose stop rule
    then saw none of the earlier episodes; a run with a failed agent was scored as a clean one."""
    from experiments import readme_seeds

    if summary is not None:
        (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert readme_seeds._ended(tmp_path) is ended


def test_a_study_with_missing_cells_says_its_verdicts_are_so_far(tmp_path):
    """A study part-way through its plan read "This data contradicts it" on 3 seeds of a planned 5, with
    nothing beside the verdict to say more cells were to come. A copy of a committed study with one
    cell taken away says how many of its cells the verdicts rest on."""
    committed = Path(make_results.__file__).parent / "results" / "ordering_ablation"
    copy = tmp_path / "results" / "ordering_ablation"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("runs", "*.png"))
    cells = sorted((copy / "cells").glob("*.json"))
    planned = len(json.loads((copy / "study.json").read_text())["seeds"]) * len(ordering_ablation.MODES)
    cells[-1].unlink()
    text = "\n".join(make_results.study_section("ordering_ablation", tmp_path / "results"))
    assert f"**What the data says (so far: {len(cells) - 1} of {planned} cells;" in text


def test_study_help_runs_as_a_script():
    done = subprocess.run(
        [sys.executable, "-m", "experiments.scaling", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "--quick" in done.stdout


def test_t_interval_and_curve_interpolation():
    mean, half = ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-3)
    assert ci95([5.0])[1] != ci95([5.0])[1]  # nan: one seed has no interval
    rows = [
        {"agent": 0, "frames": 100, "wall_s": 1.0, "mean_return_100": 10.0},
        {"agent": 0, "frames": 200, "wall_s": 2.0, "mean_return_100": 20.0},
        {"agent": 1, "frames": 100, "wall_s": 1.0, "mean_return_100": 30.0},
        {"agent": 1, "frames": 200, "wall_s": 2.0, "mean_return_100": 40.0},
    ]
    import numpy as np

    curve = swarm_curve(rows, "frames", np.array([300.0, 400.0, 900.0]), agents=2)  # swarm frames = 2 x agent frames
    assert curve[0] == pytest.approx(25.0) and curve[1] == pytest.approx(30.0) and np.isnan(curve[2])
