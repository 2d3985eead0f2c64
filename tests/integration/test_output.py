"""What a new user meets: errors that say what is valid, exit codes, cleanup, and lines without nan."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import topologies
from gossiprl.comms import keys
from gossiprl.comms.broker import Broker
from gossiprl.comms.client import GossipClient
from helpers import child_pids, invoke, is_running, start_endless_swarm, wait_for, wait_until_training


@pytest.mark.timeout(120)
def test_a_run_that_finished_no_episode_prints_no_nan(tmp_path):
    """One update of 16 CartPole envs x 5 steps ends no episode (the shortest takes 8 steps)."""
    result = invoke("run", "--agents", 1, "--total-frames", 80, "--run-dir", tmp_path / "run", "--progress")
    assert result.exit_code == 0, result.output
    assert "mean return n/a (no episode finished yet)" in result.output
    assert not re.search(r"\bnan\b", result.output, re.IGNORECASE), result.output


def test_the_end_of_a_run_labels_each_return_and_says_what_to_do_next(tmp_path):
    """The stop rule's mean and the final one differ (agents finish their update after the stop);
    each line says which it is, and the run dir comes with the commands that use it."""
    from gossiprl.cli import end_lines

    agent = {"mean_return": 363.1}
    summary = {
        "solved_at": {"frames": 393_680, "wall_seconds": 37.2, "mean_return": 496.3},
        "frames": 400_080,
        "wall_seconds": 38.9,
        "fps": 10_291.0,
        "gossip_share": 0.428,
        "episodes": 1200,
        "mean_return": 491.9,
        "stopped_by": "solved: mean return 496.3 >= 475.0",
        "per_agent": {0: agent, 1: {"mean_return": 363.3}},
        "consensus_return": 500.0,
    }
    lines = end_lines(summary, tmp_path / "run")
    assert lines[0] == (
        "solved after 393,680 frames and 37.2s: the last 100 episodes of all agents, pooled, averaged 496.3"
    )
    assert lines[1].startswith("done (solved): 400,080 frames in 38.9s")
    assert lines[2] == (
        "mean return 491.9 over the last 100 episodes of all agents, pooled; each agent's own last 100: 363.1 to 363.3"
    )
    assert lines[3] == "consensus policy (the mean of the agents' parameters): mean return 500.0 over 10 fresh episodes"
    rest = "\n".join(lines[4:])
    for command in (
        f"tensorboard --logdir {tmp_path / 'run'}",
        f"gossiprl eval {tmp_path / 'run'}",
        f'gossiprl.load_policy("{tmp_path / "run"}")',
    ):
        assert command in rest


@pytest.mark.timeout(120)
def test_an_agent_that_finished_no_episode_prints_no_nan(tmp_path):
    with Broker(topologies.make("ring", 2), mode="async").start() as broker:
        result = invoke("agent", "--connect", broker.address, "--rank", 0, "--total-frames", 80, "--run-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert "stops at mean return 475 (its own last 100 episodes)" in result.output  # auto: CartPole's threshold
    assert "agent-0 done: 80 frames" in result.output and "mean return n/a" in result.output
    assert not re.search(r"\bnan\b", result.output, re.IGNORECASE), result.output
    assert json.loads(result.output.strip().splitlines()[-1])["mean_return"] is None
    # nobody said how many agents share this host, and the broker is on loopback: its whole swarm may
    assert "the broker is on this host, so its 2 agents may share this host's" in result.output
    assert json.loads((tmp_path / "agent-0" / "config.json").read_text())["agents_per_host"] == 2


@pytest.mark.parametrize(
    "endpoint, example",
    [
        ("5559", "tcp://127.0.0.1:5559"),
        ("localhost:5559", "tcp://localhost:5559"),
        ("tcp://127.0.0.1", "tcp://127.0.0.1:5555"),
        ("tcp://127.0.0.1:70000", "tcp://127.0.0.1:5555"),
        ("udp://10.0.0.1:5555", "tcp://10.0.0.1:5555"),
        ("ipc://", "tcp://127.0.0.1:5555"),
    ],
)
def test_a_malformed_endpoint_is_named_with_what_is_valid(endpoint, example):
    with pytest.raises(ValueError) as err:
        keys.check_endpoint(endpoint)
    assert str(err.value) == (
        f"{endpoint} is not a ZeroMQ endpoint: give tcp://HOST:PORT or ipc://PATH, e.g. {example}"
    )


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:5555", "tcp://*:0", "tcp://[::1]:5555", "tcp://eth0:*", "ipc:///tmp/broker", "inproc://broker"],
)
def test_valid_endpoints_pass(endpoint):
    assert keys.check_endpoint(endpoint) == endpoint


def test_broker_bind_that_is_no_endpoint_is_not_called_a_non_loopback_address():
    result = invoke("broker", "--bind", "5559", "--agents", 2)
    assert result.exit_code == 2
    assert (
        "5559 is not a ZeroMQ endpoint: give tcp://HOST:PORT or ipc://PATH, e.g. tcp://127.0.0.1:5559" in result.output
    )
    assert "loopback" not in result.output
    with pytest.raises(ValueError, match="not a ZeroMQ endpoint"):
        Broker(topologies.make("ring", 2), bind="5559")


def test_agent_connect_that_is_no_endpoint_gets_one_line():
    result = invoke("agent", "--connect", "5559", "--rank", 0)
    assert result.exit_code == 2
    assert "5559 is not a ZeroMQ endpoint" in result.output and "Traceback" not in result.output
    with pytest.raises(ValueError, match="not a ZeroMQ endpoint"):
        GossipClient("5559", 0)


def test_progress_line_before_the_first_episode_says_so_not_nan(capsys):
    from gossiprl.launch import Progress, _postfix, _progress_bar

    progress = Progress(agents=2)
    progress.add(0, {"frames": 320, "gossip_s": 0.1, "wall_s": 1.0, "returns": []})
    assert _postfix(progress).startswith("return n/a (no episode finished yet)")
    bar = _progress_bar(1000, True)
    bar(progress)
    bar(None)
    shown = capsys.readouterr().err
    assert "n/a (no episode finished yet)" in shown and "nan" not in shown
    progress.add(1, {"frames": 320, "gossip_s": 0.1, "wall_s": 1.0, "returns": [12.0, 14.0]})
    assert _postfix(progress).startswith("return 13.0 ")


def _rows(metrics) -> int:
    """The rows a metrics.csv holds so far (0 while it does not exist or has only its header)."""
    return max(0, len(metrics.read_text().splitlines()) - 1) if metrics.exists() else 0


@pytest.mark.timeout(120)
def test_an_interrupted_agent_checkpoints_and_exits_128_plus_the_signal(tmp_path):
    """Ctrl-C used to end `gossiprl agent` with 0, as if it had finished its budget. Rank 0 gets SIGINT and
    rank 1 SIGTERM: two agents of one async ring (neither waits for the other), started together so the
    suite pays for one agent start-up, not two."""
    signals = {0: signal.SIGINT, 1: signal.SIGTERM}
    with Broker(topologies.make("ring", 2), mode="async").start() as broker:
        agents = {
            rank: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gossiprl.cli",
                    "agent",
                    "--connect",
                    broker.address,
                    "--rank",
                    str(rank),
                    "--total-frames",
                    "100000000",
                    "--stop-at-return",
                    "none",
                    "--run-dir",
                    str(tmp_path),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in signals
        }
        try:
            for rank, agent in agents.items():
                # its first row, not the file: metrics.csv is opened before the first update, and an agent
                # stopped before that has learned nothing, so it rightly writes no checkpoint
                metrics = tmp_path / f"agent-{rank}" / "metrics.csv"
                wait_for(lambda m=metrics: _rows(m) >= 1, 90, f"agent-{rank} never logged an update", process=agent)
            for rank, agent in agents.items():
                agent.send_signal(signals[rank])
            outputs = {rank: agent.communicate(timeout=60)[0] for rank, agent in agents.items()}
        finally:
            for agent in agents.values():
                if agent.poll() is None:
                    agent.kill()
    for rank, agent in agents.items():
        assert agent.returncode == 128 + signals[rank], outputs[rank]
        assert f"agent-{rank} done:" in outputs[rank]
        assert (tmp_path / f"agent-{rank}" / "checkpoint.pt").stat().st_size > 0


@pytest.mark.timeout(120)
def test_an_agent_stops_once_its_own_last_100_episodes_reach_stop_at_return(tmp_path):
    """Any CartPole episode returns 8 or more, so a target of 5 is met once 100 episodes ended."""
    with Broker(topologies.make("ring", 2), mode="async").start() as broker:
        result = invoke(
            "agent",
            "--connect",
            broker.address,
            "--rank",
            0,
            "--total-frames",
            10_000_000,
            "--stop-at-return",
            5,
            "--agents-per-host",
            1,
            "--run-dir",
            tmp_path,
        )
    assert result.exit_code == 0, result.output
    assert "may share this host" not in result.output  # told, so not guessed
    assert json.loads((tmp_path / "agent-0" / "config.json").read_text())["agents_per_host"] == 1
    assert "stops at mean return 5 (its own last 100 episodes)" in result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["episodes"] >= 100 and summary["mean_return"] >= 5 and summary["frames"] < 100_000


def test_agent_stop_at_return_refuses_words():
    result = invoke("agent", "--connect", "tcp://127.0.0.1:9", "--rank", 0, "--stop-at-return", "soon")
    assert result.exit_code == 2 and "'soon': give a number, 'auto' or 'none'" in result.output


@pytest.mark.timeout(30)
def test_swarm_done_once_every_rank_registered_and_said_bye():
    with Broker(topologies.make("ring", 3), peer_timeout=30).start() as broker:
        clients = [GossipClient(broker.address, r) for r in (0, 1)]
        clients[0].close()
        clients[1].close()
        wait_for(lambda: all(broker.stats()["agents"][r]["said_bye"] for r in (0, 1)), 5, "the BYEs never arrived")
        assert not broker.swarm_done()  # rank 2 never came
        last = GossipClient(broker.address, 2)
        assert not broker.swarm_done()
        last.close()
        wait_for(broker.swarm_done, 5, "the swarm is not done once every rank said BYE", every=0.05)
        again = GossipClient(broker.address, 0, takeover=True)  # a rank back with --resume: not done any more
        assert not broker.swarm_done()
        again.close()


@pytest.mark.timeout(60)
def test_broker_prints_a_short_stats_line_and_exits_when_its_swarm_is_done():
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gossiprl.cli",
            "broker",
            "--bind",
            "tcp://127.0.0.1:0",
            "--agents",
            "2",
            "--stats-every",
            "0.5",
            "--exit-when-done",
            "--insecure",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = broker.stdout.readline()
        while not banner.startswith("gossiprl broker on"):  # after --insecure's warning
            banner = broker.stdout.readline()
        address = banner.split()[3].rstrip(":")
        clients = [GossipClient(address, r, timeout=10) for r in (0, 1)]
        clients[1].publish({"w": np.zeros(4, np.float32)})
        clients[0].publish({"w": np.ones(4, np.float32)})
        clients[0].collect()
        seen = ""  # a stats line comes every 0.5 s: wait for one with both agents registered and both letters
        while not any(
            "2/2 agents registered, 0 left (BYE), 0 gone" in x and "2 letters" in x for x in seen.splitlines()
        ):
            line = broker.stdout.readline()
            assert line, f"the broker exited before a stats line showed both agents: {seen}"
            seen += line
        for c in clients:
            c.close()
        output = seen + broker.communicate(timeout=10)[0]
    finally:
        if broker.poll() is None:
            broker.kill()
    assert broker.returncode == 0, output
    stats = [line for line in output.splitlines() if line.startswith("broker: ")]
    assert stats and not any(line.startswith("{") for line in output.splitlines()), output
    assert "2/2 agents registered, 0 left (BYE), 0 gone" in output, output
    assert "2 letters" in output and all(len(line) < 160 for line in stats), stats
    assert "all 2 agents registered and left with BYE" in output


@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_killed_launcher_leaves_no_private_dir_and_no_leaked_semaphore(tmp_path, transport):
    """kill -9 on `gossiprl run` leaves no orphans: each agent checkpoints and exits. It used to
    leave its /tmp/gossiprl-* directory (socket, throwaway keys) and the named semaphores of its
    multiprocessing Event and Queue behind too. (ipc is the default transport: this is also the
    plain `gossiprl run` killed -9.)"""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    run_dir = tmp_path / "run"
    launcher = start_endless_swarm(
        run_dir,
        "--transport",
        transport,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    wait_until_training(run_dir, launcher, 90)
    assert [p.name for p in tmpdir.iterdir() if p.name.startswith("gossiprl-")], "the launcher made no private dir"
    children = child_pids(launcher.pid)
    launcher.kill()
    stderr = launcher.communicate(timeout=60)[1]  # EOF once every process holding the launcher's stderr is gone
    wait_for(lambda: not [pid for pid in children if is_running(pid)], 30, "processes outlived a killed launcher")
    assert not [p.name for p in tmpdir.iterdir() if p.name.startswith("gossiprl-")]
    assert "leaked semaphore" not in stderr and "leaked" not in stderr, stderr
    for rank in (0, 1):
        assert (run_dir / f"agent-{rank}" / "checkpoint.pt").stat().st_size > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "learner",
    [(), ("--algo", "impala", "--actor-placement", "process", "--actors-per-agent", "1")],
    ids=["a2c", "impala"],
)
def test_a_sigterm_to_the_whole_process_group_stops_every_agent_with_a_final_checkpoint(tmp_path, learner):
    """A scheduler signals every process of the job (scancel, `timeout`, systemd), the agents' forkserver
    and an IMPALA learner's actor processes too. The agents died of it without a final checkpoint, and
    the launcher waited 60 s for their reports, past Slurm's and docker's grace. Each agent now takes
    SIGTERM as its launcher's stop: it checkpoints and reports; an actor waits for its learner's stop."""
    run_dir = tmp_path / "run"
    launcher = start_endless_swarm(
        run_dir,
        "--checkpoint-every",
        "1000000",
        *learner,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_until_training(run_dir, launcher, 90)
    os.killpg(launcher.pid, signal.SIGTERM)
    stderr = launcher.communicate(timeout=60)[1]
    assert launcher.returncode == 143, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] == {} and sorted(summary["per_agent"]) == ["0", "1"], stderr
    for rank in (0, 1):  # no periodic one comes this early: this is the final checkpoint
        assert (run_dir / f"agent-{rank}" / "checkpoint.pt").stat().st_size > 0


def test_only_the_first_sigterm_interrupts_a_later_one_is_noted(monkeypatch):
    """scancel signals every process of the job and a wrapper (experiments.readme_seeds) passes its own
    on: the launcher's second KeyboardInterrupt cut short the stop the first began (its wait for the
    agents' final reports, the summary), and `gossiprl run` exited 1."""
    from gossiprl import cli

    monkeypatch.setattr(cli, "_caught", [])
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGTERM, None)
    cli._interrupt(signal.SIGTERM, None)
    assert cli._caught == [signal.SIGTERM, signal.SIGTERM] and cli.interrupted_status() == 143


