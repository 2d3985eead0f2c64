"""Real launchers starting real agents: the README's Slurm script under a real Slurm, and torchrun.

The Slurm test starts a one-node cluster of its own (Debian's ``slurm-wlm``: slurmctld and
slurmd, with ``auth/none`` so no munge, a config and spool in a temp directory, on free ports),
takes the Slurm script out of README.md and submits it with ``sbatch --wait``. What a laptop-sized
node cannot give (4 nodes, GPUs, Pong, 2.5M frames) is overridden on sbatch's command line, which
wins over ``#SBATCH``, or replaced in the text; each replacement must match, so the test breaks
when the README's script changes under it. The rest runs as written: the broker on its own
``srun --overlap`` step with CURVE keys under ``$HOME/.gossiprl``, the agents by ``srun``.
It needs root (slurmd runs jobs as their user); without it, or without the binaries, it skips
saying so.
"""
import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gossiprl import launch

README = Path(__file__).resolve().parents[1] / "README.md"
FRAMES = 4000
SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    """This interpreter's bin first, so the `gossiprl` the scripts call is the one under test."""
    env = dict(os.environ, **extra)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _cli(*args, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "gossiprl.cli", *args], env=env or _env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


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
AuthType=auth/none
CredType=cred/none
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
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(root=root, ctld_port=_free_port(), d_port=_free_port()))
    marker = f"SLURM_CONF={conf}"
    env = _env(SLURM_CONF=str(conf))
    daemons = [subprocess.Popen([daemon, "-D", *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
               for daemon, flags in (("slurmctld", ["-i"]), ("slurmd", ["-N", "localhost"]))]

    def logs():
        return "\n".join(f"--- {p.name}:\n{p.read_text()[-2000:]}" for p in root.glob("*.log"))

    try:
        deadline = time.monotonic() + 30
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout
            if state.strip() == "idle":
                break
            assert all(p.poll() is None for p in daemons), f"a Slurm daemon exited\n{logs()}"
            assert time.monotonic() < deadline, f"the node never came up idle (sinfo: {state!r})\n{logs()}"
            time.sleep(0.3)
        yield env, logs
    finally:
        # Jobs first: `scontrol shutdown` stops the daemons but leaves running steps behind.
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and subprocess.run(
                    ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.strip():
                time.sleep(0.3)
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        for p in daemons:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        deadline = time.monotonic() + 10
        while _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
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
        assert f'"agents": {agents_per_host},' in config, f"agent-{rank} did not count its host's agents"


@pytest.mark.timeout(180)
def test_readme_slurm_script_runs_on_a_real_slurm(slurm, tmp_path):
    env, logs = slurm
    home = tmp_path / "home"
    for name in ("broker", "agents"):
        made = subprocess.run([sys.executable, "-m", "gossiprl.cli", "keys", "generate",
                               str(home / ".gossiprl" / name), "--name", name], capture_output=True, text=True)
        assert made.returncode == 0, made.stdout + made.stderr
    port = str(_free_port())
    script = readme_slurm_script()
    script = _replace(script, "--env ALE/Pong-v5", "--env CartPole-v1")
    script = _replace(script, "--total-frames 2500000", f"--total-frames {FRAMES} --log-every 5")
    script = _replace(script, "--device cuda", "--device cpu")
    script = _replace(script, ":5555", f":{port}", count=2)
    (tmp_path / "job.sh").write_text(script)
    output = tmp_path / "job.out"
    started = time.monotonic()
    job = subprocess.run(["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gres=none",
                          f"--chdir={tmp_path}", f"--output={output}", "--export=ALL", "job.sh"],
                         cwd=tmp_path, env={**env, "HOME": str(home)}, capture_output=True, text=True, timeout=150)
    took = time.monotonic() - started
    out = output.read_text() if output.exists() else ""
    assert job.returncode == 0, f"sbatch: {job.stdout}{job.stderr}\njob output:\n{out[-4000:]}\n{logs()}"
    assert "-> broker tcp://localhost:" in out, out[-3000:]
    _check_finished(tmp_path / "runs" / "pong-pala", 2, 2, out)
    print(f"slurm job: {took:.1f}s")


@pytest.mark.timeout(120)
def test_torchrun_starts_the_agents(tmp_path):
    torchrun = shutil.which("torchrun", path=_env()["PATH"])
    if torchrun is None:
        pytest.skip("torchrun not found (it comes with torch)")
    port = _free_port()
    broker = _cli("broker", "--bind", f"tcp://127.0.0.1:{port}", "--agents", "2", "--topology", "ring",
                  "--stats-every", "0")
    try:
        started = time.monotonic()
        # SLURM_PROCID as an outer `srun torchrun` leaves it: one value for all the node's processes.
        agents = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "gossiprl.cli", "agent",
                                 "--connect", f"tcp://127.0.0.1:{port}", "--env", "CartPole-v1",
                                 "--total-frames", str(FRAMES), "--log-every", "5", "--run-dir", str(tmp_path / "run")],
                                env=_env(SLURM_PROCID="0"), capture_output=True, text=True, timeout=100)
        took = time.monotonic() - started
    finally:
        broker.send_signal(signal.SIGTERM)
        broker_out = broker.communicate(timeout=30)[0]
    out = agents.stdout + agents.stderr
    assert agents.returncode == 0, f"torchrun:\n{out[-4000:]}\nbroker:\n{broker_out[-2000:]}"
    _check_finished(tmp_path / "run", 2, 2, out)
    print(f"torchrun: {took:.1f}s")


@pytest.mark.parametrize("variables, rank, per_host", [
    ({}, None, 1),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS_PER_NODE": "4"}, 5, 4),
    ({"SLURM_PROCID": "1", "RANK": "6", "LOCAL_WORLD_SIZE": "3", "SLURM_NTASKS_PER_NODE": "1"}, 6, 3),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 2, 8),
])
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
