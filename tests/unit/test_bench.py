"""The bench train table says what each ratio is against, on both clocks, and when a row was retried;
a batched MinAtar game adds its rows stepped in MinAtar's own loop, each held to its batched row."""

import pytest

from gossiprl.bench.train import MINATAR_LOOP_ROWS, _format, raw_ceiling
from gossiprl.rl.envs import steps_batched


def row(name, fps, cpu=None, **more):
    return {"row": name, "fps": fps, "shares": None, "steady": True, "cpu_ms_per_frame": cpu, **more}


def test_a_ring_is_held_to_one_agent_and_to_loops_side_by_side_on_both_clocks():
    rows = [
        row("minimal A2C loop", 10_000, 0.10),
        row("one agent, default flags", 9_000, 0.11),
        row("2 minimal loops side by side", 16_000, 0.12),
        row("ring of 2, sync, blocking", 12_000, 0.15, tries=1, allowance=10.0),
    ]
    line = _format(rows[-1], rows)
    assert " 1.33x one agent,  0.75x side by side" in line
    assert "CPU  150.0 us/frame ( 1.25x of 2 minimal loops side by side's)" in line
    assert "try" not in line


def test_minatar_loop_rows_are_held_to_their_batched_rows():
    rows = [
        row("raw vector env, random actions", 120_000),
        row("minimal A2C loop", 10_000, 0.10),
        row("raw vector env, MinAtar's own loop", 30_000),
        row("minimal A2C loop, MinAtar's own loop", 7_500, 0.13),
    ]
    assert list(MINATAR_LOOP_ROWS) == [r["row"] for r in rows[2:]]
    assert "0.25x batched" in _format(rows[2], rows)
    assert "0.75x batched" in _format(rows[3], rows) and "( 1.30x of minimal loop's)" in _format(rows[3], rows)


def test_only_a_batched_minatar_game_gets_those_rows_and_both_loops_step():
    pytest.importorskip("minatar")
    assert steps_batched("MinAtar/SpaceInvaders-v1") and steps_batched("MinAtar/SpaceInvaders-v0")
    assert not any(map(steps_batched, ["MinAtar/Breakout-v1", "CartPole-v1", "ALE/Pong-v5"]))
    with pytest.raises(ValueError, match="MinAtar id"):
        steps_batched("MinAtar/NoSuchGame-v1")
    assert raw_ceiling("MinAtar/SpaceInvaders-v1", 4, 0.2, batched=False) > 0


def test_a_retried_row_says_which_try_and_allowance_it_took():
    rows = [row("minimal A2C loop", 10_000), row("one agent, default flags", 5_000, tries=3, allowance=90.0)]
    line = _format(rows[-1], rows)
    assert "0.50x minimal loop" in line and "(try 3: its agents were given 90 s to start)" in line
    assert "CPU" not in line  # no CPU figure (not Linux, or too short a window): no column, no ratio


def test_a_rows_cpu_leaves_out_the_spinner_that_only_makes_the_load():
    import time

    from gossiprl.bench.train import DescendantsCPU, busy_core

    if not DescendantsCPU.works:
        pytest.skip("no /proc to read processes' CPU from")
    with busy_core() as spinner:
        time.sleep(2.0)
        before = DescendantsCPU(exclude=(spinner,)).read()
        counted = DescendantsCPU().read()
        time.sleep(0.5)
        after = DescendantsCPU(exclude=(spinner,)).read()
    assert counted - before > 0.1, "the spinner spun, and a count that includes it shows it"
    assert after - before < 0.05, "the count without it does not grow while it spins"


def test_a_rows_cpu_keeps_what_a_process_spent_after_it_exits():
    import subprocess
    import sys
    import time

    from gossiprl.bench.train import DescendantsCPU

    if not DescendantsCPU.works:
        pytest.skip("no /proc to read processes' CPU from")
    sampler = DescendantsCPU()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"]
    )
    time.sleep(0.8)
    while_it_ran = sampler.read()
    child.wait()
    after_it_exited = sampler.read()
    assert while_it_ran > 0.1, "the child spun and was counted"
    assert after_it_exited >= while_it_ran, "an agent that finishes first must not take its CPU out of the row"


def test_a_short_steady_window_takes_its_cpu_rate_from_the_samples_around_it():
    """A --quick row's steady window, about a second, could hold fewer than two of the 0.5 s CPU
    samples on a loaded host: its CPU per frame was None, which the bench test took for a failure."""
    from gossiprl.bench.train import DescendantsCPU

    sampler = DescendantsCPU()
    sampler.samples = [(0.0, 0.0), (1.0, 0.5), (2.0, 1.5), (3.0, 2.5)]  # 0.5 then 1 CPU second a second
    assert sampler.between(1.0, 3.0) == pytest.approx(2.0)  # two samples inside: their rate
    assert sampler.between(1.2, 1.8) == pytest.approx(0.6)  # none inside: the rate from 1.0 to 2.0
    assert sampler.between(0.5, 1.5) == pytest.approx(0.75)  # one inside: the rate from 0.0 to 2.0
    assert sampler.between(2.5, 3.5) is None  # no sample after the window