FORKSERVER_CHILD = """
import multiprocessing as mp, os, signal, sys


def child(said, go):
    said.put((os.getppid(), signal.getsignal(signal.SIGTERM) == signal.SIG_DFL))
    go.get(timeout=60)


if __name__ == "__main__":
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(sys.argv[1:])
    said, go = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(said, go))
    p.start()
    server, default = said.get(timeout=60)
    os.kill(server, signal.SIGTERM)
    go.put(1)
    p.join()
    print(default, p.exitcode)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preload", [["gossiprl.rl.forkserver"], []], ids=["ours", "plain"])
def test_a_forkserver_that_preloads_ours_outlives_sigterm_and_forks_children_with_its_default(tmp_path, preload):
    """A SIGTERM that killed the server made multiprocessing read its still-running child's exit as 255
    (the plain case shows it); with gossiprl.rl.forkserver preloaded, the server ignores it, and its
    children still have SIGTERM's default, not the server's ignore."""
    script = tmp_path / "forkserver_child.py"
    script.write_text(FORKSERVER_CHILD)
    done = subprocess.run([sys.executable, str(script), *preload], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == (["True", "0"] if preload else ["True", "255"])


def test_host_load_stretches_heartbeat_and_timeouts_with_oversubscription():
    from gossiprl.launch import LOCAL_HEARTBEAT_S, MAX_HEARTBEAT_S, PEER_TIMEOUT_S, HostLoad

    fits = HostLoad(agents=2, cores=2)
    assert fits.warning() is None
    assert (fits.heartbeat, fits.peer_timeout, fits.gossip_timeout(60)) == (LOCAL_HEARTBEAT_S, PEER_TIMEOUT_S, 60)
    crowded = HostLoad(agents=24, cores=2)
    assert crowded.oversubscription == 12
    assert crowded.heartbeat == 12 * LOCAL_HEARTBEAT_S and crowded.peer_timeout == 12 * PEER_TIMEOUT_S
    assert crowded.gossip_timeout(60) == 720
    assert HostLoad(agents=100, cores=2).heartbeat == MAX_HEARTBEAT_S  # a dead broker is still noticed in 30 s
    said = crowded.warning()
    assert said.startswith("warning: 24 agents on 2 core(s)") and "~12x slower" in said
    assert "run at most 2 agent(s) here" in said


@pytest.mark.timeout(150)
def test_run_with_more_agents_than_cores_warns_and_gives_its_broker_the_stretched_timeout(tmp_path, monkeypatch):
    from gossiprl import launch

    monkeypatch.setattr(launch, "host_cores", lambda: 1)
    timeouts = []
    real_broker = launch.Broker

    def broker(*args, **kwargs):
        timeouts.append(kwargs["peer_timeout"])
        return real_broker(*args, **kwargs)

    monkeypatch.setattr(launch, "Broker", broker)
    result = invoke("run", "--agents", 2, "--total-frames", 160, "--run-dir", tmp_path / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "warning: 2 agents on 1 core(s)" in result.output and "peer timeout 120s" in result.output
    assert timeouts == [120.0]
