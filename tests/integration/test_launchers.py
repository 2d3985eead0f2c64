"""Real launchers starting real agents: the README's Slurm script under a real Slurm, and torchrun.

The Slurm test starts a one-node cluster of its own (Debian's ``slurm-wlm``: munged with its own
key and socket, slurmctld and slurmd, config and spool in a temp directory, on free ports),
takes the Slurm script out of README.md and submits it with ``sbatch``. What a laptop-sized
node cannot give (4 nodes, GPUs, Pong, 2.5M frames) is overridden on sbatch's command line, which
wins over ``#SBATCH``, or replaced in the text; each replacement must match, so the test breaks
when the README's script changes under it. The rest runs as written: the broker on its own
``srun --overlap`` step with CURVE keys under ``$HOME/.gossiprl``, the agents by ``srun``.
It needs root (slurmd runs jobs as their user); without it, or without the binaries, it skips
saying so.
"""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gossiprl import launch
from helpers import REPO_ROOT, free_port, poll_until, wait_for

README = REPO_ROOT / "README.md"
FRAMES = 4000
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol")


def _env(**extra) -> dict:
    """This interpreter's bin first, so the `gossiprl` the scripts call is the one under test."""
    env = dict(os.environ, **extra)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _cli(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "gossiprl.cli", *args],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _slurm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run slurmd (it starts jobs as their user)"
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        return f"needs Slurm ({', '.join(missing)} not found): apt-get install slurm-wlm"
    return None


