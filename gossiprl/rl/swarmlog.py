"""The swarm as one TensorBoard run: ``RUN_DIR/swarm/``, beside each agent's own ``agent-<rank>/``.

Per-agent curves show one learner; the question a swarm raises is how far apart its agents
are (the worst agent, not the mean, says whether gossip carried everyone), so each figure is
logged as mean, min and max over agents: the return (each agent's own last 100 episodes), the
consensus distance (each agent's distance to its neighbours' parameters, from its gossip),
lock wait and data-plane bytes (the broker's counters). Each agent's own figures go in too, as
``agent-<rank>/...``: W&B mirrors this one run, not the agents' own (their writers live in other
processes), so without them it showed the spread but never which agent lagged. Agents that left
with BYE (``swarm/agents_left``: every agent at a clean finish) are counted apart from those the
broker lost without one (``swarm/agents_lost``: crashed, killed, or silent past the peer timeout).
The run's configuration goes in as TensorBoard hyperparameters with the final figures, so runs can
be compared in the HPARAMS tab. ``track`` mirrors it to Weights & Biases as CleanRL does (wandb's
TensorBoard sync).
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

SWARM_LOG_EVERY_S = 5.0
"""Seconds between swarm points: the broker's counters are cumulative, so a point every few
seconds draws the curves without adding a stats snapshot to every agent report."""


class SwarmLog:
    """Fed with the agents' progress reports and the broker's stats by the launcher."""

    def __init__(self, run_dir: Path, config: dict, track: dict | None = None):
        self.hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in _flatten(config).items()}
        self.wandb = None
        if track is not None:
            import wandb

            # sync_tensorboard=True as CleanRL, with the root named: wandb otherwise guesses it from
            # the first writer and cannot place the hparams writer's file beside it
            (Path(run_dir) / "swarm").mkdir(parents=True, exist_ok=True)
            wandb.tensorboard.patch(root_logdir=str(Path(run_dir) / "swarm"))
            self.wandb = wandb.init(
                project=track.get("project") or "gossiprl",
                entity=track.get("entity"),
                name=Path(run_dir).name,
                config=config,
                dir=str(run_dir),
            )
        self.writer = SummaryWriter(str(Path(run_dir) / "swarm"))
        self.frames: dict[int, int] = {}
        self.returns: dict[int, deque] = {}
        self.distance: dict[int, float] = {}
        self.last_write = -math.inf
        self.start = time.perf_counter()

    def add(self, rank: int, report: dict) -> None:
        self.frames[rank] = report["frames"]
        self.returns.setdefault(rank, deque(maxlen=100)).extend(report["returns"])
        distance = report.get("consensus_distance")
        if distance is not None and math.isfinite(distance):
            self.distance[rank] = distance

    def write(self, broker_stats: dict | None, force: bool = False) -> None:
        """A point at the swarm's total frames, at most every SWARM_LOG_EVERY_S unless ``force``."""
        now = time.perf_counter()
        if not self.frames or not (force or now - self.last_write >= SWARM_LOG_EVERY_S):
            return
        self.last_write = now
        step = sum(self.frames.values())
        figures = {"return": {r: sum(own) / len(own) for r, own in self.returns.items() if own}}
        figures["consensus_distance"] = self.distance
        if broker_stats is not None:
            agents = {int(rank): a for rank, a in broker_stats["agents"].items()}
            figures["lock_wait_s"] = {r: a["publish_wait_s"] + a["collect_wait_s"] for r, a in agents.items()}
            figures["data_plane_bytes"] = {r: a["bytes_in"] + a["bytes_out"] for r, a in agents.items()}
            lost = sum(a["gone"] and not a["said_bye"] for a in agents.values())
            self.writer.add_scalar("swarm/agents_left", sum(a["said_bye"] for a in agents.values()), step)
            self.writer.add_scalar("swarm/agents_lost", lost, step)
        for name, by_rank in figures.items():
            self._spread(f"swarm/{name}", list(by_rank.values()), step)
            for rank, value in sorted(by_rank.items()):
                self.writer.add_scalar(f"agent-{rank}/{name}", value, step)
        self.writer.add_scalar("swarm/frames_per_s", step / max(now - self.start, 1e-9), step)

    def _spread(self, name: str, values: list[float], step: int) -> None:
        if values:
            self.writer.add_scalar(f"{name}_mean", sum(values) / len(values), step)
            self.writer.add_scalar(f"{name}_min", min(values), step)
            self.writer.add_scalar(f"{name}_max", max(values), step)

    def close(self, summary: dict) -> None:
        """The hyperparameters with the run's final figures, written once at the end."""
        metrics = {
            f"hparam/{k}": float(summary[k])
            for k in ("mean_return", "frames", "wall_seconds", "fps")
            if isinstance(summary.get(k), (int, float)) and math.isfinite(summary[k])
        }
        self.writer.add_hparams(self.hparams, metrics, run_name=".")
        self.writer.close()
        if self.wandb is not None:
            import wandb

            self.wandb.finish()
            wandb.tensorboard.unpatch()  # the patch is process-wide: later writers are not this run's


def _flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
