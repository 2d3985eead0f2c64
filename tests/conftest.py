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
import tempfile
import warnings

import pytest


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory):
    """Point TMPDIR, for this process and every subprocess it starts, at a directory of this session.

    The launcher and the benchmarks make gossiprl-* directories with tempfile; one left behind (a
    process killed -9 cannot clean up) then lands under pytest's base temp, which pytest prunes, not in
    /tmp. Whatever is still there at the end is named in a warning. The path stays short
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
    left = sorted(p.name for p in path.glob("gossiprl-*"))
    if left:
        warnings.warn(pytest.PytestWarning(f"the tests left {len(left)} gossiprl-* temp dir(s) behind in {path}: "
                                           f"{', '.join(left)}"))
