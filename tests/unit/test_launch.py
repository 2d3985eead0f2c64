"""gossiprl/launch.py's own logic, without starting a swarm."""

import multiprocessing
import signal
import threading

import pytest

from gossiprl import launch


class BrokerReadingByesLate:
    """A broker whose serving thread reads agent 1's BYE only on the third look at its stats."""

    def __init__(self):
        self.looks = 0

    def stats(self):
        self.looks += 1
        return {"agents": {0: {"said_bye": True}, 1: {"said_bye": self.looks >= 3}, 2: {"said_bye": False}}}


def test_the_last_swarm_log_waits_for_the_bye_of_every_agent_that_finished():
    swarm = launch.Swarm.__new__(launch.Swarm)  # only what _await_byes reads
    swarm.broker, swarm.summaries = BrokerReadingByesLate(), {0: {}, 1: {}}  # agent 2 failed: no BYE due
    swarm._await_byes(timeout=5)
    assert swarm.broker.looks == 3


def test_a_bye_that_never_comes_costs_the_wait_and_no_more():
    swarm = launch.Swarm.__new__(launch.Swarm)
    swarm.broker, swarm.summaries = BrokerReadingByesLate(), {0: {}, 1: {}, 2: {}}
    swarm._await_byes(timeout=0.3)
    assert 3 <= swarm.broker.looks <= 10


class Exited:
    """An agent process that has ended, cleanly."""

    exitcode = 0

    def is_alive(self):
        return False


def test_an_agent_that_exited_after_its_final_report_is_not_called_failed():
    """The launcher reads one report at a time, then looks for agents that died without one: agent-0's
    final report waited in its pipe behind agent-1's progress while agent-0 itself had exited, and a
    cleanly finished agent was named failed ("exited with code 0 without a report")."""
    swarm = launch.Swarm.__new__(launch.Swarm)  # only what _notice_failures reads
    swarm.reports, swarm.summaries, swarm.failures, swarm._reported = launch._Reports(), {}, {}, set()
    swarm.procs, swarm.broker, swarm.echo = {0: Exited(), 1: Exited()}, None, print
    swarm.cfg = launch.SwarmConfig(agents=2)
    swarm.progress = launch.Progress(2)
    logged, bar = Logged(), []
    swarm._followers = (launch.Timings(), logged, bar.append)
    pipes = {rank: multiprocessing.Pipe(duplex=False) for rank in (0, 1)}
    for rank, (reader, _) in pipes.items():
        swarm.reports.add(rank, reader)
    last = {"frames": 4000, "returns": [], "gossip_s": 0.1, "wall_s": 1.0}
    pipes[0][1].send(("progress", 0, last))
    pipes[0][1].send(("done", 0, {"frames": 4000}))
    pipes[0][1].close()  # agent-0 reported and exited; agent-1 died without a word
    pipes[1][1].close()
    swarm._notice_failures()
    assert swarm.summaries == {0: {"frames": 4000}}
    assert swarm.failures == {1: "process exited with code 0 without a report"}
    # its last progress report, drained with it, reached the swarm's log and the bar as watch's do
    assert logged.rows == [(0, last)] and bar == [swarm.progress]


class Logged:
    """A SwarmLog that keeps what it is given."""

    def __init__(self):
        self.rows = []

    def add(self, rank, report):
        self.rows.append((rank, report))

    def write(self, broker_stats, force=False):
        pass


