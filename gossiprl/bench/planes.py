"""Ring rounds of each data plane next to the peers a reader would reach for instead.

Every agent is a process; each round it sends its parameter set to its ring successor, receives
its predecessor's, and mixes it in. A round's cost is the slowest agent's time for that round
(the ring moves at its pace); the figure is the median over rounds. All rows run in the same
invocation, one after the other, so they share whatever else the machine is doing.

The peers, written here in their simplest honest form:

- GALA-style: each agent's letter in a shared-memory buffer, a pair of semaphores per agent
  (letter full / letter read), mix ``x += m; x *= 0.5`` straight from the buffer;
- gloo ring: ``torch.distributed`` isend to the successor, recv from the predecessor, same mix;
- gloo all_reduce: the whole swarm averaged at once (not gossip: the collective baseline).

The gossiprl rows time ``GossipClient.exchange`` plus ``gossip.mix`` (which also checks every
value is finite and measures the consensus distance), through a Broker in the parent process;
"shm, axpy mix" mixes with GALA's plain ``x += m; x *= 0.5`` instead: the same work as the
GALA-style row, so the two tell the transport's cost apart from the mixing's.

Each row also counts CPU per round: every agent's process CPU over its timed rounds, plus the
parent's (the broker's thread and its ZeroMQ I/O threads; nothing for the peers) between the
moment the last agent finished its warm-up and the moment the last one finished, over the
rounds. A busy host stretches wall-clock rounds by whatever else runs; it does not stretch CPU
seconds, so the CPU ratio is the one that compares planes on a loaded machine (blocked waits
cost none, so it counts the work a round does, not its latency).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import time
from multiprocessing import shared_memory

import numpy as np

import topologies

from ..comms.broker import Broker
from ..settings import NATURE_CNN_PARAMS

ROWS = ("gala_shm", "gloo_ring", "gloo_allreduce", "broker", "shm", "direct", "shm_axpy")
LABELS = {
    "gala_shm": "GALA-style shm+semaphores",
    "gloo_ring": "gloo ring send/recv",
    "gloo_allreduce": "gloo all_reduce",
    "broker": "gossiprl broker relay",
    "shm": "gossiprl shm",
    "direct": "gossiprl direct",
    "shm_axpy": "gossiprl shm, axpy mix",
}


def _times(step, rounds: int, warmup: int, rank: int, out) -> None:
    """Run the rounds; tell the parent when the warm-up is over, then the timed rounds' wall times
    and the process CPU seconds they took."""
    times = []
    for _ in range(warmup):
        step()
    out.put(("warm", rank, None))
    cpu0 = time.process_time()
    for _ in range(rounds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    out.put(("done", rank, (times, time.process_time() - cpu0)))


def _x(numel: int, rank: int) -> np.ndarray:
    return np.full(numel, float(rank), np.float32)


# ---------------------------------------------------------------- agents (child processes)


def _gala_agent(names, full, read, n, rank, numel, rounds, warmup, out):
    segs = [shared_memory.SharedMemory(name) for name in names]
    try:
        mine = np.ndarray(numel, np.float32, segs[rank].buf)
        theirs = np.ndarray(numel, np.float32, segs[(rank - 1) % n].buf)
        x, peer = _x(numel, rank), (rank - 1) % n

        def step():
            read[rank].acquire()  # my last letter was read
            np.copyto(mine, x)
            full[rank].release()
            full[peer].acquire()
            x.__iadd__(theirs)
            x.__imul__(0.5)
            read[peer].release()

        _times(step, rounds, warmup, rank, out)
        mine = theirs = None  # the segments cannot close while views of them live
    finally:
        for s in segs:
            s.close()


def _gloo_agent(store, n, rank, numel, rounds, warmup, allreduce, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    x = torch.from_numpy(_x(numel, rank))
    buf = torch.empty_like(x)

    def ring():
        send = dist.isend(x, (rank + 1) % n)
        dist.recv(buf, (rank - 1) % n)
        send.wait()
        x.add_(buf).mul_(0.5)

    def allreduce_step():
        dist.all_reduce(x)
        x.div_(n)

    try:
        _times(allreduce_step if allreduce else ring, rounds, warmup, rank, out)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _gossiprl_agent(address, rank, numel, rounds, warmup, plain_mix, out):
    from ..comms.client import GossipClient
    from ..comms.gossip import mix

    x = _x(numel, rank)
    with GossipClient(address, rank, timeout=120) as client:

        def step():
            letters = client.exchange({"params": x})
            if plain_mix:
                for letter in letters.values():
                    x.__iadd__(letter["params"])
                    x.__imul__(0.5)
            else:
                mix({"params": x}, letters, client.last_weights, rank)

        _times(step, rounds, warmup, rank, out)
        if client.plane_counts.get("torn"):
            raise RuntimeError("a letter was overwritten while it was mixed")


# ---------------------------------------------------------------- harness


def _slowest_median(ctx, target, args_for, n, rounds: int, timeout: float = 600) -> tuple[float, float]:
    """Run n agents: the median over rounds of the slowest agent's round (seconds), and the CPU
    seconds per round of every process together (see the module docstring)."""
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(r), out), name=f"bench-agent-{r}") for r in range(n)]
    for p in procs:
        p.start()
    results, warm, parent_cpu = {}, 0, 0.0
    try:
        while len(results) < n:
            what, rank, figures = out.get(timeout=timeout)
            if what == "warm":
                warm += 1
                if warm == n:
                    parent_cpu = -time.process_time()
            else:
                results[rank] = figures
        parent_cpu += time.process_time()
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    wall = statistics.median(max(times) for times in zip(*(times for times, _ in results.values())))
    return wall, (sum(cpu for _, cpu in results.values()) + parent_cpu) / rounds


def measure(row: str, n: int, numel: int = NATURE_CNN_PARAMS, rounds: int = 30, warmup: int = 3) -> tuple[float, float]:
    """One row of the table: the median slowest-agent ring round and the CPU per round, in seconds."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gossiprl-bench-") as tmp:
        if row == "gala_shm":
            segs = [shared_memory.SharedMemory(create=True, size=numel * 4) for _ in range(n)]
            try:
                full = [ctx.Semaphore(0) for _ in range(n)]
                read = [ctx.Semaphore(1) for _ in range(n)]
                names = [s.name for s in segs]
                return _slowest_median(
                    ctx, _gala_agent, lambda r: (names, full, read, n, r, numel, rounds, warmup), n, rounds
                )
            finally:
                for s in segs:
                    s.close()
                    s.unlink()
        if row in ("gloo_ring", "gloo_allreduce"):
            store = os.path.join(tmp, "store")
            return _slowest_median(
                ctx, _gloo_agent, lambda r: (store, n, r, numel, rounds, warmup, row == "gloo_allreduce"), n, rounds
            )
        plane = row.removesuffix("_axpy")
        with Broker(topologies.make("ring", n), bind=f"ipc://{tmp}/broker", data_plane=plane).start() as broker:
            return _slowest_median(
                ctx, _gossiprl_agent, lambda r: (broker.address, r, numel, rounds, warmup, plane != row), n, rounds
            )


