"""Where a study writes when it is not told: never into the committed experiments/results/."""

import json
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import click
import pytest

from experiments.common import (
    PLANE,
    REAL_ENV,
    Cell,
    cell_fingerprint,
    cell_plan,
    fresh_out,
    parse_seeds,
    ran_swarm,
    read_curves,
)
from experiments.study import RESULTS
from gossiprl.launch import SwarmConfig
from gossiprl.rl.a2c import ATARI_LR
from gossiprl.settings import NO_GOSSIP


def test_a_run_without_out_gets_a_fresh_directory_outside_the_committed_results():
    quick, first = fresh_out("scaling", quick=True), fresh_out("scaling", quick=True)
    assert quick != first and quick.name == "scaling"
    # its shared cell cache (<out>/../_shared) is a fresh temporary directory's too
    assert quick.parent.is_dir() and quick.parent.parent == Path(tempfile.gettempdir())
    real = fresh_out("scaling", quick=False)
    assert real.parent.name == "runs" and real.name.startswith("scaling-") and not real.exists()
    planned = fresh_out("scaling", quick=True, create=False)  # --plan writes nothing, a temporary dir included
    assert planned.parent.parent == Path(tempfile.gettempdir()) and not planned.parent.exists()
    for out in (quick, real, planned):
        assert RESULTS.resolve() not in out.resolve().parents


def test_a_window_too_short_for_every_cell_runs_the_small_and_short_ones_and_plans_the_rest():
    from experiments import swarm_vs_one
    from experiments.study import run_now

    one, ring, lr2 = (
        {"1 agent", swarm_vs_one.ONE_ATARI},
        {"ring of 4", swarm_vs_one.RING_ATARI},
        swarm_vs_one.RING_ATARI,
    )
    cells, _ = swarm_vs_one.build(False, 1_000_000, [1, 2])
    assert len(run_now(cells, None, None)) == 10
    short = run_now(cells, None, 1_000_000)  # the ring's agents get 1M each; the 4M agent waits
    assert {c.setting for c in short} == one | ring and len(short) == 8
    assert {c.setting for c in run_now(cells, 1, None)} == one | {swarm_vs_one.EQUAL_TOTAL}
    assert {c.setting for c in run_now(cells, 1, 1_000_000)} == one
    assert {c.a2c.lr for c in cells if c.setting == lr2} == {ATARI_LR}
    assert {(c.setting, c.seed) for c in run_now(cells, None, None, (lr2,))} == {(lr2, 1), (lr2, 2)}


def test_a_cell_is_named_by_the_rate_it_runs_at_not_by_the_default():
    """MinAtar's default A2C rate moved from 7e-4 to 1.4e-3, then to 2.8e-3: a study's cell asking
    for no rate runs at the studies' 1.4e-3 and is the same run as one naming it, so no study runs it
    twice and none lost its runs; a PPO cell ignores A2C's rate and keeps the fingerprint it had."""
    from experiments.common import STUDY_MINATAR_LR, Cell, cell_fingerprint
    from gossiprl.launch import SwarmConfig
    from gossiprl.rl.a2c import MINATAR_LR
    from gossiprl.rl.settings import A2CConfig

    def fingerprint(env, agent=None, **a2c):
        return cell_fingerprint(
            Cell("x", 1, 1, 1000, SwarmConfig(agents=1), A2CConfig(**a2c), agent=agent or {}), env, 10
        )

    assert STUDY_MINATAR_LR == 2 * ATARI_LR != MINATAR_LR
    assert fingerprint("MinAtar/Breakout-v1") == fingerprint("MinAtar/Breakout-v1", lr=STUDY_MINATAR_LR)
    assert fingerprint("MinAtar/Breakout-v1") != fingerprint("MinAtar/Breakout-v1", lr=MINATAR_LR)
    assert fingerprint("MinAtar/Breakout-v1") != fingerprint("MinAtar/Breakout-v1", lr=ATARI_LR)
    assert fingerprint("CartPole-v1") == fingerprint("CartPole-v1", lr=ATARI_LR)
    ppo = {"algo": "ppo"}
    assert fingerprint("MinAtar/Breakout-v1", ppo) == fingerprint("MinAtar/Breakout-v1", ppo, lr=ATARI_LR)