SLURM_CONF = """\
ClusterName=gossiprltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment holds ``marker``: the daemons, slurmstepd and job tasks all carry
    this cluster's SLURM_CONF, so this finds whatever of it is still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def slurm(tmp_path):
    reason = _slurm_unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "slurm"
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(root=root, ctld_port=free_port(), d_port=free_port()))
    marker = f"SLURM_CONF={conf}"
    env = _env(SLURM_CONF=str(conf))
    # --force: munged refuses root and a socket under world-writable /tmp without it.
    munged = [
        f"--socket={root}/munge.sock",
        f"--key-file={key}",
        f"--pid-file={root}/munged.pid",
        f"--log-file={root}/munged.log",
        f"--seed-file={root}/munge.seed",
        "--force",
        "--foreground",
    ]
    daemons = []

    def start(*command):
        daemons.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))

    def logs():
        return "\n".join(f"--- {p.name}:\n{p.read_text()[-2000:]}" for p in root.glob("*.log"))

    def wait_for_daemons(ready, what, timeout):
        def failed():
            exited = [p.args[0] for p in daemons if p.poll() is not None]
            return f"no {what} after {timeout}s (daemons exited: {exited or 'none'})\n{logs()}"

        wait_for(ready, timeout, failed, every=0.1, process=daemons)

    def squeue():
        return subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()

    try:
        start("munged", *munged)
        wait_for_daemons((root / "munge.sock").exists, "munge socket", 10)
        start("slurmctld", "-D", "-i")
        start("slurmd", "-D", "-N", "localhost")
        wait_for_daemons(
            lambda: (
                subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout.strip()
                == "idle"
            ),
            "idle node",
            30,
        )
        yield env, logs
    finally:
        # Jobs first: `scontrol shutdown` stops the daemons but leaves running steps behind.
        if jobs := squeue():
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
            poll_until(lambda: not squeue(), 20, every=0.3)
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        for p in daemons[::-1]:  # munged last: the Slurm daemons talk to it until they stop
            if p.args[0] == "munged":
                p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        poll_until(lambda: not _processes_with(marker), 10)
        leftover = _processes_with(marker)
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        assert not leftover, f"processes of the test's Slurm outlived it: {leftover}"


def readme_slurm_script() -> str:
    blocks = re.findall(r"```bash\n(#!/bin/bash\n#SBATCH .*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, f"README.md should hold one Slurm script, found {len(blocks)}"
    return blocks[0]


def _replace(text: str, old: str, new: str, count: int = 1) -> str:
    assert text.count(old) == count, f"the README's Slurm script no longer says {old!r} {count} time(s)"
    return text.replace(old, new)


def _check_finished(run_dir: Path, ranks: int, agents_per_host: int, output: str):
    for rank in range(ranks):
        agent_dir = run_dir / f"agent-{rank}"
        assert (agent_dir / "checkpoint.pt").exists(), f"agent-{rank} wrote no checkpoint\n{output[-3000:]}"
        with open(agent_dir / "metrics.csv") as f:
            last = list(csv.DictReader(f))[-1]
        assert int(last["frames"]) >= FRAMES, f"agent-{rank} stopped at {last['frames']} frames"
        assert last["gossip/consensus_distance"], f"agent-{rank} never gossiped"
        config = (agent_dir / "config.json").read_text()
        assert f'"agents_per_host": {agents_per_host},' in config, f"agent-{rank} did not count its host's agents"


@pytest.mark.timeout(180)
def test_readme_slurm_script_runs_on_a_real_slurm(slurm, tmp_path):
    env, logs = slurm
    home = tmp_path / "home"
    for name in ("broker", "agents"):
        made = subprocess.run(
            [sys.executable, "-m", "gossiprl.cli", "keys", "generate", str(home / ".gossiprl" / name), "--name", name],
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stdout + made.stderr
    port = str(free_port())
    script = readme_slurm_script()
    script = _replace(script, "--env ALE/Pong-v5", "--env CartPole-v1")
    script = _replace(script, "--total-frames 2500000", f"--total-frames {FRAMES}")
    script = _replace(script, "--device cuda", "--device cpu")
    script = _replace(script, ":5555", f":{port}", count=2)
    (tmp_path / "job.sh").write_text(script)
    output = tmp_path / "job.out"
    started = time.monotonic()
    # Submitted and polled rather than `sbatch --wait`, which looks at 2, 10 and 42 s.
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=2",
            "--cpus-per-task=1",
            "--gres=none",
            f"--chdir={tmp_path}",
            f"--output={output}",
            "--export=ALL",
            "job.sh",
        ],
        cwd=tmp_path,
        env={**env, "HOME": str(home)},
        capture_output=True,
        text=True,
    )
    assert submitted.returncode == 0, f"sbatch: {submitted.stdout}{submitted.stderr}\n{logs()}"
    job_id = submitted.stdout.strip().split(";")[0]
    wait_for(
        lambda: (
            not subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True).stdout.strip()
        ),
        150 - (time.monotonic() - started),
        f"job {job_id} still running after 150 s",
        every=0.3,
    )
    took = time.monotonic() - started
    job = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    out = output.read_text() if output.exists() else ""
    assert "JobState=COMPLETED" in job and "ExitCode=0:0" in job, f"{job}\njob output:\n{out[-4000:]}\n{logs()}"
    assert "-> broker tcp://localhost:" in out, out[-3000:]
    assert "Traceback" not in out, out[-4000:]  # the broker's step, stopped by Slurm, exits cleanly too
    _check_finished(tmp_path / "runs" / "pong-pala", 2, 2, out)
    print(f"slurm job: {took:.1f}s")


@pytest.mark.timeout(120)
def test_torchrun_starts_the_agents(tmp_path):
    torchrun = shutil.which("torchrun", path=_env()["PATH"])
    if torchrun is None:
        pytest.skip("torchrun not found (it comes with torch)")
    port = free_port()
    broker = _cli(
        "broker",
        "--bind",
        f"tcp://127.0.0.1:{port}",
        "--agents",
        "2",
        "--topology",
        "ring",
        "--stats-every",
        "0",
        "--insecure",
    )
    try:
        started = time.monotonic()
        # SLURM_PROCID as an outer `srun torchrun` leaves it: one value for all the node's processes.
        agents = subprocess.run(
            [
                torchrun,
                "--standalone",
                "--nproc-per-node",
                "2",
                "-m",
                "gossiprl.cli",
                "agent",
                "--connect",
                f"tcp://127.0.0.1:{port}",
                "--env",
                "CartPole-v1",
                "--total-frames",
                str(FRAMES),
                "--run-dir",
                str(tmp_path / "run"),
            ],
            env=_env(SLURM_PROCID="0"),
            capture_output=True,
            text=True,
            timeout=100,
        )
        took = time.monotonic() - started
    finally:
        broker.send_signal(signal.SIGTERM)
        broker_out = broker.communicate(timeout=30)[0]
    out = agents.stdout + agents.stderr
    assert agents.returncode == 0, f"torchrun:\n{out[-4000:]}\nbroker:\n{broker_out[-2000:]}"
    _check_finished(tmp_path / "run", 2, 2, out)
    assert broker.returncode == 128 + signal.SIGTERM and "Traceback" not in broker_out, broker_out[-3000:]
    print(f"torchrun: {took:.1f}s")


@pytest.mark.parametrize(
    "variables, rank, per_host",
    [
        ({}, None, 1),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS_PER_NODE": "4"}, 5, 4),
        ({"SLURM_PROCID": "1", "RANK": "6", "LOCAL_WORLD_SIZE": "3", "SLURM_NTASKS_PER_NODE": "1"}, 6, 3),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 2, 8),
    ],
)
def test_rank_and_agents_per_host_from_the_launcher(monkeypatch, variables, rank, per_host):
    for name in (*launch.RANK_VARIABLES, *launch.LOCAL_SIZE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    if rank is None:
        with pytest.raises(launch.RunError, match="no --rank given"):
            launch.rank_from_environment(None)
    else:
        assert launch.rank_from_environment(None) == rank
    assert launch.rank_from_environment(3) == 3
    assert launch.agents_per_host_from_environment(None) == per_host
    assert launch.agents_per_host_from_environment(7) == 7


def test_broker_stops_cleanly_on_sigterm(tmp_path):
    """Slurm ends the broker's step with SIGTERM once the agents' step is done. On Python 3.11 a
    join() cut short by a signal leaves is_alive() False while the thread still runs, and the
    broker closed its sockets under its own serving thread ("the serving thread died")."""
    keys = tmp_path / "keys"
    subprocess.run(
        [sys.executable, "-m", "gossiprl.cli", "keys", "generate", str(keys), "--name", "broker", "--name", "agents"],
        check=True,
        capture_output=True,
    )
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(keys / "agents.key", allowed)
    broker = _cli(
        "broker",
        "--bind",
        "tcp://0.0.0.0:0",
        "--agents",
        "2",
        "--curve-secret",
        str(keys / "broker.key_secret"),
        "--curve-allow",
        str(allowed),
    )
    assert broker.stdout.readline().startswith("gossiprl broker on")
    time.sleep(1)  # serving: the SIGTERM must cut short the CLI's join(), which is the point
    broker.send_signal(signal.SIGTERM)
    out = broker.communicate(timeout=30)[0]
    assert broker.returncode == 128 + signal.SIGTERM, out  # stopped by a signal, as `run` and `agent` report it
    assert "Traceback" not in out and "died" not in out, out


def _write_to_stderr(text: str, _std) -> None:
    os.write(2, text.encode())


@pytest.mark.timeout(120)
def test_an_agent_writes_to_the_launchers_stderr_as_it_is_when_the_agent_starts(tmp_path):
    """Agents fork from a forkserver started once; without LauncherStreams the second would write
    where stderr pointed when the server started (an earlier test's capture)."""
    ctx, saved = launch.agent_context(), os.dup(2)
    try:
        for name in ("first", "second"):
            with open(tmp_path / name, "wb") as f:
                os.dup2(f.fileno(), 2)
                agent = ctx.Process(target=_write_to_stderr, args=(name, launch.LauncherStreams()))
                agent.start()
                agent.join(60)
                os.dup2(saved, 2)
            assert agent.exitcode == 0
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert (tmp_path / "first").read_bytes() == b"first" and (tmp_path / "second").read_bytes() == b"second"


NEW_MODULES = """
import json, sys
from gossiprl import launch

def train_and_report(run_dir, report):
    from gossiprl.rl.agent import train
    from gossiprl.rl.settings import AgentConfig

    before = set(sys.modules)
    train(AgentConfig(env_id="CartPole-v1", device="cpu", total_frames=400), run_dir)
    report.send(sorted(set(sys.modules) - before))

if __name__ == "__main__":
    ctx = launch.agent_context()
    reader, writer = ctx.Pipe(duplex=False)
    agent = ctx.Process(target=train_and_report, args=(sys.argv[1], writer))
    agent.start()
    writer.close()
    print(json.dumps(reader.recv()))
    agent.join(30)
    sys.exit(agent.exitcode)
"""


@pytest.mark.timeout(120)
def test_an_agent_from_the_forkserver_imports_next_to_nothing_before_it_trains(tmp_path):
    """The forkserver imports what every agent needs once (launch.AGENT_PRELOAD). torch imports
    torch._dynamo, some 800 modules and 2-3 s of CPU, when the first optimizer is made: each agent
    paid it again, and four starting together on 2 cores waited some 10 s for their first update.
    In a fresh interpreter: a process has one forkserver, and whichever context starts it first
    (IMPALA's actor_context, in a test run) sets what it imports."""
    script = tmp_path / "new_modules.py"
    script.write_text(NEW_MODULES)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True, timeout=100, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    # the env's own module and a few of torch's small ones (the checkpoint's serialisation)
    assert len(imported) < 50 and not any(m.startswith("torch._dynamo") for m in imported), imported
