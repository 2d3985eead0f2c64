"""The `gossiprl` command as a user meets it: clear one-line errors, and real short runs."""

import csv
import importlib.util
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from gossiprl.comms import keys
from gossiprl.comms.trajectories import LearnerGone, LearnerLost
from helpers import child_pids, free_port, invoke, is_running, start_endless_swarm, wait_for, wait_until_training


def test_topology_show_prints_matrix_and_diagnostics(tmp_path):
    result = invoke("topology", "show", "sparse", "-n", "8", "--plot", tmp_path / "g.png")
    assert result.exit_code == 0, result.output
    assert "slem" in result.output and "spectral gap" in result.output
    assert (tmp_path / "g.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "args,words",
    [
        (["topology", "show", "wheel"], "neither a topology"),
        (["topology", "show", "rign"], "Invalid value for SPEC: 'rign' is neither"),
        (["topology", "show", "sparse", "--peers", "9"], "Invalid value: peers must be from 1 to 7"),
        (["topology", "show", "hypercub"], "did you mean 'hypercube'?"),
        (["run", "--topology", "rign"], "did you mean 'ring'?"),
        (["run", "--topology", "sparse", "--option", "peer=2"], "did you mean 'peers'?"),
        (["run", "--env", "CartPol-v1"], "did you mean 'CartPole-v1'?"),
        (["run", "--env", "ALE/Pogn-v5"], "did you mean 'ALE/Pong-v5'?"),
        (
            ["run", "--agents", "1", "--metrics-port", "9100"],
            "a run without gossip (one agent, or --topology none) has no broker",
        ),
        (["run", "--agents", "4", "--topology", "none", "--metrics-port", "9100"], "--topology none) has no broker"),
        (["run", "--agents", "0"], "0 is not in the range"),
        (["run", "--env", "NoSuchEnv-v9"], "NoSuchEnv-v9"),
        (["run", "--topology", "mesh"], "ring, sparse, full"),
        (["run", "--mode", "eventual"], "sync"),
        (["run", "--stop-at-return", "high"], "'auto' or 'none'"),
        (["run", "--aggregate", "mode"], "trimmed-mean"),
        (["run", "--deviation-bound", "0.5"], "factor > 1, or 0"),
        (["broker", "--agents", "4", "--topology", "sparse", "--peers", "9"], "peers"),
        (["broker", "--topology", "ring"], "the ring topology needs the number of agents"),
        (["run", "--topology", "ring", "--peers-per-round", "2"], "unknown option 'peers_per_round' for 'ring'"),
        (["run", "--topology", "random-regular", "--option", "degree"], "give KEY=INTEGER"),
    ],
)
def test_bad_input_gets_one_clear_error(args, words):
    result = invoke(*args)
    assert result.exit_code == 2
    assert words in result.output


def test_a_misspelt_topology_or_env_gets_no_guess_when_nothing_is_near():
    assert "did you mean" not in invoke("run", "--topology", "wheel").output
    assert "did you mean" not in invoke("run", "--env", "Nonsense").output


def test_a_swarm_without_gossip_names_the_gossip_flags_it_ignores_and_runs(tmp_path):
    result = invoke(
        "run", "--agents", 2, "--topology", "none", "--mode", "async", "--gossip-every", 3, "--aggregate", "median",
        "--no-overlap-lr-scale", "--total-frames", 400, "--run-dir", tmp_path / "run", "--no-progress",
        "--stop-at-return", "none",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        "warning: this swarm does not gossip, so it ignores --mode, --gossip-every, --no-overlap-lr-scale, --aggregate"
        in result.output
    )


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_track_without_wandb_is_refused_before_the_run_starts(tmp_path):
    result = invoke("run", "--agents", 2, "--track", "--run-dir", tmp_path / "run", "--no-progress")
    assert result.exit_code == 1 and "--track needs wandb" in result.output
    assert "agent(s) on" not in result.output, "the run's header came before the error"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["run", "--agents", 2, "--no-progress"], ["broker", "--agents", 2]])
