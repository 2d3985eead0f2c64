"""The baseline `gossiprl bench train` holds the agent loop to: a minimal A2C loop, written by hand.

It does the agent's work and nothing else: the same vector env (gymnasium's sync vector env in
same-step autoreset, or ALE's C++ one), the same network, 16 envs x 5 steps, n-step returns,
the same loss, RMSProp and the gradient clip. It keeps no episode scores, logs, checkpoints or
truncation bootstraps and has no gossip hook, so its rate is the honest ceiling of a torch A2C
loop on this env, and the agent's rate over it says what our bookkeeping costs.
"""

from __future__ import annotations

import queue
import time

import numpy as np
import torch
from torch import nn

from ..rl.envs import make_env
from ..rl.models import make_model


def lean_a2c_fps(
    env_id: str,
    seconds: float,
    num_envs: int = 16,
    n_steps: int = 5,
    seed: int = 0,
    threads: int = 1,
    barrier=None,
    batched: bool = True,
) -> dict:
    """Frames/s of the minimal loop over ``seconds`` of training (after 3 warm-up updates), and the
    CPU milliseconds it spent per frame (this process's CPU time: a busy host does not inflate it).

    ``barrier`` holds the clock until every loop sharing it has warmed up, so loops run
    side by side are timed over the same window. ``batched``: ``make_env``'s.
    """
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    envs = make_env(env_id, num_envs, seed, num_threads=1, batched=batched)
    model = make_model(envs.observation_space, envs.action_space)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=7e-4, alpha=0.99, eps=1e-5)
    obs = torch.from_numpy(envs.reset())
    obs_buf = torch.zeros((n_steps + 1, *obs.shape), dtype=obs.dtype)
    actions = torch.zeros((n_steps, num_envs), dtype=torch.long)
    rewards = torch.zeros((n_steps, num_envs))
    dones = torch.zeros((n_steps, num_envs))
    obs_buf[0] = obs
    updates, start, cpu = -3, float("inf"), 0.0  # the clocks start after three warm-up updates
    while updates < 0 or time.perf_counter() - start < seconds:
        for t in range(n_steps):
            with torch.inference_mode():
                logits, _ = model(obs_buf[t])
                actions[t] = (logits - torch.empty_like(logits).exponential_().log()).argmax(-1)  # Gumbel-max
            next_obs, r, d, _ = envs.step(actions[t].numpy())
            obs_buf[t + 1] = torch.from_numpy(next_obs)
            rewards[t] = torch.from_numpy(np.asarray(r, dtype=np.float32))
            dones[t] = torch.from_numpy(d.astype(np.float32))
        logits, values = model(obs_buf.flatten(0, 1))
        values = values.view(n_steps + 1, num_envs)
        returns = torch.empty_like(rewards)
        running = values[-1].detach()
        for t in reversed(range(n_steps)):
            running = rewards[t] + 0.99 * running * (1 - dones[t])
            returns[t] = running
        log_probs = torch.log_softmax(logits[: n_steps * num_envs], -1)
        advantages = returns.flatten() - values[:-1].flatten()
        taken = log_probs.gather(1, actions.flatten().unsqueeze(1)).squeeze(1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        loss = -(advantages.detach() * taken).mean() + 0.5 * advantages.pow(2).mean() - 0.01 * entropy
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        obs_buf[0] = obs_buf[-1]
        updates += 1
        if updates == 0:
            if barrier is not None:
                barrier.wait()
            start, cpu = time.perf_counter(), time.process_time()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    envs.close()
    frames = updates * n_steps * num_envs * envs.frames_per_step
    return {"fps": frames / elapsed, "cpu_ms_per_frame": 1000 * cpu / frames}


def _lean_child(args, barrier, out) -> None:
    out.put(lean_a2c_fps(*args, barrier=barrier))


def side_by_side_fps(env_id: str, seconds: float, n: int, num_envs: int = 16, n_steps: int = 5) -> dict:
    """Summed frames/s of ``n`` minimal loops, each its own process, timed over the same window,
    and their mean CPU milliseconds per frame.

    The ceiling of a swarm of ``n`` on this host: what its cores (and memory) give ``n`` independent
    learners that never talk. A ring's rate over this one is what gossip costs, apart from the host.
    The loops start as agents do (``launch.agent_context``): on Linux forked from a server that
    imported torch, so each does not import it again (spawned, the pair took 26 s to start on a
    loaded 2-core VM for a 1 s row).
    """
    from ..launch import agent_context

    ctx = agent_context()
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=_lean_child, args=((env_id, seconds, num_envs, n_steps, seed), barrier, out))
        for seed in range(n)
    ]
    for p in procs:
        p.start()
    try:
        loops = [out.get(timeout=seconds + 120) for _ in procs]
        return {
            "fps": sum(loop["fps"] for loop in loops),
            "cpu_ms_per_frame": float(np.mean([loop["cpu_ms_per_frame"] for loop in loops])),
        }
    except queue.Empty:
        codes = [p.exitcode for p in procs]
        raise RuntimeError(f"{n} minimal loops side by side: not every one reported (exit codes {codes})") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
