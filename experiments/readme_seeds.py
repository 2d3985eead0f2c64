"""Does the README's default command solve CartPole for every seed? Run it and see.

Each seed runs exactly the command a user copies, ``gossiprl run --topology ring --seed S``
(4 agents, 2M frames for the whole swarm, stop once the pooled last-100 mean reaches 475), as a subprocess,
and is then judged both ways: the launcher's pooled rule, and every agent's own last-100
mean; plus the consensus policy's evaluation. Resumable per seed; one line per seed.

    python -m experiments.readme_seeds --seeds 1,2,3,4,5,6 --out experiments/results/readme_seeds
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click

from experiments.common import _write_json, fresh_out, parse_seeds, write_csv
from gossiprl.cli import interrupted_status, stop_on_sigterm
from gossiprl.rl.consensus import evaluate_consensus

THRESHOLD = 475.0
RUN_STOP_S = 120
"""How long a stopped run may take to checkpoint and exit before it is killed."""


@click.command()
@click.option("--seeds", default="1,2,3,4,5,6", show_default=True)
@click.option(
    "--total-frames",
    type=click.IntRange(min=1),
    default=None,
    help="Per agent; default: the command's own default (2M).",
)
@click.option("--eval-episodes", type=click.IntRange(min=1), default=10, show_default=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Results dir; give an existing one to resume it, experiments/results/readme_seeds to update the "
    "committed results [default: a fresh runs/readme_seeds-<time>/].",
)
def main(seeds, total_frames, eval_episodes, out):
    seed_list = parse_seeds(seeds)
    out = out or fresh_out("readme_seeds", quick=False)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    stop_on_sigterm()  # a scheduler's kill stops the seed's run as Ctrl-C does: it checkpoints
    rows = []
    try:
        for seed in seed_list:
            row_path = out / "cells" / f"seed{seed}.json"
            if not row_path.exists():
                _write_json(row_path, run_seed(seed, out / "runs" / f"seed{seed}", total_frames, eval_episodes))
            row = json.loads(row_path.read_text())
            rows.append(row)
            click.echo(
                f"seed {seed}: {row['stopped_by']}; {row['frames'] / 1e6:.2f}M frames {row['wall_s']:.0f}s; "
                f"agents' own last-100 {', '.join(f'{v:.0f}' for v in row['per_agent_last100'])}; "
                f"consensus eval {row['consensus_eval']:.0f}"
            )
    except KeyboardInterrupt:
        click.echo(
            f"readme_seeds stopped: the same command with --out {shlex.quote(str(out))} goes on, from the seed it cut",
            err=True,
        )
        sys.exit(interrupted_status())
    write_csv(out / "results.csv", rows)


def run_seed(seed: int, run_dir: Path, total_frames: int | None, eval_episodes: int) -> dict:
    """The README's command for ``seed``, resumed where an earlier window's stop left it, and its row."""
    command = [sys.executable, "-m", "gossiprl.cli", "run", "--topology", "ring", "--seed", str(seed)]
    command += ["--run-dir", str(run_dir)] + (["--total-frames", str(total_frames)] if total_frames else [])
    if not _ended(run_dir):  # not run yet, cut, or an agent failed: a run that ended is only scored
        _run(command, run_dir, seed)
    summary = json.loads((run_dir / "summary.json").read_text())
    own = [a["mean_return"] for a in summary["per_agent"].values()]
    consensus = evaluate_consensus(run_dir, episodes=eval_episodes)
    return {
        "seed": seed,
        "command": " ".join(["gossiprl"] + command[3:]),
        # ran in more than one session: its stop rule saw only the last one's episodes, so its frames to
        # solve are not one session's (and its wall-clock holds a session that may have left no checkpoint)
        "resumed": summary["wall_seconds"] > summary["session_wall_seconds"],
        "stopped_by": summary["stopped_by"],
        "solved_pooled": summary["stopped_by"].startswith("solved"),
        "solved_every_agent": min(own) >= THRESHOLD,
        "frames": summary["frames"],
        "wall_s": summary["wall_seconds"],
        "pooled_last100": summary["mean_return"],
        "per_agent_last100": own,
        "consensus_eval": consensus["mean"],
        "consensus_solved": consensus["mean"] >= THRESHOLD,
        "eval_episodes": eval_episodes,
    }


def _ended(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` ended as the README's command ends: not cut by a stop, no agent
    failed (its summary then says so). One without a summary never started, or was killed."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        return summary["stopped_by"] != "interrupted" and not summary["failed"]
    except (OSError, ValueError, KeyError):
        return False


def _run(command: list[str], run_dir: Path, seed: int) -> None:
    """Run ``command``, going on from the run's checkpoints where an earlier window left some.

    The run is a session of its own, so Ctrl-C reaches only this process; whatever ends this process's
    wait (Ctrl-C, SIGTERM, an error) passes on one SIGTERM and waits while the agents checkpoint
    (subprocess.run would kill the run 0.25 s after Ctrl-C), so no run is left training behind us."""
    resume = (run_dir / "config.json").exists()
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    run = subprocess.Popen(
        command + (["--resume"] if resume else []), stdout=subprocess.DEVNULL, start_new_session=True
    )
    try:
        code = run.wait()
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            try:
                run.wait(RUN_STOP_S)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
    if code:
        raise click.ClickException(f"seed {seed}: `{shlex.join(command)}` exited {code}")


if __name__ == "__main__":
    main()
