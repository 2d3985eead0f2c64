"""A well-known library's reference curves: Stable-Baselines3's A2C and PPO on the env, frames,
seeds and network of gossiprl's own runs, so gossiprl's one agent and its swarms can be read
against an implementation that is not ours.

What matches gossiprl's single agent (``gossiprl run --agents 1``):

* env: the same gymnasium id, built by MinAtar's own gymnasium class (sticky actions 0.1, the
  minimal action set of the -v1 ids, no time limit), one frame per env step, rewards unclipped;
  the same seed numbers;
* network: gossiprl's ``MinAtarActorCritic`` trunk (3x3 conv, 16 channels, ReLU, 128 ReLU units;
  built by gossiprl's own class, ``MinAtarTrunk``) as SB3's features extractor, shared by a linear
  policy head and a linear value head (``net_arch=[]``); SB3's orthogonal init is gossiprl's
  (gain sqrt 2 in the trunk, 0.01 policy head, 1 value head). On vector observations (CartPole)
  both use separate 64-64 tanh MLPs for policy and value (SB3's default, gossiprl's MLPActorCritic);
* A2C: gossiprl's defaults for the env, read from ``gossiprl.rl.a2c.resolve_defaults``, at A2C's
  Atari rate: 16 envs x 5 steps, RMSProp lr 7e-4 (SB3's own default; gossiprl's MinAtar default is
  2.8e-3, the studies' rate 1.4e-3, and its one agent at 7e-4 is the arm set beside) alpha 0.99
  eps 1e-5, gamma 0.99, n-step returns bootstrapped from V (SB3's GAE with lambda 1), entropy 0.01
  on MinAtar (0 on control tasks), value coef 0.5, global gradient clip 0.5, advantages not
  normalised; episodes cut by a time limit bootstrap from V(final obs) in both;
* score: the mean of the last 100 finished training episodes; one torch thread, as gossiprl's
  agent takes.

What differs: the random draws (SB3 seeds env i with s + i and torch with s; gossiprl draws both
from (s, rank)), SB3's rollout and update code (the point of the comparison), and frames/s (SB3
steps its envs through gymnasium's wrappers, DummyVecEnv and Monitor; gossiprl through a plain
loop over MinAtar's games).

PPO uses CleanRL's Atari settings (``cleanrl/ppo_atari.py`` defaults; CleanRL has no MinAtar
script): 8 envs x 128 steps, 4 epochs of 4 minibatches (batch 256), Adam lr 2.5e-4 annealed
linearly to 0, eps 1e-5, gamma 0.99, GAE lambda 0.95, clip 0.1, advantages normalised per
minibatch, entropy 0.01, gradient clip 0.5, on the same network. CleanRL's value loss is half
the squared error weighted 0.5: SB3's vf_coef 0.25 gives the same gradient. CleanRL clips the
value loss (the larger of the clipped and unclipped errors); SB3 cannot (its ``clip_range_vf``
clips the prediction alone), so that is left off.

One cell is one (algorithm, seed): its row goes to ``<out>/cells/SB3-A2C__seed<k>.json`` (last-100
mean, frames, training seconds and frames/s from the training clock only, settings, versions),
its curve to ``<out>/curves/SB3-A2C__seed<k>.csv`` (every finished episode: frames, training
seconds, return); likewise SB3-PPO. A cell whose row exists with the same settings is not run again; seeds run one
after another, both algorithms per seed. Without ``--out`` the results go to a fresh directory
under runs/ (never into the committed experiments/results/). The full study, then RESULTS.md:

    nice -n 19 python -m experiments.baselines --out experiments/results/baselines
    nice -n 19 python -m experiments.baselines --env MinAtar/SpaceInvaders-v1 \\
        --out experiments/results/baselines-spaceinvaders
    python -m experiments.make_results
    python -m experiments.baselines --quick       # CartPole, 4,000 frames, seed 1: a smoke test
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path

import click
import numpy as np
import torch

from experiments.common import QUICK_ENV, REAL_ENV, _write_json, cell_key, fresh_out, load_rows, parse_seeds, write_csv
from experiments.study import earlier_plan, window_seeds
from gossiprl.cli import interrupted_status
from gossiprl.rl.a2c import ATARI_LR, resolve_defaults
from gossiprl.rl.envs import env_spec, is_atari
from gossiprl.rl.models import MinAtarActorCritic
from gossiprl.rl.settings import A2CConfig

try:
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
except ImportError:
    sys.exit("experiments.baselines needs Stable-Baselines3: pip install -e '.[baselines]'")

ALGOS = {"a2c": "SB3 A2C", "ppo": "SB3 PPO"}
"""Algorithm -> setting name (the legend and the tables show it)."""

PPO_CLEANRL = {
    "n_envs": 8,
    "n_steps": 128,
    "n_epochs": 4,
    "batch_size": 256,  # 8 x 128 / 4 minibatches
    "learning_rate": 2.5e-4,
    "anneal_lr": True,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_range": 0.1,
    "normalize_advantage": True,
    "ent_coef": 0.01,
    "vf_coef": 0.25,  # CleanRL's 0.5 x (0.5 x squared error)
    "max_grad_norm": 0.5,
}


class MinAtarTrunk(BaseFeaturesExtractor):
    """gossiprl's MinAtar trunk, taken from its own network class, as SB3's features extractor."""

    def __init__(self, observation_space):
        size, _, channels = observation_space.shape
        trunk = MinAtarActorCritic(channels, 1, size=size).trunk
        super().__init__(observation_space, features_dim=trunk[-2].out_features)
        self.trunk = trunk

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(obs.permute(0, 3, 1, 2))  # MinAtar gives (B, 10, 10, C), channels last


def settings(algo: str, env_id: str) -> dict:
    """The algorithm's hyperparameters, JSON-able: they go into each row and its fingerprint."""
    if algo == "ppo":
        return dict(PPO_CLEANRL)
    cfg = resolve_defaults(A2CConfig(lr=ATARI_LR), env_id)
    return {
        "n_envs": cfg.num_envs,
        "n_steps": cfg.n_steps,
        "learning_rate": cfg.lr,
        "rmsprop_alpha": cfg.rmsprop_alpha,
        "rmsprop_eps": cfg.rmsprop_eps,
        "gamma": cfg.gamma,
        "gae_lambda": 1.0,  # plain n-step returns
        "ent_coef": cfg.entropy_coef,
        "vf_coef": cfg.value_coef,
        "max_grad_norm": cfg.max_grad_norm,
        "normalize_advantage": False,
    }