def test_another_learners_cell_is_named_by_its_learners_settings(monkeypatch):
    """A PPO or IMPALA cell holds its learner's settings as they resolve for the env, so a cell run
    under another default (IMPALA's control-task unrolls went from 20 x 2 to 5 x 4) is not reused for
    today's; and its row's rollout shape is that learner's, not A2C's."""
    from dataclasses import replace

    from experiments.common import Cell, cell_fingerprint, learner_settings, steps_per_update
    from gossiprl.launch import SwarmConfig
    from gossiprl.rl import impala

    cell = Cell("x", 1, 1, 1000, SwarmConfig(agents=1), agent={"algo": "impala"})
    today = cell_fingerprint(cell, "CartPole-v1", 10)
    hp = learner_settings(cell, "CartPole-v1")
    assert (hp.n_steps, hp.batch_size, steps_per_update(hp)) == (5, 4, 5 * 4 * 4)
    assert steps_per_update(learner_settings(cell, "MinAtar/Breakout-v1")) == 20 * 4 * 8
    resolve = impala.resolve_defaults
    monkeypatch.setattr(impala, "resolve_defaults", lambda cfg, env: replace(resolve(cfg, env), n_steps=20))
    assert cell_fingerprint(cell, "CartPole-v1", 10) != today
    # A2C's cells keep their fingerprints (LOOP_VERSION marks A2C's changes), whatever IMPALA's defaults
    a2c = Cell("x", 1, 1, 1000, SwarmConfig(agents=1))
    monkeypatch.undo()
    before = cell_fingerprint(a2c, "CartPole-v1", 10)
    monkeypatch.setattr(impala, "resolve_defaults", lambda cfg, env: replace(resolve(cfg, env), n_steps=20))
    assert cell_fingerprint(a2c, "CartPole-v1", 10) == before
    ppo = learner_settings(Cell("x", 1, 1, 1000, SwarmConfig(agents=1), agent={"algo": "ppo"}), "MinAtar/Breakout-v1")
    assert (ppo.n_steps, ppo.num_envs) == (128, 8)


