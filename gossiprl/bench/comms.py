"""`gossiprl bench comms`: what one gossip round costs, next to the floors and the paper's path.

Every path moves the same bytes in the same two patterns, measured in one run so the ratios
are fair even on a noisy machine:

- one way: two agents play ping-pong, one parameter set in flight at a time; half the round
  trip is what one transfer costs, with nothing else competing for the cores;
- ring round: n agent processes on a directed ring, each round every agent sends its
  parameter set and receives its in-peer's, all at once (the load of a real swarm).

The paths:

- memcpy: copying the parameter set once in memory (the floor of any exchange);
- raw relay: a bare ZeroMQ ROUTER forwarding raw frames i -> i+1 (no protocol, no locks);
- gossiprl: publish + collect through the Broker with sync turn locks;
- paper: PALA's path, a multiprocessing Manager ListProxy holding pickle+base64 strings, with the
  turn locks as boolean flags polled through the proxy.
"""

from __future__ import annotations

import base64
import multiprocessing as mp
import os
import pickle
import statistics
import tempfile
import threading
import time

import numpy as np
import zmq

import topologies

from ..comms.broker import Broker
from ..comms.client import GossipClient
from ..settings import NATURE_CNN_PARAMS

COLD_BYTES = 128 << 20
"""Bytes the cold mix benchmark rotates over: several times any L3 cache, so no call finds its data there."""


def _payload(numel: int, rank: int) -> np.ndarray:
    return np.full(numel, float(rank), dtype=np.float32)


def _round_times(step, rounds: int, warmup: int) -> list[float]:
    times = []
    for r in range(warmup + rounds):
        t0 = time.perf_counter()
        step(r)
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------- agents (run in child processes)


def _gossiprl_agent(address, rank, numel, rounds, warmup, codec, pingpong, out):
    x = _payload(numel, rank)
    with GossipClient(address, rank, codec=codec) as client:
        if not pingpong:

            def step(_):
                client.exchange({"params": x})
        elif rank == 0:

            def step(_):
                client.publish({"params": x})
                client.collect()
        else:

            def step(_):
                client.collect()
                client.publish({"params": x})

        out.put((rank, _round_times(step, rounds, warmup)))


def _relay_agent(address, rank, numel, rounds, warmup, pingpong, out):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, str(rank).encode())
    sock.connect(address)
    sock.send(b"ready")
    sock.recv()  # the relay says go once all are connected
    x = _payload(numel, rank)

    def send():
        sock.send(x, copy=False)

    def receive():
        np.frombuffer(sock.recv(copy=False).buffer, np.float32)

    order = (send, receive) if rank == 0 or not pingpong else (receive, send)
    out.put((rank, _round_times(lambda _: [f() for f in order], rounds, warmup)))
    # In a ring, receiving says nothing about our own last send: let ZeroMQ finish it while
    # ``x`` is alive, or the interpreter's exit frees it under the sender (EFAULT, abort).
    sock.close(linger=5000)
    zmq.Context.instance().term()


def _paper_agent(slots, flags, n, rank, numel, rounds, warmup, pingpong, out):
    """PALA's exchange: flags[i] is True while agent i's letter waits unread in slots[i]."""
    x = _payload(numel, rank)
    peer = (rank - 1) % n

    def send():
        while flags[rank]:  # my previous letter is unread: spin (one proxy round trip per poll)
            pass
        slots[rank] = base64.b64encode(pickle.dumps(x))
        flags[rank] = True

    def receive():
        while not flags[peer]:
            pass
        m = pickle.loads(base64.b64decode(slots[peer]))  # noqa: S301 -- this is the path we measure against
        flags[peer] = False
        if m.shape != x.shape:
            raise RuntimeError("paper path delivered a parameter set of the wrong shape")

    order = (send, receive) if rank == 0 or not pingpong else (receive, send)
    out.put((rank, _round_times(lambda _: [f() for f in order], rounds, warmup)))


# ---------------------------------------------------------------- harness


def _run_agents(ctx, target, args_for, n) -> float:
    """Start n agents, gather their per-round times, return the median round time (seconds)."""
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(r), out), name=f"bench-agent-{r}") for r in range(n)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=600) for _ in range(n)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return statistics.median(t for _, times in results for t in times)


