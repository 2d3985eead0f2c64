"""Topology ablation: the same swarm under ring, sparse, time-varying sparse and full mixing.

Each (topology, seed) is a real `gossiprl run` into its own run dir; the table gives the
time and frames to the solve threshold (or the budget), the final mean return over the last
100 episodes, and the share of time spent in gossip, plus the topology's spectral gap so
the consensus speed can be read next to the learning speed. Curves go to curves.png.

    python experiments/topology_ablation.py --env CartPole-v1 --agents 4 --seeds 1,2,3
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import click

import topologies
from gossiprl import launch
from gossiprl.agent import AgentConfig
from gossiprl.draw import plot_runs
from gossiprl.envs import env_spec

LAYOUTS = {
    "ring": ("ring", {}),
    "sparse": ("sparse", {}),
    "sparse-tv": ("sparse", {"time_varying": True}),
    "full": ("full", {}),
}


@click.command()
@click.option("--env", "env_id", default="CartPole-v1", show_default=True)
@click.option("--agents", type=click.IntRange(min=2), default=4, show_default=True)
@click.option("--seeds", default="1,2,3", show_default=True)
@click.option("--layouts", default=",".join(LAYOUTS), show_default=True)
@click.option("--total-frames", type=click.IntRange(min=1), default=2_000_000, show_default=True,
              help="Budget for the whole swarm per run.")
@click.option("--mode", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("runs") / f"ablation-{int(time.time())}", show_default="runs/ablation-TIME")
def main(env_id, agents, seeds, layouts, total_frames, mode, out_dir):
    threshold = env_spec(env_id)
    names = [name.strip() for name in layouts.split(",") if name.strip()]
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown:
        raise click.BadParameter(f"{unknown}: valid layouts are {', '.join(LAYOUTS)}", param_hint="--layouts")
    rows, run_dirs = [], []
    for name in names:
        topo_name, options = LAYOUTS[name]
        gap = topologies.make(topo_name, agents, **options).spectral_gap
        for seed in [int(s) for s in seeds.split(",")]:
            run_dir = out_dir / f"{name}__seed{seed}"
            swarm = launch.SwarmConfig(agents=agents, topology=topo_name, mode=mode, stop_at_return=threshold,
                                       time_varying=options.get("time_varying", False))
            cfg = AgentConfig(env_id=env_id, seed=seed, total_frames=total_frames // agents)
            summary = launch.run(swarm, cfg, run_dir, show_progress=False)
            rows.append({"layout": name, "seed": seed, "spectral_gap": gap, "solved": summary["stopped_by"].startswith("solved"),
                         "frames": summary["frames"], "wall_s": summary["wall_seconds"],
                         "mean_return": summary["mean_return"], "gossip_share": summary["gossip_share"]})
            run_dirs.append(run_dir)
            r = rows[-1]
            click.echo(f"{name:10s} seed {seed}: gap {gap:.3f}  {'solved' if r['solved'] else 'budget':6s} "
                       f"{r['frames']:>10,} frames {r['wall_s']:7.1f}s  return {r['mean_return']:7.1f}  "
                       f"gossip {100 * r['gossip_share']:4.1f}%")
    (out_dir / "results.json").write_text(json.dumps(rows, indent=2))
    plot_runs(run_dirs, out_dir / "curves.png")
    click.echo(f"table in {out_dir / 'results.json'}, curves in {out_dir / 'curves.png'}")


if __name__ == "__main__":
    main()
