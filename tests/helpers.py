"""Plain functions that tests in both tests/unit and tests/integration call directly.

Importable as ``from helpers import ...`` because tox.ini's [pytest] puts tests/ on sys.path
(``pythonpath = tests``). Fixtures live in conftest.py instead; see its docstring for the split.
"""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def invoke(*args):
    """The `gossiprl` command in-process; arguments may be paths or numbers.

    catch_exceptions=False, so a crash fails the test with its traceback instead of exit code 1.
    The CLI is imported here, not at module level, so a test that never calls this does not load it."""
    from click.testing import CliRunner

    from gossiprl.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def free_port() -> int:
    """A loopback TCP port nobody listens on now, for a process that must be told its port up front."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll_until(ready, timeout, every=0.2, process=None) -> bool:
    """Poll ready() every `every` seconds until it is true (True), or until `timeout` seconds pass or
    `process` (a Popen the wait depends on, or a list of them) has exited (False): a test waits on the
    state it needs, never for a guessed time."""
    deadline = time.monotonic() + timeout
    processes = [] if process is None else process if isinstance(process, list) else [process]
    while not ready():
        if time.monotonic() >= deadline or any(p.poll() is not None for p in processes):
            return False
        time.sleep(every)
    return True


def wait_for(ready, timeout, what, every=0.2, process=None):
    """poll_until, failing with `what` when ready() never came true; `what` may be a callable, called
    only on failure (to attach logs read then)."""
    assert poll_until(ready, timeout, every, process), what() if callable(what) else what


def agent_pids(launcher: int) -> list[int]:
    """The agent processes of the `gossiprl run` with pid ``launcher``: the children of its
    forkserver (where the platform has one), or the children it spawned."""

    def children(pid: int) -> list[int]:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]

    pids = []
    for child in children(launcher):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"multiprocessing.forkserver" in cmdline:
            pids += children(child)
        elif b"spawn_main" in cmdline:
            pids.append(child)
    return pids


def in_thread(fn, *args):
    """Run fn in a daemon thread, so a test can check that a call blocks and when it returns.

    Returns (thread, box); box gets 'result' or 'error', then 'done_at' (time.monotonic())."""
    box = {}

    def target():
        try:
            box["result"] = fn(*args)
        except Exception as exc:  # handed to the test thread
            box["error"] = exc
        box["done_at"] = time.monotonic()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def child_pids(pid: int) -> list[int]:
    """The pids whose parent is ``pid``, to check later that none of them outlived it."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def is_running(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by its parent) does not count."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def start_endless_swarm(run_dir, *flags, **popen):
    """`gossiprl run` of two agents, in a process of its own, with a budget it never reaches and no
    stop on solving: the test stops it (a signal, kill -9). ``popen`` goes to subprocess.Popen."""
    command = [
        sys.executable,
        "-m",
        "gossiprl.cli",
        "run",
        "--agents",
        "2",
        "--total-frames",
        "100000000",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--stop-at-return",
        "none",
        *flags,
    ]
    return subprocess.Popen(command, **popen)


def wait_until_training(run_dir, launcher, timeout, what="agents never started training", agents=2):
    """Every agent of the run in ``run_dir`` (``start_endless_swarm``'s two by default) has logged a first
    row (and so built envs, joined the broker, made an update). metrics.csv is created empty before the
    first update: its existence said less."""

    def logged(r: int) -> bool:
        path = run_dir / f"agent-{r}" / "metrics.csv"
        return path.exists() and path.stat().st_size > 0

    wait_for(lambda: all(logged(r) for r in range(agents)), timeout, what, process=launcher)
