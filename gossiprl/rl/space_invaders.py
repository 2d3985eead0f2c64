"""MinAtar's SpaceInvaders, every env of a vector stepped at once as numpy arrays.

MinAtar steps each game in Python, a dozen small numpy calls per frame: SpaceInvaders took about
a quarter of a one-agent loop's CPU per frame (Breakout's game is a few scalar updates), and
more under a swarm's contention. Here the same rules run once per batch. It is MinAtar 1.0's
game, rule for rule and in its order (``minatar/environments/space_invaders.py``, with
``minatar.Environment``'s sticky actions drawn from each env's own seeded RNG), so a run sees the
frames, rewards and terminals MinAtar's own loop would: tests step both side by side and compare
every array. The game itself draws no random numbers; only the sticky actions do.
"""

from __future__ import annotations

import numpy as np

SHOT_COOL_DOWN = 5
ENEMY_MOVE_INTERVAL = 12
ENEMY_SHOT_INTERVAL = 10
NOOP, LEFT, UP, RIGHT, DOWN, FIRE = range(6)
"""MinAtar's full action set ('n', 'l', 'u', 'r', 'd', 'f'); up and down do nothing here."""
SEARCH_ORDER = np.array([sorted(range(10), key=lambda col: abs(col - pos)) for pos in range(10)])
"""Columns nearest the cannon first (ties to the left): the order an alien is chosen to shoot."""


