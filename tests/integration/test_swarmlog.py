"""The launcher's swarm-level TensorBoard run (and its W&B mirror), from a real two-agent swarm."""

import json

import pytest

from helpers import wait_for


def read_events(directory):
    """(scalar tags -> values, hparams plugin session-start info) from every event file under ``directory``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    scalars, hparams = {}, {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    if data.HasField("session_start_info"):
                        hparams = {
                            k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                            for k, v in data.session_start_info.hparams.items()
                        }
                elif value.HasField("tensor") or value.HasField("simple_value"):
                    number = value.simple_value if value.HasField("simple_value") else value.tensor.float_val[0]
                    scalars.setdefault(value.tag, []).append(number)
    return scalars, hparams


def test_swarm_run_logs_spread_over_agents_with_hparams(swarm_run):
    scalars, hparams = read_events(swarm_run / "swarm")
    for name in ("return", "consensus_distance", "lock_wait_s", "data_plane_bytes"):
        low, mean, high = (scalars[f"swarm/{name}_{k}"][-1] for k in ("min", "mean", "max"))
        assert low <= mean <= high, name
    assert scalars["swarm/consensus_distance_max"][-1] > 0
    assert scalars["swarm/data_plane_bytes_min"][-1] > 0
    assert scalars["swarm/agents_gone"][0] == 0  # and all have left by the last point
    assert hparams["swarm.topology"] == "ring" and hparams["swarm.agents"] == 2
    lr = json.loads((swarm_run / "config.json").read_text())["agent"]["a2c"]["lr"]
    assert hparams["agent.a2c.lr"] == pytest.approx(lr)
    assert scalars["hparam/frames"][-1] >= 40000


def test_track_mirrors_the_swarm_run_to_wandb_offline(swarm_run):
    pytest.importorskip("wandb", reason="the track extra (wandb) is not installed: pip install -e '.[track]'")
    (offline,) = (swarm_run / "wandb").glob("offline-run-*")
    (log,) = offline.glob("*.wandb")
    wait_for(  # wandb's service process may still be writing after finish() returns
        lambda: b"swarm/return_mean" in log.read_bytes() and b"gossiprl-test" in log.read_bytes(),
        60,
        "the swarm's scalars never reached the offline W&B run",
        every=0.5,
    )
    assert {p.name for p in (offline / "files").glob("events.out.tfevents.*")} == {
        p.name for p in (swarm_run / "swarm").glob("events.out.tfevents.*")
    }


def test_agents_of_a_cluster_swarm_print_progress_lines(tmp_path):
    import re
    import threading

    import topologies
    from gossiprl import Broker
    from gossiprl.launch import run_agent
    from gossiprl.rl.agent import AgentConfig

    lines, errors = [], []
    cfg = AgentConfig(env_id="CartPole-v1", total_frames=40000, torch_threads=1)  # a few seconds: several reports

    def agent(rank):
        try:
            run_agent(broker.address, rank, cfg, tmp_path, echo=lines.append, progress_every=0.5)
        except Exception as err:  # noqa: BLE001 (reported by the test)
            errors.append(err)

    with Broker(topologies.make("ring", 2)).start() as broker:
        threads = [threading.Thread(target=agent, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(100)
    assert not errors, errors
    pattern = re.compile(r"agent-(\d): ([\d,]+) frames, ([\d,]+) frames/s, return ([\d.]+), gossip (\d+)%")
    seen = {}
    for line in lines:
        m = pattern.fullmatch(line)
        assert m, line
        frames = int(m.group(2).replace(",", ""))
        assert frames > seen.get(m.group(1), 0) and int(m.group(3).replace(",", "")) > 0
        seen[m.group(1)] = frames
    assert set(seen) == {"0", "1"}, lines
