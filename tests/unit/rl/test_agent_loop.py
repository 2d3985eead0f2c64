"""The agent loop's fast paths do what the slow ones did: same env steps, same action distribution, sane threads."""

from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from gossiprl.rl.agent import Tally
from gossiprl.rl.envs import make_env
from gossiprl.rl.rollouts import sample
from gossiprl.rl.settings import AgentConfig, thread_plan

pytest.importorskip("minatar")


@pytest.mark.parametrize("game", ["Breakout", "Seaquest", "SpaceInvaders"])
def test_minatar_vector_env_steps_exactly_as_gymnasiums_sync_vector_env(game):
    ours = make_env(f"MinAtar/{game}-v1", 4, seed=11)
    theirs = gym.make_vec(
        f"MinAtar/{game}-v1", 4, vectorization_mode="sync", vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}
    )
    np.testing.assert_array_equal(ours.reset(), theirs.reset(seed=11)[0])
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(1500):
        actions = rng.integers(0, ours.action_space.n, 4)
        obs, reward, done, (cut, _) = ours.step(actions)
        t_obs, t_reward, t_term, t_trunc, _ = theirs.step(actions)
        np.testing.assert_array_equal(obs, t_obs)
        np.testing.assert_array_equal(reward, t_reward)
        np.testing.assert_array_equal(done, t_term | t_trunc)
        assert len(cut) == 0
        ends += int(done.sum())
    assert ends > 0  # autoreset was exercised
    assert ours.observation_space == theirs.single_observation_space
    assert ours.action_space == theirs.single_action_space


def test_gumbel_max_sampling_draws_from_the_softmax():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]]).repeat(200_000, 1)
    counts = torch.bincount(sample(logits), minlength=4).double()
    expected = torch.softmax(logits[0].double(), 0) * len(logits)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.3  # 3 degrees of freedom: p = 0.001


def test_threads_default_to_one_for_torch_and_a_share_of_the_cores_for_the_env(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert thread_plan(AgentConfig()) == {"torch": 1, "env": 8}
    assert thread_plan(AgentConfig(agents_per_host=4)) == {"torch": 1, "env": 2}
    assert thread_plan(AgentConfig(agents_per_host=16)) == {"torch": 1, "env": 1}
    assert thread_plan(replace(AgentConfig(), torch_threads=3)) == {"torch": 3, "env": 3}


def test_the_summary_averages_a_sources_rates_and_keeps_its_running_counts_last():
    """The summary averaged every source stat over the updates, which turns a running count (IMPALA's
    refused JOINs: 0, 0, 3, 3) into a fraction no one can read."""
    tally = Tally()
    tally.start()
    for updates, (lag, refused) in enumerate([(1.0, 0.0), (3.0, 0.0), (2.0, 3.0), (2.0, 3.0)], 1):
        tally.add_source_stats({"impala/policy_lag_mean": lag, "impala/refused_joins_total": refused})
        tally.updates = updates
    summary = tally.summary()
    assert summary["impala/policy_lag_mean"] == 2.0 and summary["impala/refused_joins_total"] == 3.0
