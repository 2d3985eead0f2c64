import numpy as np

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


def test_a_study_at_equal_frames_per_agent_is_drawn_per_agent_and_for_the_whole_swarm(tmp_path, monkeypatch):
    """The papers' axis is frames per agent; what 2 shared cores paid is the whole swarm's frames. A
    study that gives every agent the same frames shows both, a ring of 4 reaching 4x as far on the second."""
    from matplotlib.figure import Figure

    from experiments.common import cell_key
    from experiments.figures import study_figure

    (tmp_path / "curves").mkdir()
    rows = []
    for setting, agents in (("1 agent", 1), ("ring of 4", 4)):
        for seed in (1, 2, 3):
            lines = ["agent,frames,wall_s,mean_return_100,wait_s,mix_s"]
            lines += [f"{a},{f},{f / 100},{f / 1000},0,0" for a in range(agents) for f in (500, 1000)]
            (tmp_path / "curves" / f"{cell_key(setting, seed)}.csv").write_text("\n".join(lines) + "\n")
            rows.append({"setting": setting, "seed": seed, "agents": agents, "frames": 1000 * agents})
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))

    study_figure(tmp_path, rows, ["1 agent", "ring of 4"], tmp_path / "f.png", "t", "env", frames_per_agent=True)

    axes = drawn[0].axes
    assert [ax.get_xlabel() for ax in axes][::2] == ["frames per agent (M)", "frames, whole swarm (M)"]

    def reach(ax, setting):  # the last x each setting's IQM line has a value at
        line = next(li for li in ax.get_lines() if li.get_label().startswith(setting))
        x, y = line.get_data()
        return x[~np.isnan(y)].max()

    assert reach(axes[0], "ring of 4") == reach(axes[0], "1 agent") == 1000 / 1e6
    assert reach(axes[2], "ring of 4") == 4000 / 1e6 and reach(axes[2], "1 agent") < 1500 / 1e6
