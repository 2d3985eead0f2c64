"""An env the user registers in a module of their own trains, resumes and loads by MODULE:ENV_ID."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from gossiprl.rl.envs import env_spec, make_env  # noqa: E402

REGISTERING_MODULE = '''
import gymnasium as gym
import numpy as np


class Guess(gym.Env):
    """Say which of two lights is on: +1 when right; 20 steps an episode."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.light = 0, int(self.np_random.integers(2))
        return np.eye(2, dtype=np.float32)[self.light], {}

    def step(self, action):
        reward = float(action == self.light)
        self.t += 1
        self.light = int(self.np_random.integers(2))
        return np.eye(2, dtype=np.float32)[self.light], reward, False, self.t >= 20, {}


gym.register("Guess-v0", entry_point=Guess, reward_threshold=18.0)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module named my_guess_env on PYTHONPATH, as a user's own package would be."""
    (tmp_path / "my_guess_env.py").write_text(REGISTERING_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return tmp_path


def test_module_colon_id_registers_the_env_in_this_process(user_module):
    assert env_spec("my_guess_env:Guess-v0") == 18.0
    envs = make_env("my_guess_env:Guess-v0", 3, seed=0)
    assert envs.reset().shape == (3, 2)
    envs.close()


@pytest.mark.parametrize(
    "env_id, words",
    [
        ("no_such_module_here:Guess-v0", "cannot import 'no_such_module_here'"),
        ("not a module:Guess-v0", "is not a Python module name"),
        ("my_guess_env:NoSuchEnv-v0", "unknown env id"),
    ],
)
def test_a_bad_module_or_an_unregistered_id_is_one_clear_error(user_module, env_id, words):
    with pytest.raises(ValueError, match=words):
        env_spec(env_id)


@pytest.mark.timeout(180)
def test_a_swarm_trains_on_it_and_the_policy_loads(user_module, tmp_path):
    """The agents are spawned processes: each must register the env again, from the id alone."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gossiprl.cli",
            "run",
            "--env",
            "my_guess_env:Guess-v0",
            "--agents",
            "2",
            "--total-frames",
            "20000",
            "--num-envs",
            "4",
            "--no-progress",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 20000 or summary["solved_at"], summary
    assert json.loads((run_dir / "config.json").read_text())["agent"]["env_id"] == "my_guess_env:Guess-v0"

    import gossiprl

    policy = gossiprl.load_policy(run_dir, import_env_module=True)  # our own run: its module is trusted
    envs = policy.make_env(num_envs=2)
    actions = policy.act(envs.reset())
    assert actions.shape == (2,)
    envs.close()