def test_the_python_api_refuses_actor_settings_before_anything_starts(tmp_path, monkeypatch):
    """launch.run (experiments/ call it) met these only inside each agent, as agent failures, once
    the run dir and the broker were made; it now raises `gossiprl run`'s message up front."""
    from gossiprl.rl.settings import AgentConfig, ImpalaConfig
    from gossiprl.settings import SwarmConfig

    def started(*_, **__):
        raise AssertionError("the run started")

    monkeypatch.setattr(launch, "prepare_run_dir", started)
    cfg = AgentConfig(algo="impala", impala=ImpalaConfig(actors_bind="tcp://127.0.0.1:65534"))
    with pytest.raises(ValueError, match=r"^--actors-bind tcp://127\.0\.0\.1:65534: agent 3 would bind port 65537"):
        launch.run(SwarmConfig(agents=4), cfg, tmp_path / "r", show_progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("earlier", [{"env_id": "CartPole-v1", "algo": "a2c"}, {"env_id": "CartPole-v1"}, "oops"])
def test_a_resume_that_would_learn_with_another_algo_is_refused_before_config_json_is_rewritten(tmp_path, earlier):
    """The Python API takes any algo: a resume by PPO of an A2C run rewrote config.json as a PPO run
    (losing its A2C record) before every agent refused its checkpoint. A run from before --algo was A2C;
    an agent section that is none is refused in one line, as an unreadable file."""
    import json
    from dataclasses import asdict

    from gossiprl.rl.settings import AgentConfig

    (tmp_path / "config.json").write_text(json.dumps({"agent": earlier}))
    before = (tmp_path / "config.json").read_text()
    config = {"agent": asdict(AgentConfig(env_id="CartPole-v1", algo="ppo"))}
    words = "unreadable" if earlier == "oops" else "was trained by a2c, this run asks for ppo; resume with --algo a2c"
    with pytest.raises(launch.RunError, match=words):
        launch.prepare_run_dir(tmp_path, True, config)
    assert (tmp_path / "config.json").read_text() == before
    if earlier != "oops":
        launch.prepare_run_dir(tmp_path, True, {"agent": {**config["agent"], "algo": "a2c"}})


def test_topology_none_is_a_swarm_without_gossip_and_none_alone_is_a_ring():
    from gossiprl.settings import NO_GOSSIP, SwarmConfig

    control = SwarmConfig(agents=8, topology=NO_GOSSIP)
    assert not control.gossips and launch.make_topology(control) is None  # no broker is started
    default = SwarmConfig(agents=8)
    assert default.gossips and default.topology == "ring" and launch.make_topology(default).n == 8
    assert not SwarmConfig(agents=1).gossips
    # what a swarm without gossip ignores is named (`gossiprl run` warns), and only what was set
    assert control.unused_gossip_settings() == []
    ignoring = SwarmConfig(agents=8, topology=NO_GOSSIP, mode="async", peers=3)
    assert ignoring.unused_gossip_settings() == ["peers", "mode"]
    assert SwarmConfig(agents=8, mode="async").unused_gossip_settings() == []
    # and the agents' half: how often and how letters are mixed, where none are
    from gossiprl.rl.settings import AgentConfig

    mixing = AgentConfig(gossip_every=4, aggregate="median", shared_init=False)
    assert mixing.unused_gossip_settings(gossips=False) == ["gossip_every", "aggregate"]
    assert mixing.unused_gossip_settings(gossips=True) == []
    assert AgentConfig().unused_gossip_settings(gossips=False) == []


def test_a_stop_while_the_consensus_policy_is_scored_stops_the_run(monkeypatch, tmp_path):
    """The scoring swallowed Ctrl-C and SIGTERM ("the run is over"), so a study went on to its next cell;
    and as a process heeds only its first SIGTERM, no later one could stop it. The run now reads as
    interrupted, which stops a study and makes `gossiprl run` exit 130 or 143."""
    from gossiprl.rl import consensus

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(consensus, "evaluate_consensus", interrupted)
    swarm = launch.Swarm.__new__(launch.Swarm)  # only what the scoring reads
    swarm.run_dir, swarm.stopped_by, said = tmp_path, "total frames", []
    swarm.echo = said.append
    assert launch._consensus_return(swarm) is None
    assert swarm.stopped_by == "interrupted" and said[-1] == "consensus policy not scored: interrupted"


class Running:
    """An agent process that leaves only when killed; ``ctrl_c``: the user presses Ctrl-C while the
    launcher waits for it to leave."""

    pid, exitcode = 1, None

    def __init__(self, ctrl_c=False):
        self.waited, self.ctrl_c = [], ctrl_c

    def is_alive(self):
        return self.exitcode is None

    def join(self, timeout=None):
        self.waited.append(timeout)
        if self.ctrl_c and timeout:
            self.ctrl_c = False  # pressed once
            raise KeyboardInterrupt

    def kill(self):
        self.exitcode = -9


class SecondCtrlC:
    """The launcher's reports, while the user presses Ctrl-C again during the wait for them."""

    def get(self, timeout):
        raise KeyboardInterrupt

    def left_by(self, rank):
        return []


@pytest.mark.parametrize("when", ["waiting for the reports", "joining an agent"])
def test_a_second_ctrl_c_kills_the_agents_at_once_and_the_run_still_ends_with_its_summary(when):
    """A second Ctrl-C during the stop escaped as click's "Aborted!" (exit 1, no summary.json), after
    the launcher had waited up to 30 s for each agent. Now the wait ends, the agents still running are
    killed without it, and summary.json names them failed: whether the Ctrl-C lands while the launcher
    waits for the agents' final reports or, once those 60 s are out, while it joins an agent."""
    swarm = launch.Swarm.__new__(launch.Swarm)  # only what interrupted and close read
    said = []
    in_join = when == "joining an agent"
    swarm.procs = {0: Running(ctrl_c=in_join), 1: Running()}
    swarm.reports, swarm.echo = SecondCtrlC() if not in_join else launch._Reports(), said.append
    swarm.summaries, swarm.failures, swarm.stop = {}, {}, threading.Event()
    swarm.cfg, swarm.broker, swarm.stats_server = launch.SwarmConfig(agents=2), None, None
    swarm.join_s = launch.LAUNCHER_JOIN_S

    try:
        swarm.interrupted(timeout=0 if in_join else 60)  # returns: run() goes on to write the summary
        swarm.close(Logged())
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C escaped the stop: no summary.json")
    finally:
        swarm.release_ctrl_c()  # as run() does once summary.json is written

    assert swarm.stopped_by == "interrupted" and said[-1].startswith("stopping at once")
    assert [p.waited[0] for p in swarm.procs.values()] == ([30, 0] if in_join else [0, 0])
    assert all(p.exitcode == -9 for p in swarm.procs.values())
    assert swarm.failures == {r: "process exited with code -9 without a report" for r in (0, 1)}


class SignalAsItIsTaken:
    """An agent's final report, taken off its pipe just as a Ctrl-C or SIGTERM comes."""

    def __init__(self, signum):
        self.signum = signum

    def get(self, timeout):
        signal.raise_signal(self.signum)
        return ("done", 0, {"frames": 100})

    def left_by(self, rank):
        return []


def _stop_as_the_cli_does(signum, frame):
    raise KeyboardInterrupt


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_as_a_final_report_is_taken_waits_until_it_is_recorded(signum):
    """A Ctrl-C, or a SIGTERM that `gossiprl run` turns into one, that landed between taking an agent's
    "done" report off its pipe and recording it lost the report, and the agent that had finished was
    named failed. The signal now waits until the report is recorded, then stops the run as before."""
    swarm = launch.Swarm.__new__(launch.Swarm)
    swarm.reports, swarm.summaries, swarm.failures = SignalAsItIsTaken(signum), {}, {}
    swarm._followers = None
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _stop_as_the_cli_does)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            swarm._take_report()
        after = {sig: signal.getsignal(sig) for sig in handlers}
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert swarm.summaries == {0: {"frames": 100}} and swarm.failures == {}
    assert after == {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _stop_as_the_cli_does}