def test_a_taken_metrics_port_is_refused_before_start_up(tmp_path, command):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        where = ["--bind", f"tcp://127.0.0.1:{free_port()}", "--insecure"] if command[0] == "broker" else []
        where = ["--run-dir", tmp_path / "run"] if command[0] == "run" else where
        result = invoke(*command, *where, "--metrics-port", port)
    assert result.exit_code == 1 and f"cannot serve stats on 127.0.0.1:{port}" in result.output, result.output
    assert "agent(s) on" not in result.output and "broker on" not in result.output, "start-up came before the error"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_broker_stopped_by_a_signal_exits_as_run_and_agent_do(sig):
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gossiprl.cli",
            "broker",
            "-n",
            "2",
            "--bind",
            f"tcp://127.0.0.1:{free_port()}",
            "--insecure",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    banner = ""
    while "gossiprl broker on" not in banner:  # after the --insecure warning
        line = broker.stdout.readline()
        assert line, f"the broker exited: {banner}"
        banner += line
    broker.send_signal(sig)
    output, _ = broker.communicate(timeout=30)
    assert broker.returncode == 128 + sig, output  # 130 for Ctrl-C, 143 for SIGTERM (it exited 0)
    assert "broker stopped" in output


def test_run_builds_the_family_with_the_options_topology_show_takes(monkeypatch, tmp_path):
    from gossiprl import launch

    built = []

    def record(swarm, *args, **kw):
        built.append(launch.make_topology(swarm))
        raise launch.RunError("recorded")

    monkeypatch.setattr(launch, "run", record)
    result = invoke(
        "run",
        "--agents",
        8,
        "--topology",
        "gala-exponential",
        "--peers-per-round",
        2,
        "--run-dir",
        tmp_path / "r",
        "--no-progress",
    )
    assert result.exit_code == 1 and "recorded" in result.output
    shown = invoke("topology", "show", "gala-exponential", "-n", 8, "--peers-per-round", 2)
    assert shown.exit_code == 0 and built[0].describe().strip() in shown.output
    assert built[0].out_peers(0, 0) == (1, 7) and built[0].out_peers(0, 1) == (2, 6)


def test_matrix_file_that_is_not_row_stochastic_is_refused(tmp_path):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.array([[0.5, 0.4], [0.5, 0.5]]))
    result = invoke("run", "--agents", "2", "--topology", bad, "--run-dir", tmp_path / "r")
    assert result.exit_code == 2 and "row 0" in result.output
    assert not (tmp_path / "r").exists()


def test_run_dir_holding_another_run_is_not_overwritten(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"theirs": 1}')
    result = invoke("run", "--agents", "2", "--run-dir", run_dir, "--no-progress")
    assert result.exit_code == 1 and "already holds a run" in result.output
    assert (run_dir / "config.json").read_text() == '{"theirs": 1}'


def test_resume_without_a_run_says_so(tmp_path):
    result = invoke("run", "--agents", "2", "--run-dir", tmp_path / "none", "--resume", "--no-progress")
    assert result.exit_code == 1 and "holds no run" in result.output


@pytest.mark.timeout(240)  # the first test to ask for swarm_run pays for it
def test_cartpole_swarm_run_leaves_summary_metrics_and_checkpoints(swarm_run):
    """What `gossiprl run --agents 2 --topology ring` leaves (the run is conftest's swarm_run), and eval of it."""
    run_dir = swarm_run
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    assert summary["agents"] == 2 and summary["frames"] >= config["swarm"]["total_frames"] > 0
    assert summary["fps"] > 0 and summary["episodes"] > 0
    assert config["swarm"]["topology"] == "ring" and config["agent"]["env_id"] == "CartPole-v1"
    for rank in (0, 1):
        agent_dir = run_dir / f"agent-{rank}"
        header = (agent_dir / "metrics.csv").read_text().splitlines()[0].split(",")
        assert "gossip/consensus_distance" in header and "mean_return_100" in header
        assert (agent_dir / "checkpoint.pt").stat().st_size > 0
        assert any(p.name.startswith("events.out.tfevents") for p in agent_dir.iterdir())
    evaluated = invoke("eval", run_dir, "--episodes", 3, "--json")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.output)["overall"]["episodes"] == 6
    # the consensus policy's score, as `gossiprl eval` (10 episodes by default) prints it: only eval had it
    consensus = json.loads(invoke("eval", run_dir, "--json").output)["consensus"]
    assert summary["consensus_return"] == consensus["mean"] and consensus["agents"] == 2
    assert "consensus_return: the consensus policy" in summary["mean_return_definition"]
    line = f"consensus policy (the mean of the agents' parameters): mean return {consensus['mean']:.1f} over 10"
    assert line in (run_dir.parent / "output.txt").read_text()