class SpaceInvaders:
    """``num_envs`` SpaceInvaders games; ``act`` and ``state`` are MinAtar's ``Environment``'s, for all
    of them at once. A finished game stays finished until ``reset`` restarts it, as in MinAtar."""

    def __init__(self, num_envs: int, sticky_action_prob: float = 0.1, difficulty_ramping: bool = True):
        self.num_envs = num_envs
        self.sticky_action_prob = sticky_action_prob
        self.ramping = bool(difficulty_ramping)  # MinAtar reads it as a truth value
        self.randoms = [np.random.RandomState() for _ in range(num_envs)]
        self.last_action = np.zeros(num_envs, dtype=np.int64)
        self.pos = np.zeros(num_envs, dtype=np.int64)
        self.aliens = np.zeros((num_envs, 10, 10), dtype=bool)
        self.friendly = np.zeros((num_envs, 10, 10), dtype=bool)
        self.enemy = np.zeros((num_envs, 10, 10), dtype=bool)
        self.alien_dir = np.zeros(num_envs, dtype=np.int64)
        self.move_interval = np.zeros(num_envs, dtype=np.int64)
        self.move_timer = np.zeros(num_envs, dtype=np.int64)
        self.shot_timer = np.zeros(num_envs, dtype=np.int64)
        self.cool_down = np.zeros(num_envs, dtype=np.int64)
        self.ramp_index = np.zeros(num_envs, dtype=np.int64)
        self.terminal = np.zeros(num_envs, dtype=bool)
        self._all = np.arange(num_envs)
        self.reset(self._all)

    def seed(self, i: int, seed: int) -> None:
        """Env ``i``'s RNG, as ``Environment.seed`` sets it."""
        self.randoms[i] = np.random.RandomState(seed)

    def reset(self, envs: np.ndarray) -> None:
        """Restart the games ``envs`` (indices). Their last actions stay, as MinAtar's do."""
        self.pos[envs] = 5
        self.friendly[envs] = self.enemy[envs] = self.aliens[envs] = False
        self.aliens[envs, 0:4, 2:8] = True
        self.alien_dir[envs] = -1
        self.move_interval[envs] = self.move_timer[envs] = ENEMY_MOVE_INTERVAL
        self.shot_timer[envs] = ENEMY_SHOT_INTERVAL
        self.ramp_index[envs] = self.cool_down[envs] = 0
        self.terminal[envs] = False

    def act(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One frame of every game (none may be finished): the rewards and which games ended."""
        if self.terminal.any() or np.shape(actions) != (self.num_envs,):
            raise ValueError(
                f"act takes one action for each of the {self.num_envs} games, none of them finished "
                f"(reset those first); got actions of shape {np.shape(actions)}, "
                f"finished {np.flatnonzero(self.terminal)}"
            )
        sticky = np.array([random.rand() for random in self.randoms]) < self.sticky_action_prob
        actions = np.where(sticky, self.last_action, actions)
        self.last_action = actions
        self._move_cannon(actions)
        self.friendly[:, :9] = self.friendly[:, 1:]  # friendly bullets rise one row (numpy copes with the overlap)
        self.friendly[:, 9] = False
        self.enemy[:, 1:] = self.enemy[:, :9]  # enemy bullets fall one row
        self.enemy[:, 0] = False
        self.terminal |= self.enemy[self._all, 9, self.pos] | self.aliens[self._all, 9, self.pos]
        self._move_aliens(np.flatnonzero(self.move_timer == 0))
        self._aliens_shoot(np.flatnonzero(self.shot_timer == 0))
        kills = self.aliens & self.friendly
        rewards = kills.sum(axis=(1, 2)).astype(np.float64)
        self.aliens &= ~kills
        self.friendly &= ~kills
        self.cool_down -= self.cool_down > 0
        self.move_timer -= 1
        self.shot_timer -= 1
        self._next_wave(np.flatnonzero(~self.aliens.any(axis=(1, 2))))
        return rewards, self.terminal.copy()

    def _move_cannon(self, actions: np.ndarray) -> None:
        fire = np.flatnonzero((actions == FIRE) & (self.cool_down == 0))
        self.friendly[fire, 9, self.pos[fire]] = True
        self.cool_down[fire] = SHOT_COOL_DOWN
        self.pos = np.where(actions == LEFT, np.maximum(0, self.pos - 1), self.pos)
        self.pos = np.where(actions == RIGHT, np.minimum(9, self.pos + 1), self.pos)

    def _move_aliens(self, envs: np.ndarray) -> None:
        """The aliens of ``envs`` (their move timers ran out) step sideways, or down a row and turn
        at an edge; reaching the cannon's row at an edge, or the cannon, ends the game."""
        if not len(envs):
            return
        aliens = self.aliens[envs]
        self.move_timer[envs] = np.minimum(aliens.sum(axis=(1, 2)), self.move_interval[envs])
        heading = self.alien_dir[envs]
        turn = (aliens[:, :, 0].any(axis=1) & (heading < 0)) | (aliens[:, :, 9].any(axis=1) & (heading > 0))
        self.alien_dir[envs] = np.where(turn, -heading, heading)
        self.terminal[envs] |= turn & aliens[:, 9].any(axis=1)
        aliens[turn] = np.roll(aliens[turn], 1, axis=1)
        for step in (-1, 1):
            side = ~turn & (heading == step)
            aliens[side] = np.roll(aliens[side], step, axis=2)
        self.aliens[envs] = aliens
        self.terminal[envs] |= aliens[np.arange(len(envs)), 9, self.pos[envs]]

    def _aliens_shoot(self, envs: np.ndarray) -> None:
        """In ``envs`` (their shot timers ran out) the lowest alien of the column nearest the cannon
        fires. Every game has an alien here: an emptied wave is replaced at the end of each frame."""
        if not len(envs):
            return
        self.shot_timer[envs] = ENEMY_SHOT_INTERVAL
        order = SEARCH_ORDER[self.pos[envs]]
        columns = self.aliens[envs].any(axis=1)[np.arange(len(envs))[:, None], order]
        column = order[np.arange(len(envs)), columns.argmax(axis=1)]
        in_column = self.aliens[envs, :, column]
        row = 9 - in_column[:, ::-1].argmax(axis=1)
        self.enemy[envs, row, column] = True

    def _next_wave(self, envs: np.ndarray) -> None:
        """A cleared wave is replaced by a new one, a step faster while ramping (down to 6 frames)."""
        if not len(envs):
            return
        faster = envs[self.ramping & (self.move_interval[envs] > 6)]
        self.move_interval[faster] -= 1
        self.ramp_index[faster] += 1
        self.aliens[envs, 0:4, 2:8] = True

    def state(self, out: np.ndarray) -> None:
        """Every game's 10x10x6 frame, written into ``out`` (num_envs x 10 x 10 x 6, bool). Channels:
        cannon, alien, alien moving left, alien moving right, friendly bullet, enemy bullet."""
        out[:] = False
        out[self._all, 9, self.pos, 0] = True
        out[..., 1] = self.aliens
        out[..., 2] = self.aliens & (self.alien_dir < 0)[:, None, None]
        out[..., 3] = self.aliens & (self.alien_dir > 0)[:, None, None]
        out[..., 4] = self.friendly
        out[..., 5] = self.enemy