def press_ctrl_c():
    """What Python does with a Ctrl-C, at once rather than at its next bytecode: call SIGINT's handler."""
    signal.getsignal(signal.SIGINT)(signal.SIGINT, None)


class KilledSlowly(Running):
    """An agent process the user presses Ctrl-C over once more as the launcher kills it."""

    def kill(self):
        press_ctrl_c()
        super().kill()


@pytest.mark.parametrize("before", ["after a second Ctrl-C", "in a plain close"])
def test_a_later_ctrl_c_is_only_noted_once_the_stop_is_bounded(before):
    """A third Ctrl-C, while the launcher killed the agents, drained their pipes or closed the broker,
    still escaped as "Aborted!" with no summary.json; so did a first one that landed while close killed
    an agent. A Ctrl-C during a kill now stops the rest at once, and from then on, as in any close once
    every agent is joined, what is left is bounded: a Ctrl-C is only noted until the run gives SIGINT
    its own handler back (before the consensus scoring, which a Ctrl-C stops, and at the end)."""
    swarm = launch.Swarm.__new__(launch.Swarm)
    said = []
    second = before == "after a second Ctrl-C"
    swarm.procs = {0: KilledSlowly(ctrl_c=second), 1: Running()}
    swarm.reports, swarm.echo = launch._Reports(), said.append
    swarm.summaries, swarm.failures, swarm.stop = {}, {}, threading.Event()
    swarm.cfg, swarm.broker, swarm.stats_server = launch.SwarmConfig(agents=2), None, None
    swarm.join_s, swarm.stopped_by = launch.LAUNCHER_JOIN_S, "total frames"
    handler = signal.getsignal(signal.SIGINT)

    class CtrlCAsItLogs(Logged):
        def write(self, *args, **kwargs):
            press_ctrl_c()
            super().write(*args, **kwargs)

    try:
        swarm.close(CtrlCAsItLogs())
        held = signal.getsignal(signal.SIGINT)
        swarm.release_ctrl_c()
    except KeyboardInterrupt:
        pytest.fail("a later Ctrl-C escaped the stop: no summary.json")
    finally:
        restored = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, handler)

    assert held == swarm._already_stopping and restored is handler
    # the Ctrl-C of the kill that follows "at once", and the one as the swarm log is written
    assert said.count("already stopping: the agents' summary is being written") == 2
    assert sum(line.startswith("stopping at once") for line in said) == 1 and swarm.stopped_by == "interrupted"
    assert all(p.exitcode == -9 for p in swarm.procs.values()) and set(swarm.failures) == {0, 1}
    assert [p.waited[0] for p in swarm.procs.values()] == [launch.LAUNCHER_JOIN_S, 0]