@pytest.mark.timeout(120)
def test_impala_ring_of_two_runs_end_to_end_and_logs_its_lag(tmp_path):
    run_dir = tmp_path / "run"
    small = ["--actors-per-agent", 2, "--num-envs", 2, "--n-steps", 5, "--batch-size", 2, "--queue-size", 2]
    threads = ["--actor-placement", "thread"]  # the gossip is under test here; actor processes have their own run
    result = invoke(
        "run", "--algo", "impala", "--agents", 2, "--topology", "ring", *small, *threads, "--total-frames", 2000,
        "--log-every", 10, "--run-dir", run_dir, "--no-progress", "--stop-at-return", "none",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["agents"] == 2 and summary["frames"] >= 2000 and summary["episodes"] > 0
    for rank in (0, 1):
        with open(run_dir / f"agent-{rank}" / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert int(rows[-1]["updates"]) == 50  # 1000 frames per agent, 20 per update
        assert all(float(row["gossip/consensus_distance"]) >= 0 for row in rows)
        lags = [float(row["impala/policy_lag_max"]) for row in rows]
        assert all(0 <= lag <= 10 for lag in lags), lags
        assert all(0 <= float(row["impala/rho_clipped"]) <= 1 for row in rows)


@pytest.mark.timeout(180)
def test_impala_with_actor_processes_trains_cartpole_end_to_end_with_an_actor_from_elsewhere(tmp_path):
    """One actor process the learner spawns, and one `gossiprl actor` that joins over tcp with its
    CURVE key as an actor on another host would (started first: it waits for the learner to bind).
    With keys, the learner's own actor had none and was refused, and the agent's config.json could
    not hold the key paths: the run failed at its start."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    learner_public, learner_secret = keys.generate(tmp_path / "learner", "learner")
    _, remote_secret = keys.generate(tmp_path / "allowed", "remote")
    remote = subprocess.Popen(
        [sys.executable, "-m", "gossiprl.cli", "actor", "--connect", endpoint, "--env", "CartPole-v1",
         "--curve-secret", remote_secret, "--curve-learner", learner_public],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    run_dir = tmp_path / "run"
    small = ["--actors-per-agent", 1, "--num-envs", 2, "--n-steps", 5, "--batch-size", 2, "--queue-size", 4]
    keyed = ["--actors-curve-secret", learner_secret, "--actors-curve-allow", tmp_path / "allowed"]
    try:
        result = invoke(
            "run", "--algo", "impala", "--actor-placement", "process", "--actors-bind", endpoint, *keyed,
            "--agents", 1, *small, "--total-frames", 3000, "--log-every", 10, "--run-dir", run_dir, "--no-progress",
            "--stop-at-return", "none",
        )  # fmt: skip
        said, _ = remote.communicate(timeout=60)
    finally:
        remote.kill()
    assert result.exit_code == 0, result.output
    assert remote.returncode == 0, said
    sent = int(re.search(r"actor done: ([\d,]+) unrolls sent", said).group(1).replace(",", ""))
    assert sent > 0  # the learner told it to stop, and it had sent unrolls before
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 3000 and summary["episodes"] > 0
    with open(run_dir / "agent-0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["updates"]) == 150  # 3000 frames, 20 per update
    assert all(0 <= float(row["impala/policy_lag_max"]) <= 10 for row in rows)
    assert all(0 <= float(row["impala/queue_depth"]) <= 4 for row in rows)  # the credits bound the queue
    assert float(rows[-1]["impala/refused_joins_total"]) == float(rows[-1]["impala/bad_messages_total"]) == 0
    assert float(rows[-1]["impala/left_total"]) == 0  # the actor from elsewhere stayed until the learner stopped it


@pytest.mark.parametrize(
    "outcome, status",
    [
        ((7, "the learner is done"), 0),
        ((7, "this learner dropped actor-0, which left; start the actor again"), 3),
        (LearnerLost("the learner at tcp://127.0.0.1:5999 fell silent for 60 s"), 3),
        (LearnerGone("the learner at tcp://127.0.0.1:5999 refused this actor: it trains on Pong"), 1),
    ],
    ids=["done", "dropped", "lost", "refused"],
)
def test_an_actor_says_by_its_exit_status_whether_to_start_it_again(monkeypatch, outcome, status):
    """A supervisor restarting `gossiprl actor` must tell a learner that ended (leave it be) from a
    learner lost after the actor joined it (start it again) and from an error (look into it): the
    first two both exited 0, and a lost learner 1, as a refused join does."""
    from gossiprl.rl import actor_processes

    def run_actor(*_, **__):
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(actor_processes, "run_actor", run_actor)
    result = invoke("actor", "--connect", "tcp://127.0.0.1:5999", "--env", "CartPole-v1")
    assert result.exit_code == status, result.output
    assert ("actor done: 7 unrolls sent" in result.output) == isinstance(outcome, tuple)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_process_and_leaves_checkpoints(tmp_path, sig):
    """Ctrl-C or a scheduler's SIGTERM: agents stop, checkpoint, and no process is left behind."""
    run_dir = tmp_path / "run"
    launcher = start_endless_swarm(run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until_training(run_dir, launcher, 60)
    children = child_pids(launcher.pid)
    assert len(children) >= 2
    launcher.send_signal(sig)
    output, _ = launcher.communicate(timeout=90)
    assert launcher.returncode == 128 + sig, output  # 130 for Ctrl-C, 143 for SIGTERM
    assert "interrupted" in output
    # multiprocessing's resource tracker leaves just after its parent
    wait_for(
        lambda: not [pid for pid in children if is_running(pid)], 5, "agent processes outlived the launcher", every=0.1
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "interrupted" and summary["frames"] > 0
    for rank in (0, 1):
        assert (run_dir / f"agent-{rank}" / "checkpoint.pt").stat().st_size > 0
        assert not (run_dir / f"agent-{rank}" / "checkpoint.pt.tmp").exists()


def test_resume_with_another_env_is_refused_naming_both(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"agent": {"env_id": "CartPole-v1"}}))
    result = invoke("run", "--agents", "2", "--env", "Acrobot-v1", "--run-dir", run_dir, "--resume", "--no-progress")
    assert result.exit_code == 1
    assert "--env Acrobot-v1 conflicts with the run's env_id=CartPole-v1" in result.output


def test_eval_of_a_corrupt_checkpoint_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "agent-0").mkdir()
    (tmp_path / "agent-0" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    result = invoke("eval", tmp_path)
    assert result.exit_code == 1 and "agent-0/checkpoint.pt: not a readable checkpoint" in result.output
    assert "Traceback" not in result.output


def test_an_agent_with_a_rank_the_swarm_lacks_gets_one_line(tmp_path):
    import topologies
    from gossiprl import Broker

    with Broker(topologies.make("ring", 2)).start() as broker:
        result = invoke("agent", "--connect", broker.address, "--rank", 5, "--total-frames", 80, "--run-dir", tmp_path)
    assert result.exit_code == 1 and "rank 5 out of range" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["run"], ["eval", "."], ["agent", "--connect", "tcp://127.0.0.1:1"]])
