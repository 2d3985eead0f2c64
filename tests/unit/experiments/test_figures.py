from experiments.figures import wall_clock_caveat


def row(setting, seed, window, sessions=1):
    return {"setting": setting, "seed": seed, "window": window, "sessions": sessions}


def test_the_wall_clock_panel_says_when_its_arms_ran_under_different_loads():
    """The wall-clock panel drew every arm on one time axis, cells of different windows of machine load
    too, while RESULTS.md compares time only within one window: the panel now says so where it applies."""
    one_window = [row("ring", s, "w1") for s in (1, 2)] + [row("none", s, "w1") for s in (1, 2)]
    assert wall_clock_caveat(one_window) == ""
    reused = one_window + [row("full", 1, "w0")]
    assert "different loads" in wall_clock_caveat(reused)
    resumed = one_window[:-1] + [row("none", 2, "w1", sessions=2)]
    assert "different loads" in wall_clock_caveat(resumed)
    old = [row("ring", 1, None), row("none", 1, None)]
    assert "not recorded" in wall_clock_caveat(old)
    assert "not recorded" in wall_clock_caveat(old + [row("full", 1, None, sessions=2)])
    assert "different loads" in wall_clock_caveat(old + one_window)
