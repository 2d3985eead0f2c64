"""The untrained policy's score on each env the studies use: the floor every learning curve starts
from, drawn in every figure and stated beside every study, so a score can be read as learning
(or as none).

The policy is the network a swarm of seed s starts from (``torch.manual_seed(s)`` before
``make_model``, as the agent does with the default shared initial network), played the way the
studies play final policies (``gossiprl.rl.evaluate``: sampled actions, a fixed quota of episodes
per env slot), but each seed on its own episodes: the policy head starts near uniform, so every
seed's network would otherwise play the same episodes with the same actions. One row per (env, seed) goes to
the CSV ``--out`` names (``experiments/results/untrained/untrained.csv`` is the committed one, which the
studies' figures read; it takes a minute), or to a fresh runs/ directory.

    python -m experiments.untrained --out experiments/results/untrained/untrained.csv [--seeds 1,2,3,4,5]
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import click
import numpy as np
import torch

from experiments.common import QUICK_ENV, REAL_ENV, fresh_out, parse_seeds
from gossiprl.rl.envs import make_env
from gossiprl.rl.evaluate import _play, _step_cap
from gossiprl.rl.models import make_model

PATH = Path(__file__).resolve().parent / "results" / "untrained" / "untrained.csv"
ENVS = (REAL_ENV, "MinAtar/SpaceInvaders-v1", QUICK_ENV)
EVAL_SEED = 12345
"""The env and action-sampling seed ``gossiprl.rl.evaluate`` plays final policies with; seed s plays
from EVAL_SEED + 100 s (its 8 env slots never reach the next seed's)."""


def play_untrained(env_id: str, seed: int, episodes: int) -> list[float]:
    """Returns of ``episodes`` episodes of the network seed ``seed``'s swarm starts from."""
    slots = min(8, episodes)
    play_seed = EVAL_SEED + 100 * seed
    envs = make_env(env_id, slots, play_seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        model = make_model(envs.observation_space, envs.action_space).eval()
        generator = torch.Generator()
        generator.manual_seed(play_seed)
        return _play(model, envs, episodes, False, "cpu", generator, _step_cap(env_id))
    finally:
        torch.set_num_threads(threads)
        envs.close()


def untrained_score(env_id: str, path: Path = PATH) -> dict | None:
    """{'mean' over all episodes, 'low'/'high' of the seeds' means, 'seeds', 'episodes'} for
    ``env_id`` from the committed CSV; None where it was not measured."""
    if not path.exists():
        return None
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["env"] == env_id]
    if not rows:
        return None
    per_seed = [json.loads(r["returns"]) for r in rows]
    means = [float(np.mean(v)) for v in per_seed]
    return {
        "mean": float(np.mean(np.concatenate(per_seed))),
        "low": min(means),
        "high": max(means),
        "seeds": len(rows),
        "episodes": len(per_seed[0]),
    }


def untrained_text(env_id: str) -> str:
    score = untrained_score(env_id)
    if score is None:
        return f"not measured on {env_id} (`python -m experiments.untrained --env {env_id}`)"
    return (
        f"{score['mean']:.2f} (seeds' means {score['low']:.2f}-{score['high']:.2f}; the initial network of "
        f"{score['seeds']} seeds, {score['episodes']} episodes each, played as final policies are)"
    )


@click.command(help="Score the untrained initial network on each env, into a CSV.")
@click.option("--env", "envs", multiple=True, default=ENVS, show_default=True)
@click.option("--seeds", default="1,2,3,4,5", show_default=True, help="Comma-separated swarm seeds.")
@click.option("--episodes", type=click.IntRange(min=1), default=10, show_default=True)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"The CSV to write; {PATH.relative_to(PATH.parents[3])} to update the committed one "
    "[default: untrained.csv in a fresh runs/untrained-<time>/].",
)
def main(envs, seeds, episodes, out):
    seed_list = parse_seeds(seeds)
    out = out or fresh_out("untrained", quick=False) / "untrained.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, ["env", "seed", "episodes", "mean", "std", "returns"])
        writer.writeheader()
        for env_id in envs:
            for seed in seed_list:
                returns = play_untrained(env_id, seed, episodes)
                writer.writerow(
                    {
                        "env": env_id,
                        "seed": seed,
                        "episodes": episodes,
                        "mean": float(np.mean(returns)),
                        "std": float(np.std(returns)),
                        "returns": json.dumps(returns),
                    }
                )
                click.echo(f"{env_id} seed {seed}: {np.mean(returns):.2f} over {episodes} episodes")
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
