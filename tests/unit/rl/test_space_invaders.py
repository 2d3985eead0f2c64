"""The batched SpaceInvaders is MinAtar's game: stepped beside MinAtar's own loop on the same
seeds and actions, every frame, reward and terminal is the same, from the first reset and from
mid-game states drawn at random (edges, cleared waves and the speed ramp included)."""

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("minatar", reason="MinAtar is the optional extra: pip install 'gossiprl[minatar]'")

from gossiprl.rl.envs import MinAtarVectorEnv, make_env  # noqa: E402
from gossiprl.rl.space_invaders import SpaceInvaders  # noqa: E402

NUM_ENVS = 16


def side_by_side(kwargs: dict, seed: int) -> tuple[MinAtarVectorEnv, MinAtarVectorEnv]:
    batched, minatar = MinAtarVectorEnv(kwargs, NUM_ENVS), MinAtarVectorEnv(kwargs, NUM_ENVS, batched=False)
    assert isinstance(batched.games, SpaceInvaders) and not isinstance(minatar.games, SpaceInvaders)
    first, _ = batched.reset(seed=seed)
    assert (first == minatar.reset(seed=seed)[0]).all()
    return batched, minatar


def step_both(batched, minatar, actions) -> tuple:
    obs, rewards, terminated, truncated, _ = batched.step(actions)
    want_obs, want_rewards, want_terminated, want_truncated, _ = minatar.step(actions)
    assert obs.dtype == want_obs.dtype and rewards.dtype == want_rewards.dtype
    assert (obs == want_obs).all()
    assert (rewards == want_rewards).all() and (terminated == want_terminated).all()
    assert not truncated.any() and not want_truncated.any()
    return obs, rewards, terminated


def aim(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Full-action-set actions that clear waves (so play reaches the speed ramp): step aside from an
    enemy bullet falling toward the cannon, else move under the nearest column with aliens and fire
    there; now and then a random action."""
    actions = rng.integers(6, size=len(obs))
    for i, frame in enumerate(obs):
        cannon, bullets = frame[9, :, 0].argmax(), frame[6:10, :, 5].any(axis=0)
        columns = np.flatnonzero(frame[..., 1].any(axis=0))
        if rng.random() < 0.05 or not len(columns):
            continue
        target = columns[np.abs(columns - cannon).argmin()]
        step = np.sign(target - cannon)
        if bullets[cannon]:
            clear = [c for c in (cannon - 1, cannon + 1) if 0 <= c <= 9 and not bullets[c]]
            actions[i] = (1 if clear[0] < cannon else 3) if clear else 0
        elif step == 0:
            actions[i] = 5
        else:
            actions[i] = 5 if bullets[cannon + step] else (1 if step < 0 else 3)
    return actions


@pytest.mark.parametrize("env_id", ["MinAtar/SpaceInvaders-v0", "MinAtar/SpaceInvaders-v1"])
def test_from_the_first_reset_every_step_is_minatars(env_id):
    make_env(env_id, 1, seed=0).close()  # registers MinAtar's ids
    kwargs = gym.registry[env_id].kwargs
    batched, minatar = side_by_side(kwargs, seed=7)
    full_to_own = {a: i for i, a in enumerate(batched.action_set)}
    rng = np.random.default_rng(0)
    obs, episodes, score, faster = batched.reset(seed=7)[0], 0, 0.0, 0
    minatar.reset(seed=7)
    for _ in range(3000):
        actions = np.array([full_to_own.get(a, 0) for a in aim(obs, rng)])
        obs, rewards, terminated = step_both(batched, minatar, actions)
        episodes, score = episodes + terminated.sum(), score + rewards.sum()
        faster = max(faster, batched.games.ramp_index.max())
    assert episodes > 50 and score > 1000  # the runs played and scored: not one frozen frame
    assert faster >= 2  # and cleared waves, each faster than the last


@pytest.mark.parametrize(
    "kwargs",
    [
        {"game": "space_invaders"},
        {"game": "space_invaders", "sticky_action_prob": 0.5, "difficulty_ramping": False},
    ],
)
def test_from_random_mid_game_states_every_step_is_minatars(kwargs):
    batched, minatar = side_by_side(kwargs, seed=3)
    rng = np.random.default_rng(1)
    faster = ended = 0
    for _ in range(150):
        for i, game in enumerate(minatar.games.games):
            copy_state(random_state(rng), game.env, batched.games, i)
        for _ in range(40):
            before = batched.games.ramp_index.copy()
            _, _, terminated = step_both(batched, minatar, rng.integers(6, size=NUM_ENVS))
            own = np.array([game.env.ramp_index for game in minatar.games.games])
            assert (batched.games.ramp_index == own).all()
            faster += (own > before).sum()
            ended += terminated.sum()
    assert ended > 100
    assert faster > 20 if kwargs.get("difficulty_ramping", True) else faster == 0


def random_state(rng: np.random.Generator) -> dict:
    """A mid-game state: a few aliens or many, anywhere; stray bullets; any timers in range."""
    aliens = np.zeros(100)
    aliens[rng.choice(100, rng.integers(1, 4) if rng.random() < 0.5 else rng.integers(1, 30), replace=False)] = 1
    interval = int(rng.integers(6, 13))
    return {
        "alien_map": aliens.reshape(10, 10),
        "f_bullet_map": (rng.random((10, 10)) < 0.05) * 1.0,
        "e_bullet_map": (rng.random((10, 10)) < 0.05) * 1.0,
        "pos": int(rng.integers(10)),
        "alien_dir": int(rng.choice([-1, 1])),
        "enemy_move_interval": interval,
        "alien_move_timer": int(rng.integers(0, interval + 1)),
        "alien_shot_timer": int(rng.integers(0, 11)),
        "shot_timer": int(rng.integers(0, 6)),
        "ramp_index": int(rng.integers(0, 3)),
    }


def copy_state(state: dict, game, batch: SpaceInvaders, i: int) -> None:
    """``state`` into MinAtar's game (its attribute names) and into env ``i`` of the batch."""
    for name, value in state.items():
        setattr(game, name, value)
    batch.aliens[i], batch.friendly[i], batch.enemy[i] = (
        state[name] > 0 for name in ("alien_map", "f_bullet_map", "e_bullet_map")
    )
    batch.pos[i], batch.alien_dir[i], batch.move_interval[i] = (
        state["pos"],
        state["alien_dir"],
        state["enemy_move_interval"],
    )
    batch.move_timer[i], batch.shot_timer[i] = state["alien_move_timer"], state["alien_shot_timer"]
    batch.cool_down[i], batch.ramp_index[i] = state["shot_timer"], state["ramp_index"]


def test_act_refuses_a_finished_game_or_the_wrong_number_of_actions():
    games = SpaceInvaders(4)
    with pytest.raises(ValueError, match=r"one action for each of the 4 games.*shape \(1,\)"):
        games.act(np.array([5]))
    games.terminal[2] = True
    with pytest.raises(ValueError, match=r"none of them finished \(reset those first\).*finished \[2\]"):
        games.act(np.zeros(4, dtype=int))
    games.reset(np.array([2]))
    games.act(np.zeros(4, dtype=int))


def test_difficulty_ramping_is_read_as_a_truth_value_as_minatar_reads_it():
    assert SpaceInvaders(2, difficulty_ramping=1).ramping is True
    assert SpaceInvaders(2, difficulty_ramping=None).ramping is False
