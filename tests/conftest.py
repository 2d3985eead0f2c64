"""Fixtures shared by tests/unit and tests/integration.

Where shared test code lives:
- fixtures (anything a test asks for by argument) in a conftest.py: this one when both sides use
  it, tests/integration/conftest.py when only tests that open sockets or start processes do;
- plain functions and constants a test calls or reads in tests/helpers.py (CLI, ports, polling,
  threads, the repo root) and tests/brokers.py (brokers, raw protocol sockets, gossiping
  clients), imported as ``from helpers import ...``: tox.ini's [pytest] puts tests/ on sys.path.
A test module never imports from another test module.
"""

import os
import signal
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

from helpers import poll_until


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_reaches_children():
    """Tests send SIGINT (Ctrl-C) to the processes they start and expect them to stop. A suite
    started in the background by a non-interactive shell (``pytest ... &`` in a script) has SIGINT
    ignored, and an ignored signal stays ignored across exec: a broker started by such a test never
    saw its Ctrl-C and the test timed out. A handler of this process's own is reset to the default
    in a child at exec, so the children get Ctrl-C as from a terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory):
    """Point TMPDIR, for this process and every subprocess it starts, at a directory of this session.

    The launcher and the benchmarks make gossiprl-* directories with tempfile; one left behind (a
    process killed -9 cannot clean up) then lands under pytest's base temp, which pytest prunes, not in
    /tmp. no_process_left_behind names the test that left one. The path stays short
    (/tmp/pytest-of-USER/pytest-N/tmp0): ipc socket paths inside it must fit AF_UNIX's 107 bytes."""
    path = tmp_path_factory.mktemp("tmp", numbered=True)
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = str(path)
    yield path
    tempfile.tempdir = saved_tempdir
    if saved_env is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = saved_env


LONG_LIVED_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""Processes Python starts once and keeps for the session: not a test's leftovers."""


def _process_tree(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, parents before their children, read from /proc.

    A long-lived helper is left out but not what it started: the agents a forkserver forked carry
    its command line, and are a test's leftovers like any other process."""
    parent, cmdlines = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError):  # the process ended while we looked
            continue
        if state != "Z":
            pid = int(stat.parent.name)
            parent[pid], cmdlines[pid] = int(ppid), cmdline

    def helper(pid: int) -> bool:
        names = [name for name in LONG_LIVED_HELPERS if name.encode() in cmdlines[pid]]
        return bool(names) and not any(name.encode() in cmdlines.get(parent[pid], b"") for name in names)

    children = defaultdict(list)
    for pid, ppid in parent.items():
        children[ppid].append(pid)
    tree, queue = [], [root]
    while queue:
        for child in children[queue.pop(0)]:
            if not helper(child):
                tree.append(child)
            queue.append(child)
    return tree


@pytest.fixture(autouse=True)
def no_process_left_behind(session_tmpdir):
    """Kill what a test started and did not stop, and name what it left, in a warning on that test.

    A test that fails between starting `gossiprl run` and stopping it would otherwise leave a
    launcher and its agents training for hours, slowing every later test on CI's two cores. A
    straggler gets 5 s to finish on its own (a broker closing, an agent writing its checkpoint);
    one still alive then is killed with its children. A gossiprl-* temp dir the test's processes
    left is named too: the launcher's own cleanup, even after kill -9, is a promise of the README."""
    before = set(_process_tree(os.getpid()))
    dirs_before = set(session_tmpdir.glob("gossiprl-*"))
    yield

    def stragglers():
        return [pid for pid in _process_tree(os.getpid()) if pid not in before]

    poll_until(lambda: not stragglers(), 5, every=0.1)
    left = stragglers()
    for pid in reversed(left):  # children first, so none is re-parented out of reach
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        warnings.warn(
            pytest.PytestWarning(f"the test left {len(left)} process(es) running, now killed: {left}"), stacklevel=2
        )
    dirs = sorted(p.name for p in set(session_tmpdir.glob("gossiprl-*")) - dirs_before)
    if dirs:
        warnings.warn(
            pytest.PytestWarning(f"the test left temp dir(s) in {session_tmpdir}: {', '.join(dirs)}"), stacklevel=2
        )