def build(algo: str, env_id: str, seed: int, hyper: dict):
    hyper = dict(hyper)
    envs = make_vec_env(env_id, n_envs=hyper.pop("n_envs"), seed=seed)
    obs_space = envs.observation_space
    policy_kwargs: dict = {}
    if obs_space.dtype == bool and len(obs_space.shape) == 3:  # MinAtar's grids: gossiprl's CNN trunk
        policy_kwargs = {"features_extractor_class": MinAtarTrunk, "net_arch": []}
    if algo == "a2c":
        policy_kwargs["optimizer_class"] = torch.optim.RMSprop
        policy_kwargs["optimizer_kwargs"] = {"alpha": hyper.pop("rmsprop_alpha"), "eps": hyper.pop("rmsprop_eps")}
        return sb3.A2C("MlpPolicy", envs, policy_kwargs=policy_kwargs, seed=seed, device="cpu", **hyper)
    lr = hyper.pop("learning_rate")
    if hyper.pop("anneal_lr"):
        hyper["learning_rate"] = lambda remaining: lr * remaining  # SB3's progress runs 1 -> 0
    return sb3.PPO("MlpPolicy", envs, policy_kwargs=policy_kwargs, seed=seed, device="cpu", **hyper)


TERMINATED = threading.Event()
"""Set by SIGTERM (a scheduler's kill): SB3 ends its run at the next step (``Episodes``). A
KeyboardInterrupt raised there instead can land in code torch runs from C, after which Python exits
as if by SIGINT (-2), whatever status the script asks for."""