def run(
    agents=(2, 4, 8, 16), numel: int = NATURE_CNN_PARAMS, rounds: int = 30, warmup: int = 3, rows=ROWS, echo=print
) -> list[dict]:
    """The side-by-side table; returns its rows (milliseconds: ``row`` wall-clock, ``row_cpu`` CPU
    per round) and echoes them as they come."""
    echo(
        f"ring round, exchange + mix, {numel:,} float32 = {numel * 4 / 1e6:.2f} MB per letter, every agent a "
        f"process, {os.cpu_count()} cores; median over {rounds} rounds of the slowest agent, and below it "
        "the CPU per round of every process together"
    )
    ratios = [
        (key, label, x, y)
        for key, label, x, y in (
            ("shm_over_gala", "shm/GALA", "shm", "gala_shm"),
            ("shm_over_gloo_ring", "shm/gloo-ring", "shm", "gloo_ring"),
            ("shm_axpy_over_gala", "shm axpy/GALA", "shm_axpy", "gala_shm"),
        )
        if {x, y} <= set(rows)
    ]
    echo("  agents       " + "  ".join(f"{LABELS[r]:>26s}" for r in rows) + "".join(f"  {r[1]:>13s}" for r in ratios))
    table = []
    for n in agents:
        line = {"agents": n}
        for row in rows:
            wall, cpu = measure(row, n, numel, rounds, warmup)
            line[row], line[f"{row}_cpu"] = wall * 1e3, cpu * 1e3
        for clock, label in (("", f"{n:6d} wall"), ("_cpu", "        CPU ")):
            for key, _, x, y in ratios:
                line[key + clock] = line[x + clock] / line[y + clock]
            echo(
                f"  {label} "
                + "  ".join(f"{line[r + clock]:23.2f} ms" for r in rows)
                + "".join(f"  {line[key + clock]:12.2f}x" for key, *_ in ratios)
            )
        table.append(line)
    return table