def test_training_commands_on_the_comms_only_install_say_which_extra(monkeypatch, command):
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # what `import gymnasium` meets without the rl extra
    result = invoke(*command)
    assert result.exit_code == 1 and "install the rl extra: pip install -e '.[rl]'" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
@pytest.mark.parametrize(
    "command", [["run"], ["agent", "--connect", "tcp://127.0.0.1:1", "--rank", "0"], ["eval", "."]]
)
def test_device_cuda_without_a_gpu_is_refused_at_start(command):
    result = invoke(*command, "--device", "cuda")
    assert result.exit_code == 2 and "no CUDA GPU is visible" in result.output


@pytest.mark.timeout(30)
def test_an_agent_waiting_for_an_absent_broker_obeys_stop(tmp_path):
    from gossiprl.launch import RunError, run_agent
    from gossiprl.rl.agent import AgentConfig

    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(RunError, match="stopped while waiting for the broker"):
        run_agent(
            "tcp://127.0.0.1:9",
            0,
            AgentConfig(total_frames=80),
            tmp_path,
            stop=stop,
            connect_timeout=120,
            echo=lambda line: None,
        )
    assert time.monotonic() - t0 < 6  # within one liveness window of the signal, not the 120 s connect timeout


def test_bench_mix_prints_mix_and_axpy_from_one_run():
    result = invoke("bench", "mix", "--params", 50000, "--reps", 3)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "axpy" in line]
    assert len(lines) == 4 and all(re.search(r"mix .* ms, axpy .* ms: \d+\.\d\dx", line) for line in lines)
    assert [("hot" in line, "cold" in line) for line in lines] == [(True, False)] * 2 + [(False, True)] * 2