class Episodes(BaseCallback):
    """Every finished episode (frames so far, training seconds, return), from SB3's Monitor; False, which
    ends SB3's run, once ``TERMINATED`` is set."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, float, float]] = []
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.rows.append((self.num_timesteps, time.perf_counter() - self.start, float(info["episode"]["r"])))
        return not TERMINATED.is_set()


def run_cell(algo: str, env_id: str, seed: int, frames: int, hyper: dict, curve: Path) -> dict:
    model = build(algo, env_id, seed, hyper)
    episodes = Episodes()
    start, cpu = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=frames, callback=episodes)
    train_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    model.get_env().close()
    tmp = curve.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["frames", "train_s", "return"])
        writer.writerows((n, f"{t:.1f}", f"{r:g}") for n, t, r in episodes.rows)
    os.replace(tmp, curve)
    last100 = deque((r for _, _, r in episodes.rows), maxlen=100)
    return {
        "frames": int(model.num_timesteps),
        "train_s": train_s,
        "fps": model.num_timesteps / train_s,
        "cpu_s": cpu_s,  # the CPU this process got: on shared cores, frames/s alone says as much about the load
        "episodes": len(episodes.rows),
        "last100": float(np.mean(last100)) if last100 else None,
    }


def fingerprint(algo: str, env_id: str, seed: int, frames: int, hyper: dict) -> str:
    what = {"algo": algo, "env": env_id, "seed": seed, "frames": frames, "settings": hyper, "sb3": sb3.__version__}
    return hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


@click.command(help="Stable-Baselines3 A2C and PPO on gossiprl's env, budget, seeds and network.")
@click.option("--quick", is_flag=True, help=f"{QUICK_ENV}, 4,000 frames, seed 1, into a temporary dir: a smoke test.")
@click.option("--env", "env_id", default=None, help=f"[default: {REAL_ENV}; --quick: {QUICK_ENV}]")
@click.option("--frames", type=click.IntRange(min=1), default=None, help="Frames per run [default: 1,000,000].")
@click.option(
    "--seeds",
    default=None,
    help="Comma-separated seeds [default: 1,2,3,4,5; --quick: 1; in an existing --out, the seeds it plans]. "
    "Given for an existing --out, they run now and join its plan, which only grows.",
)
@click.option("--algos", default=",".join(ALGOS), show_default=True, help="Comma-separated, of a2c, ppo.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Results dir; give an existing one to resume it [default: a fresh runs/baselines-<time>/].",
)
def main(quick, env_id, frames, seeds, algos, out):
    given_env, env_id = env_id, env_id or (QUICK_ENV if quick else REAL_ENV)
    try:
        env_spec(env_id)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--env") from None
    if is_atari(env_id):
        raise click.BadParameter(f"{env_id}: give a MinAtar or vector-observation id (Atari is not wired here)")
    algo_list = [a.strip() for a in algos.split(",") if a.strip()]
    if not algo_list or set(algo_list) - set(ALGOS):
        raise click.BadParameter(
            f"{algos!r}: give a comma-separated subset of {', '.join(ALGOS)}", param_hint="--algos"
        )
    asked = parse_seeds(seeds, "1" if quick else "1,2,3,4,5")
    given_frames, frames = frames, frames or (4_000 if quick else 1_000_000)
    given_out, out = out, out or fresh_out("baselines", quick)
    # --algos on an existing dir is a window as --seeds is: it runs now, and the plan keeps what it had
    planned_seeds, seed_list = window_seeds(out, "baselines", env_id, frames, quick, asked, given=seeds is not None)
    names = [*earlier_plan(out, "baselines", env_id, frames, quick).get("settings", []), *(ALGOS[a] for a in algo_list)]
    planned_algos = [a for a in ALGOS if ALGOS[a] in names]
    for folder in (out / "cells", out / "curves"):
        folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    command = ["python", "-m", "experiments.baselines", *(["--quick"] if quick else [])]
    for flag, value in (("--env", given_env), ("--frames", given_frames), ("--out", given_out)):
        command += [flag, str(value)] if value is not None else []
    command += ["--seeds", ",".join(map(str, planned_seeds)), "--algos", ",".join(planned_algos)]
    _write_json(
        out / "study.json",
        {
            "study": "baselines",
            "env": env_id,
            "frames_per_cell": frames,
            "seeds": planned_seeds,
            "settings": [ALGOS[a] for a in planned_algos],
            "quick": quick,
            "command": shlex.join(command),
        },
    )
    click.echo(
        f"SB3 {sb3.__version__}: {', '.join(algo_list)} x seeds {seed_list}, {frames:,} frames on {env_id} -> {out}"
    )
    cells = [(seed, algo) for seed in seed_list for algo in algo_list]  # seed by seed, both algorithms per seed
    signal.signal(signal.SIGTERM, lambda signum, frame: TERMINATED.set())
    try:
        finished = run_cells(cells, env_id, frames, out)
    except KeyboardInterrupt:
        finished = False
    if not finished:
        click.echo(
            f"baselines stopped: the same command with --out {shlex.quote(str(out))} goes on, from the cell "
            "it cut (an SB3 run keeps no checkpoint: that cell starts again)",
            err=True,
        )
        sys.exit(interrupted_status(signal.SIGTERM if TERMINATED.is_set() else signal.SIGINT))
    write_csv(out / "results.csv", load_rows(out))
    click.echo(f"rows in {out / 'results.csv'}")


def run_cells(cells: list[tuple[int, str]], env_id: str, frames: int, out: Path) -> bool:
    """Each (seed, algorithm) not finished before, its row written whole once its run ends; False when
    a SIGTERM cut one short (it writes no row)."""
    for k, (seed, algo) in enumerate(cells, 1):
        hyper = settings(algo, env_id)
        key = cell_key(ALGOS[algo], seed)
        row_path = out / "cells" / f"{key}.json"
        stamp = fingerprint(algo, env_id, seed, frames, hyper)
        if row_path.exists() and json.loads(row_path.read_text()).get("fingerprint") == stamp:
            click.echo(f"[{k}/{len(cells)}] {ALGOS[algo]}, seed {seed}: done before, kept")
            continue
        result = run_cell(algo, env_id, seed, frames, hyper, out / "curves" / f"{key}.csv")
        if result["frames"] < frames:  # SIGTERM cut it (Episodes): not this cell's result
            return False
        row = {
            "setting": ALGOS[algo],
            "algo": algo,
            "seed": seed,
            "env": env_id,
            **result,
            "per_agent_last100": [result["last100"]],  # one agent: read like gossiprl's rows
            "settings": hyper,
            "sb3": sb3.__version__,
            "torch": torch.__version__,
            "fingerprint": stamp,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_json(row_path, row)
        score = "no episode finished" if row["last100"] is None else f"last-100 mean {row['last100']:.2f}"
        click.echo(
            f"[{k}/{len(cells)}] {ALGOS[algo]}, seed {seed}: {row['frames']:,} frames in {row['train_s']:.0f} s "
            f"of training ({row['fps']:.0f} frames/s, {row['frames'] / row['cpu_s']:.0f} per CPU-second), "
            f"{row['episodes']} episodes, {score}"
        )
        if TERMINATED.is_set():  # it came once the run had its frames: its row is kept, the next cell not run
            return False
    return True


if __name__ == "__main__":
    main()