def _relay(sock: zmq.Socket, n: int, stop: threading.Event) -> None:
    ready = [sock.recv_multipart()[0] for _ in range(n)]
    for ident in ready:
        sock.send_multipart([ident, b"go"])
    while not stop.is_set():
        if sock.poll(100):
            ident, frame = sock.recv_multipart(copy=False)
            dst = str((int(ident.bytes) + 1) % n).encode()
            sock.send_multipart([dst, frame], copy=False)


def _endpoint(transport: str, tmp: str, name: str) -> str:
    return f"ipc://{tmp}/{name}" if transport == "ipc" else "tcp://127.0.0.1:0"


def measure_memcpy(numel: int, repeats: int = 50) -> float:
    src, dst = _payload(numel, 1), np.empty(numel, np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_relay(
    n: int, numel: int, rounds: int, warmup: int, transport: str = "tcp", pingpong: bool = False
) -> float:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(_endpoint(transport, tmp, "relay").replace(":0", ":*"))
        address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        stop = threading.Event()
        relay = threading.Thread(target=_relay, args=(sock, n, stop), daemon=True)
        relay.start()
        try:
            return _run_agents(ctx, _relay_agent, lambda r: (address, r, numel, rounds, warmup, pingpong), n)
        finally:
            stop.set()
            relay.join()
            sock.close()


def measure_gossiprl(
    n: int, numel: int, rounds: int, warmup: int, transport: str = "tcp", codec: str = "raw", pingpong: bool = False
) -> float:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        with Broker(topologies.make("ring", n), bind=_endpoint(transport, tmp, "broker")).start() as broker:
            return _run_agents(
                ctx, _gossiprl_agent, lambda r: (broker.address, r, numel, rounds, warmup, codec, pingpong), n
            )


def measure_paper(n: int, numel: int, rounds: int, warmup: int, pingpong: bool = False) -> float:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        slots, flags = manager.list([b""] * n), manager.list([False] * n)
        return _run_agents(ctx, _paper_agent, lambda r: (slots, flags, n, r, numel, rounds, warmup, pingpong), n)


def run(
    agents=(2, 4, 8, 16),
    numel: int = NATURE_CNN_PARAMS,
    rounds: int = 30,
    warmup: int = 3,
    transport: str = "tcp",
    paper_rounds: int = 10,
    echo=print,
) -> dict:
    """The whole comparison; returns a JSON-able dict and echoes a table as it goes."""
    mb = numel * 4 / 1e6
    echo(
        f"payload {numel:,} float32 = {mb:.2f} MB, transport {transport}, {os.cpu_count()} cores, "
        f"median of {rounds} rounds per agent ({paper_rounds} on the paper's path)"
    )
    result = {
        "payload_mb": mb,
        "transport": transport,
        "rounds": rounds,
        "cores": os.cpu_count(),
        "memcpy_ms": measure_memcpy(numel) * 1e3,
    }
    one_way = {
        "relay_ms": lambda: measure_relay(2, numel, rounds, warmup, transport, pingpong=True),
        "gossiprl_ms": lambda: measure_gossiprl(2, numel, rounds, warmup, transport, pingpong=True),
        "gossiprl_bf16_ms": lambda: measure_gossiprl(2, numel, rounds, warmup, transport, "bf16", pingpong=True),
        "paper_ms": lambda: measure_paper(2, numel, paper_rounds, 1, pingpong=True),
    }
    labels = {
        "relay_ms": "raw ZeroMQ ROUTER relay",
        "gossiprl_ms": "gossiprl publish -> collect",
        "gossiprl_bf16_ms": "gossiprl with --codec bf16",
        "paper_ms": "PALA paper: ListProxy+pickle+base64",
    }
    result["mix"] = measure_mix(numel)
    echo(
        f"mix of one letter {result['mix']['mix_ms']:.2f} ms, plain axpy {result['mix']['axpy_ms']:.2f} ms: "
        f"{result['mix']['ratio']:.2f}x (target <= 2x)"
    )
    echo("one way (ping-pong of 2 agents, half the round trip):")
    echo(f"  {'memcpy (floor)':38s} {result['memcpy_ms']:8.2f} ms")
    result["one_way"] = {}
    for key, measure in one_way.items():
        result["one_way"][key] = measure() / 2 * 1e3
        echo(f"  {labels[key]:38s} {result['one_way'][key]:8.2f} ms")
    ow = result["one_way"]
    ow["gossiprl_over_relay"] = ow["gossiprl_ms"] / ow["relay_ms"]
    ow["paper_over_gossiprl"] = ow["paper_ms"] / ow["gossiprl_ms"]
    echo(
        f"  gossiprl / raw relay = {ow['gossiprl_over_relay']:.2f}x (target <= 1.3x);  "
        f"paper / gossiprl = {ow['paper_over_gossiprl']:.1f}x (target >= 15x)"
    )

    echo("ring round (every agent publishes and collects at once):")
    echo("  agents  relay ms/round  gossiprl ms/round  gossiprl/relay  paper ms/round  paper/gossiprl")
    result["ring"] = []
    for n in agents:
        row = {
            "agents": n,
            "relay_ms": measure_relay(n, numel, rounds, warmup, transport) * 1e3,
            "gossiprl_ms": measure_gossiprl(n, numel, rounds, warmup, transport) * 1e3,
        }
        row["ratio"] = row["gossiprl_ms"] / row["relay_ms"]
        line = f"  {n:6d}  {row['relay_ms']:14.2f}  {row['gossiprl_ms']:16.2f}  {row['ratio']:13.2f}x"
        if n == 2:  # the paper's spin-polled flags swamp a small machine beyond two agents
            row["paper_ms"] = measure_paper(2, numel, paper_rounds, 1) * 1e3
            row["paper_over_gossiprl"] = row["paper_ms"] / row["gossiprl_ms"]
            line += f"  {row['paper_ms']:14.2f}  {row['paper_over_gossiprl']:13.1f}x"
        result["ring"].append(row)
        echo(line)
    return result


def measure_mix(
    numel: int = NATURE_CNN_PARAMS,
    reps: int = 50,
    torch_tensor: bool = False,
    cold: bool = False,
    clock=time.perf_counter,
) -> dict:
    """Median seconds of mix() of one letter against a plain axpy (x += m; x *= 0.5) over the same bytes.

    The two are timed alternately in one loop, so both see the same cache and load; the mix is
    the one an agent runs (deviation bound on), on a numpy array or, with ``torch_tensor``, on
    the CPU torch tensor the agent trains. Before each mix the parameters take a small step of
    their own, untimed, as an agent's update moves them (the bound's drift cap measures it; a
    still agent would time the cap's cut-back sweep instead). Hot, both work on one pair of arrays
    that stays in the CPU's caches; ``cold`` rotates over pairs filling COLD_BYTES, so each call
    meets its bytes in main memory, as an agent meets a letter that has just arrived. ``clock``:
    time.thread_time counts only this thread's CPU time, which a loaded host's preemption does not inflate.
    """
    from ..comms.gossip import DeviationBound, mix

    rng = np.random.default_rng(0)
    count = max(2, -(-COLD_BYTES // (8 * numel)) // 2 * 2) if cold else 1
    pairs = []
    for _ in range(count):
        x = rng.standard_normal(numel, dtype=np.float32)
        pairs.append((x, x + rng.standard_normal(numel, dtype=np.float32) * 1e-3))
    if torch_tensor:
        import torch

        as_own = torch.from_numpy  # the agent's tensor: a view on the same bytes the axpy gets
    else:
        as_own = np.asarray
    bound = DeviationBound()
    update = rng.standard_normal(numel, dtype=np.float32) * 1e-4
    mix_s, axpy_s = [], []
    for i in range(reps + 3):
        own, letter = pairs[(2 * i) % count]
        own += update
        own = as_own(own)
        x, m = pairs[(2 * i + 1) % count]
        t0 = clock()
        mix({"p": own}, {1: {"p": letter}}, {0: 0.5, 1: 0.5}, 0, bound=bound)
        t1 = clock()
        x += m
        x *= 0.5
        t2 = clock()
        mix_s.append(t1 - t0)
        axpy_s.append(t2 - t1)
    mix_t, axpy_t = statistics.median(mix_s[3:]), statistics.median(axpy_s[3:])
    return {"mix_ms": mix_t * 1e3, "axpy_ms": axpy_t * 1e3, "ratio": mix_t / axpy_t}