def test_only_an_unknown_setting_is_refused_naming_the_studys_settings(tmp_path):
    from click.testing import CliRunner

    from experiments import swarm_vs_one

    result = CliRunner().invoke(swarm_vs_one.main, ["--only", "ring of 5", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "swarm_vs_one has no setting 'ring of 5'; its settings: 1 agent; ring of 4;" in result.output
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_recorded_command_is_quoted_and_plans_the_whole_study():
    from experiments.study import rerun_command

    command = rerun_command("learners", False, "MinAtar/Breakout-v1", 1_000_000, "1,2", None, Path("out dir"))
    expected = "python -m experiments.learners --env MinAtar/Breakout-v1 --frames 1000000 --seeds 1,2 --out 'out dir'"
    assert command == expected


def test_results_md_names_the_settings_whose_cells_ran_under_other_settings(tmp_path):
    """A cell of the default rate written before MinAtar's rate moved is still on disk: RESULTS.md
    says which settings hold such runs rather than showing them as today's."""
    import json

    from experiments import swarm_vs_one
    from experiments.common import cell_fingerprint, older_keys

    env = "MinAtar/Breakout-v1"
    cells, _ = swarm_vs_one.build(False, 1_000_000, [1])
    (tmp_path / "cells").mkdir()
    for cell in cells:
        fingerprint = cell_fingerprint(cell, env, 10)
        if cell.setting == "ring of 4":  # the ring's row as the 7e-4 default wrote it
            fingerprint = cell_fingerprint(next(c for c in cells if c.setting == swarm_vs_one.RING_ATARI), env, 10)
        (tmp_path / "cells" / f"{cell.key}.json").write_text(
            json.dumps({"fingerprint": fingerprint, "eval_episodes": 10})
        )
    assert older_keys(tmp_path, cells, env) == {"ring-of-4__seed1"}


def test_seeds_given_for_an_existing_study_run_now_and_add_to_its_plan(tmp_path):
    """--seeds on a study dir that plans more is a window: the plan keeps every seed it had (a run
    with --seeds 1,2,3 had rewritten a 5-seed study's study.json to 3, and RESULTS.md lost seeds 4
    and 5 of every setting); a dir of another study, env or budget is not extended."""
    import json

    from experiments.study import plan_seeds

    assert plan_seeds(tmp_path, "learners", "MinAtar/Breakout-v1", 1_000_000, False, [1, 2, 3]) == [1, 2, 3]
    meta = {"study": "learners", "env": "MinAtar/Breakout-v1", "frames_per_cell": 1_000_000, "quick": False}
    (tmp_path / "study.json").write_text(json.dumps({**meta, "seeds": [1, 2, 3, 4, 5]}))
    assert plan_seeds(tmp_path, "learners", "MinAtar/Breakout-v1", 1_000_000, False, [1, 2, 3]) == [1, 2, 3, 4, 5]
    assert plan_seeds(tmp_path, "learners", "MinAtar/Breakout-v1", 1_000_000, False, [6]) == [1, 2, 3, 4, 5, 6]
    assert plan_seeds(tmp_path, "learners", "MinAtar/SpaceInvaders-v1", 1_000_000, False, [1]) == [1]
    assert plan_seeds(tmp_path, "learners", "MinAtar/Breakout-v1", 250_000, False, [1]) == [1]
    assert plan_seeds(tmp_path, "learners", "MinAtar/Breakout-v1", 1_000_000, True, [1]) == [1]  # a --quick run
    assert plan_seeds(tmp_path, "table1", "MinAtar/Breakout-v1", 1_000_000, False, [1]) == [1]


def test_a_cell_interrupted_or_failed_writes_no_row_and_stays_resumable(tmp_path, monkeypatch):
    """Ctrl-C reaches launch.run, which stops the agents (they checkpoint) and returns: the cell must
    end the study there, not be scored and recorded as if it had trained its frames; a failed one
    raises. Neither is marked trained, so the next run goes on from the checkpoints."""
    import json

    import pytest

    from experiments import common
    from experiments.common import QUICK_ENV, Cell, run_cell
    from gossiprl.launch import SwarmConfig

    cell = Cell("ring of 2", 1, 2, 8000, SwarmConfig(agents=2, topology="ring"))
    outcomes = (({"stopped_by": "interrupted", "failed": {}}, KeyboardInterrupt),)
    outcomes += (({"stopped_by": "total frames", "failed": {1: "boom"}}, RuntimeError),)
    for summary, error in outcomes:
        monkeypatch.setattr(common.launch, "run", lambda *a, summary=summary, **k: summary)
        with pytest.raises(error):
            run_cell(cell, tmp_path, QUICK_ENV, None, 2, "fp")
        marker = json.loads((tmp_path / "runs" / f"{cell.key}.cell.json").read_text())
        assert "trained" not in marker


def test_a_setting_with_cells_of_todays_plan_shows_only_those(tmp_path):
    """A rerun replaces a study's older cells seed by seed: a setting with a cell of today's plan
    leaves its older cells out (a mean of both mixed two budgets); one with none shows its older ones."""
    import json

    from experiments import swarm_vs_one
    from experiments.common import cell_fingerprint, shown_rows

    env = "MinAtar/Breakout-v1"
    cells, _ = swarm_vs_one.build(False, 1_000_000, [1, 2])
    (tmp_path / "cells").mkdir()
    for cell in cells:
        if cell.setting in ("ring of 4", "1 agent"):
            today = cell.setting == "ring of 4" and cell.seed == 1
            row = {"setting": cell.setting, "seed": cell.seed, "eval_episodes": 10}
            row["fingerprint"] = cell_fingerprint(cell, env, 10) if today else "older"
            (tmp_path / "cells" / f"{cell.key}.json").write_text(json.dumps(row))
    rows, older, hidden = shown_rows(tmp_path, cells, env)
    assert [(r["setting"], r["seed"]) for r in rows] == [("1 agent", 1), ("1 agent", 2), ("ring of 4", 1)]
    assert older == {"1-agent__seed1", "1-agent__seed2", "ring-of-4__seed2"}
    assert [(c.setting, c.seed) for c in hidden] == [("ring of 4", 2)]
    rows, older, hidden = shown_rows(tmp_path, cells, env, all_older=True)
    assert len(rows) == 4 and hidden == []


def test_seeds_that_are_not_whole_numbers_get_a_one_line_error():
    assert parse_seeds(None) == [1, 2, 3, 4, 5] and parse_seeds(" 4, 5,") == [4, 5]
    for given, says in (("1,x", "whole numbers"), (",", "at least one seed"), ("", "at least one seed")):
        with pytest.raises(click.BadParameter, match=says):
            parse_seeds(given)


def test_sync_cells_gossip_over_shared_memory_and_are_named_as_through_the_broker():
    """The plane changes nothing a sync swarm learns (a test in test_dataplane.py), so a sync cell
    runs on the faster one and keeps the fingerprint its broker-plane run had: reused either way.
    An async one does not: its reader mixes the newest letter over shared memory, the oldest unread
    one through the broker."""
    ring = Cell("ring", 1, 4, 4_000_000, SwarmConfig(agents=4, topology="ring"))
    assert ring.swarm.data_plane == "broker" and ran_swarm(ring).data_plane == PLANE
    assert ran_swarm(ring).total_frames == 4_000_000
    as_declared = replace(ring, plane=None)
    assert ran_swarm(as_declared).data_plane == "broker"
    assert cell_fingerprint(ring, "MinAtar/Breakout-v1", 10) == cell_fingerprint(as_declared, "MinAtar/Breakout-v1", 10)
    for swarm in (
        SwarmConfig(agents=4, topology="ring", mode="async", max_staleness=1),
        SwarmConfig(agents=4, topology=NO_GOSSIP),
        SwarmConfig(agents=1, topology=None),
    ):
        assert ran_swarm(replace(ring, swarm=swarm)).data_plane == "broker", swarm
    direct = SwarmConfig(agents=4, topology="ring", data_plane="direct")
    assert ran_swarm(replace(ring, swarm=direct)).data_plane == "direct"  # a plane the cell names is its own


def test_a_cell_that_keeps_its_plane_is_not_given_a_run_made_on_another(tmp_path):
    """Cells on both planes share a fingerprint (they learn the same). The layout study's one-host arm
    keeps the broker's plane because its question is the time the bytes take: a run another study made
    over shared memory is not its run, while the reverse reuse stands (the row names its plane)."""
    from experiments.common import shared_row

    ring = Cell("ring", 1, 4, 4_000_000, SwarmConfig(agents=4, topology="ring"))
    as_declared = replace(ring, setting="one host", plane=None)
    fingerprint = cell_fingerprint(ring, "MinAtar/Breakout-v1", 10)
    for plane, reused in ((PLANE, ("ring",)), ("broker", ("ring", "one host")), (None, ("ring", "one host"))):
        row = {"agents_mean": 1.0} if plane is None else {"data_plane": plane, "agents_mean": 1.0}  # None: unrecorded
        (tmp_path / f"{fingerprint}.json").write_text(json.dumps(row))
        cells = (ring, as_declared)
        rows = {c.setting: shared_row(c, tmp_path, fingerprint) for c in cells}
        assert tuple(setting for setting, row in rows.items() if row is not None) == reused, plane
        states = {c.setting: cell_plan(c, tmp_path / "study", "MinAtar/Breakout-v1", 10, tmp_path).state for c in cells}
        assert states == {s: "cached" if s in reused else "to run" for s in rows}, plane


def test_a_curve_resumed_after_a_kill_reads_each_frame_once(tmp_path):
    """Committed curves of runs resumed after a kill hold the killed session's rows past its checkpoint
    and then the resumed session's rows from that checkpoint on: the curve went back in frames, which
    np.interp reads as garbage. Each agent keeps the rows of the session that went on."""
    (tmp_path / "curves").mkdir()
    lines = ["agent,frames,wall_s,mean_return_100,wait_s,mix_s"]
    lines += [f"0,{f},{f / 10},{f / 100},0,0" for f in (100, 200, 300, 400)]  # killed after its checkpoint at 200
    lines += [f"0,{f},{f / 10 + 1},{f / 100 + 1},0,0" for f in (300, 400, 500)]  # resumed from 200
    lines += [f"1,{f},{f / 10},{f / 100},0,0" for f in (100, 200, 300, 400, 500)]
    (tmp_path / "curves" / "cell.csv").write_text("\n".join(lines) + "\n")

    rows = read_curves(tmp_path, "cell")

    assert [(r["agent"], r["frames"], r["mean_return_100"]) for r in rows] == [
        (0, 100, 1.0), (0, 200, 2.0), (0, 300, 4.0), (0, 400, 5.0), (0, 500, 6.0),
        (1, 100, 1.0), (1, 200, 2.0), (1, 300, 3.0), (1, 400, 4.0), (1, 500, 5.0),
    ]  # fmt: skip


def test_a_cells_frames_per_second_are_read_off_its_agents_training_clocks(tmp_path):
    """The launcher's seconds include starting the agents and the broker; the row's frames/s is every
    agent's frames over the longest any agent trained, its curve's last rows, whatever the row says."""
    from experiments.common import load_rows

    (tmp_path / "cells").mkdir()
    (tmp_path / "curves").mkdir()
    lines = ["agent,frames,wall_s,mean_return_100,wait_s,mix_s"]
    lines += [f"0,{f},{f / 100},1,0,0" for f in (500, 1000)]  # agent 0: 1000 frames in 10 s
    lines += [f"1,{f},{f / 50},1,0,0" for f in (500, 1000)]  # agent 1: 1000 frames in 20 s
    (tmp_path / "curves" / "cell.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "cells" / "cell.json").write_text(json.dumps({"setting": "s", "fps": 40.0, "gossip_share": 0.0}))
    (tmp_path / "cells" / "library.json").write_text(json.dumps({"setting": "sb3", "fps": 40.0}))
    (tmp_path / "curves" / "unlogged.csv").write_text(lines[0] + "\n")
    (tmp_path / "cells" / "unlogged.json").write_text(json.dumps({"setting": "u", "fps": 40.0, "gossip_share": 0.0}))

    rows = {r["setting"]: r for r in load_rows(tmp_path)}

    assert rows["s"]["fps"] == pytest.approx(2000 / 20)
    assert rows["sb3"]["fps"] == 40.0  # a library's row keeps the figure its own clock gave
    assert rows["u"]["fps"] == 40.0  # a curve with no rows has no clock to read


@pytest.mark.parametrize("record", ["{bad", "[1, 2]"])
def test_a_cell_record_that_is_not_a_json_object_stops_the_study_with_one_line_naming_it(tmp_path, record):
    cell = Cell("ring of 2", 1, 2, 8000, SwarmConfig(agents=2, topology="ring"))
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / f"{cell.key}.json").write_text(record)
    with pytest.raises(click.ClickException) as err:
        cell_plan(cell, tmp_path, "CartPole-v1", 2)
    message = err.value.format_message()
    assert message.startswith(f"{tmp_path / 'cells' / cell.key}.json: not a readable cell record (")
    assert message.endswith("; delete it and that cell runs afresh") and "\n" not in message


def test_the_ordering_study_sets_overlapped_sync_beside_blocking_sync_and_keeps_its_earlier_cells():
    """The overlapped arm came after the others had run: it is last (so --quick still runs sync and the
    independent agents), it differs from the sync ring only in gossip_overlap, it is compared with
    sync, and the other arms keep their fingerprints (their finished cells are not run again)."""
    from experiments import claims, ordering_ablation

    cells, settings = ordering_ablation.build(False, 1_000_000, [1])
    assert settings[:2] == ["sync (turn locks)", "none (independent)"] and settings[-1] == "sync, overlapped"
    by = {c.setting: c for c in cells}
    assert by["sync, overlapped"].agent == {"gossip_overlap": True} and by["sync (turn locks)"].agent == {}
    assert by["sync, overlapped"].swarm == by["sync (turn locks)"].swarm
    assert ("sync (turn locks)", "sync, overlapped") in claims.EXTRA["ordering_ablation"]
    fingerprint = cell_fingerprint(by["sync (turn locks)"], "MinAtar/Breakout-v1", 10)
    committed = RESULTS / "ordering_ablation" / "cells" / f"{by['sync (turn locks)'].key}.json"
    assert fingerprint == json.loads(committed.read_text())["fingerprint"]


def test_a_change_to_the_defaults_a2c_cells_run_under_comes_with_a_new_loop_version():
    """An A2C cell is named by its study's overrides, its resolved rate and LOOP_VERSION, not by every
    default it runs under (naming it by all of them would rename every finished cell). So a default
    that changes what an A2C cell learns must come with a new LOOP_VERSION, or finished cells are
    reused for runs they are not. This pins those defaults to the version: it fails until both move."""
    from dataclasses import asdict

    from experiments.common import LOOP_VERSION, Cell, learner_settings
    from gossiprl.launch import SwarmConfig
    from gossiprl.rl.settings import AgentConfig

    bookkeeping = {"env_id", "total_frames", "seed", "agents_per_host", "device", "torch_threads", "log_every"}
    bookkeeping |= {"checkpoint_every", "stop_at_return", "a2c", "ppo", "impala"}
    learning = {k: v for k, v in asdict(AgentConfig()).items() if k not in bookkeeping}
    cell = Cell("x", 1, 1, 1000, SwarmConfig(agents=1))
    minatar = {env: asdict(learner_settings(cell, env)) for env in ("MinAtar/Breakout-v1", "MinAtar/SpaceInvaders-v1")}
    a2c = {"num_envs": 16, "n_steps": 5, "lr": 0.0014, "rmsprop_eps": 1e-05, "rmsprop_alpha": 0.99}
    a2c |= {"entropy_coef": 0.01, "value_coef": 0.5, "gamma": 0.99, "max_grad_norm": 0.5, "clip_rewards": False}
    assert (LOOP_VERSION, learning, minatar) == (
        4,
        {
            "shared_init": True,
            "sticky_actions": 0.0,
            "gossip_every": 1,
            "gossip_overlap": False,
            "overlap_lr_scale": True,
            "aggregate": "mean",
            "deviation_bound": 10.0,
            "algo": "a2c",
        },
        {"MinAtar/Breakout-v1": a2c, "MinAtar/SpaceInvaders-v1": a2c},
    )


STUDIES = (
    "swarm_learning", "swarm_vs_one", "lr_sweep", "lr_confirm", "learners", "table1",
    "ordering_ablation", "topology_ablation", "scaling", "batch_period", "layout",
)  # fmt: skip


def _what_runs(cell, env_id: str) -> str:
    """What a cell trains, whatever its settings are called: its graph by its matrices (a topology's
    digest), not its family's name and options, beside the rest of what names a run."""
    import hashlib

    from experiments.common import learner_settings
    from gossiprl.settings import TOPOLOGY_OPTIONS

    swarm = {k: v for k, v in asdict(cell.swarm).items() if k not in {"topology", "total_frames", *TOPOLOGY_OPTIONS}}
    topology = ran_swarm(cell).make_topology()
    what = {
        "swarm": swarm,
        "graph": topology.digest() if topology is not None else cell.swarm.topology,
        "cell": (cell.seed, cell.agents, cell.total_frames, cell.gossip_every, cell.plane, str(cell.runner)),
        "learner": asdict(learner_settings(cell, env_id)),
        "agent": cell.agent,
    }
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def test_no_study_runs_one_run_under_two_settings():
    """The topology study ran sparse --time-varying beside one-peer-exponential: the same matrices,
    round for round, so the same run (seeds 2-5 scored exactly alike), read as two graphs with two
    outcomes and paid for twice. No study's plan holds two settings that train the same thing."""
    import importlib

    ope = SwarmConfig(agents=8, topology="one-peer-exponential")
    tv = SwarmConfig(agents=8, topology="sparse", time_varying=True)
    ring = SwarmConfig(agents=8, topology="ring")
    assert _what_runs(Cell("a", 1, 8, 8000, ope), REAL_ENV) == _what_runs(Cell("b", 1, 8, 8000, tv), REAL_ENV)
    assert _what_runs(Cell("a", 1, 8, 8000, ope), REAL_ENV) != _what_runs(Cell("c", 1, 8, 8000, ring), REAL_ENV)
    for name in STUDIES:
        cells, _ = importlib.import_module(f"experiments.{name}").STUDY.build(False, 1_000_000, [1])
        seen = {}
        for cell in cells:
            first = seen.setdefault(_what_runs(cell, REAL_ENV), cell.setting)
            assert first == cell.setting, f"{name}: {first!r} and {cell.setting!r} are the same run"
