"""The launcher's swarm-level TensorBoard run (and its W&B mirror), from a real two-agent swarm."""

import json

import pytest

from gossiprl.rl.a2c import ATARI_LR
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
    assert scalars["swarm/agents_left"][-1] == 2 and set(scalars["swarm/agents_lost"]) == {0}  # a clean finish
    for rank in (0, 1):  # each agent's own, which W&B shows too (it mirrors this run, not the agents')
        assert scalars[f"agent-{rank}/return"][-1] > 0 and scalars[f"agent-{rank}/data_plane_bytes"][-1] > 0
    assert hparams["swarm.topology"] == "ring" and hparams["swarm.agents"] == 2
    # config.json's agent section keeps "the env's default" (null) and records what that was for this
    # run; the hparams show the rate the agents ran at
    recorded = json.loads((swarm_run / "config.json").read_text())
    assert recorded["agent"]["a2c"]["lr"] is None and recorded["learned_with"]["a2c"]["lr"] == pytest.approx(ATARI_LR)
    assert hparams["agent.a2c.lr"] == pytest.approx(ATARI_LR) and hparams["agent.a2c.entropy_coef"] == 0.0
    assert scalars["hparam/frames"][-1] >= 40000


def test_each_agents_figures_and_how_it_left_are_logged_beside_the_spread(tmp_path):
    """W&B mirrors only the swarm's run, which held the spread over agents and no agent's own
    figures; and an agent that left with BYE at a clean finish was counted in swarm/agents_gone."""
    import topologies
    from brokers import close_broker, new_broker
    from gossiprl.rl.swarmlog import SwarmLog

    broker = new_broker(topologies.make("ring", 3))
    stats = broker.stats()
    assert close_broker(broker)
    for rank, agent in stats["agents"].items():
        agent.update(publish_wait_s=0.5 * rank, collect_wait_s=0.25, bytes_in=1000 * (rank + 1), bytes_out=10)
    stats["agents"][0].update(gone=True, said_bye=True)  # finished and said goodbye
    stats["agents"][1].update(gone=True, said_bye=False)  # crashed, or silent past the peer timeout
    log = SwarmLog(tmp_path, {"swarm": {"agents": 3}})
    for rank, returns, distance in ((0, [10.0, 20.0], 0.5), (1, [40.0], 0.25), (2, [], None)):
        log.add(rank, {"frames": 100, "returns": returns, "consensus_distance": distance})
    log.write(stats, force=True)
    log.close({})
    scalars, _ = read_events(tmp_path / "swarm")
    assert {tag: values[-1] for tag, values in scalars.items() if tag.startswith("agent-")} == {
        "agent-0/return": 15.0,
        "agent-1/return": 40.0,
        "agent-0/consensus_distance": 0.5,
        "agent-1/consensus_distance": 0.25,
        "agent-0/lock_wait_s": 0.25,
        "agent-1/lock_wait_s": 0.75,
        "agent-2/lock_wait_s": 1.25,
        "agent-0/data_plane_bytes": 1010,
        "agent-1/data_plane_bytes": 2010,
        "agent-2/data_plane_bytes": 3010,
    }
    assert scalars["swarm/agents_left"] == [1] and scalars["swarm/agents_lost"] == [1]
    assert scalars["swarm/return_min"] == [15.0] and scalars["swarm/lock_wait_s_max"] == [1.25]


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