def test_bench_mix_on_cpu_time_says_so():
    result = invoke("bench", "mix", "--params", 50000, "--reps", 3, "--cpu-time")
    assert result.exit_code == 0, result.output
    assert "(CPU time)" in result.output and sum("axpy" in line for line in result.output.splitlines()) == 4


@pytest.mark.timeout(300)
def test_bench_train_quick_measures_every_row_in_one_run(tmp_path):
    out = tmp_path / "bench.json"
    result = invoke("bench", "train", "--env", "CartPole-v1", "--quick", "--data-plane", "shm", "--json", out)
    assert result.exit_code == 0, result.output
    rows = {row["row"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == [
        "raw vector env, random actions",
        "minimal A2C loop",
        "one agent, default flags",
        "minimal A2C loop, one core busy",
        "one agent, one core busy",
        "one agent, one core busy, old threads",
        "2 minimal loops side by side",
        "ring of 2, sync, blocking",
        "ring of 2, sync, overlapped",
        "ring of 2, async, overlapped",
    ]
    # every row trained; the old thread default may collapse so far under load that it trains nothing
    assert all(row["fps"] > 0 for name, row in rows.items() if not name.endswith("old threads"))
    # and every training row that reached its steady state says what CPU each frame took
    trained = [row for name, row in rows.items() if not name.startswith("raw") and row["steady"]]
    assert trained and all(row["cpu_ms_per_frame"] > 0 for row in trained)
    ring = rows["ring of 2, sync, overlapped"]["shares"]
    assert set(ring) == {"rollout", "learn", "gossip_wait", "mix"} and 0 < sum(ring.values()) <= 1.0
    assert re.search(
        r"ring of 2, sync, overlapped +[\d,]+ frames/s +\d+\.\d\dx one agent, +\d+\.\d\dx side by side", result.output
    )


def test_bench_train_refuses_bad_flags_in_one_line():
    refused = invoke("bench", "train", "--data-plane", "carrier-pigeon")
    assert refused.exit_code == 2 and "'broker', 'shm', 'direct', 'auto'" in refused.output
    bad = invoke("bench", "train", "--agents", "1,x")
    assert bad.exit_code == 2 and "give ring sizes >= 2" in bad.output
    bad = invoke("bench", "learners", "--actors", "0,2")
    assert bad.exit_code == 2 and "give actor counts >= 1 separated by commas, e.g. 1,4,8" in bad.output
