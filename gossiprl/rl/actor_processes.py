"""``--actor-placement process``: IMPALA's actors as processes of their own, on this host or others.

Each actor is one process that joins its learner over ZeroMQ (``gossiprl.comms.trajectories``):
it asks for a credit, fetches the newest parameters, acts one unroll with them and sends it, and
repeats until the learner says stop. ``run_actor`` is that loop, whoever started the process: the
learner itself (``ActorProcesses`` spawns ``actors_per_agent`` of them beside it, over a private
ipc:// socket) or a person on another host (`gossiprl actor --connect`, to a learner started with
``--actors-bind``). An actor knows only its env; the learner tells it the rest when it joins (its
envs' seed, the unroll's shape, gamma, the parameter count), so a remote actor cannot train with
settings its learner does not expect.

A process costs a network of its own, and its unrolls are copied through a socket, where a thread
hands over a reference; in exchange the actors run beside the learner instead of taking turns with
it for one interpreter, and can run on other hosts. On Linux the learner's actors fork from a
forkserver that imported torch and this module once (``actor_context``), so the import is not paid
once per actor.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from types import SimpleNamespace

import numpy as np
import torch
import zmq

from gossiprl.comms import keys
from gossiprl.comms.trajectories import (
    SILENCE_S,
    ActorEnd,
    ActorFailed,
    LearnerEnd,
    LearnerGone,
    LearnerLost,
    Trajectory,
    unroll_specs,
)
from gossiprl.rl.actors import unroll_arrays
from gossiprl.rl.envs import make_env
from gossiprl.rl.models import flatten_parameters, make_model
from gossiprl.rl.rollouts import Rollout, act

JOIN_S = 5.0
"""How long the learner waits for its actor processes to leave once told to stop, before it
terminates them."""
START_S = 600.0
"""How long the learner waits for its actor processes to start and join (with none of its own,
for the first actor from elsewhere)."""
LAST_WORD_S = 1.0
"""How long the learner waits, once an actor process has exited, for the FAILED it may have sent."""


def run_actor(
    endpoint: str,
    env_id: str,
    sticky_actions: float = 0.0,
    env_threads: int = 1,
    stop=None,
    curve: tuple | None = None,
    torch_threads: int = 1,
    routing_id: bytes | None = None,
    silence_s: float = SILENCE_S,
) -> tuple[int, str | None]:
    """Act for the learner at ``endpoint`` until it says stop (or ``stop`` is set); return the
    unrolls sent and the learner's reason to stop it (None when ``stop`` ended it), which a person
    running the actor needs to tell a learner that is done from one that dropped this actor. An
    error ends the actor, and is first sent to the learner in one line. A learner silent for
    ``silence_s`` after it answered the JOIN is lost (LearnerLost: start the actor again)."""
    torch.set_num_threads(torch_threads)
    link = ActorEnd(endpoint, curve, silence_s=silence_s, routing_id=routing_id)
    try:
        welcome = link.join(env_id, stop)
        envs = None
        try:
            envs = make_env(
                env_id, welcome["num_envs"], welcome["seed"], sticky_actions=sticky_actions, num_threads=env_threads
            )
            return _act(link, envs, welcome, stop), link.stopped
        except LearnerGone as err:  # after the JOIN was answered: lost, not refused
            raise LearnerLost(str(err)) from None
        except Exception as err:
            link.fail(f"{type(err).__name__}: {err}")
            raise
        finally:
            if envs is not None:
                envs.close()
    finally:
        link.close()


def _act(link: ActorEnd, envs, welcome: dict, stop) -> int:
    n_steps, num_envs = welcome["n_steps"], welcome["num_envs"]
    model = make_model(envs.observation_space, envs.action_space)
    flat = flatten_parameters(model)
    if flat.numel() != welcome["params"]:
        raise ValueError(f"this actor's network has {flat.numel()} parameters, its learner's {welcome['params']}")
    link.expect_params(flat.numel())
    own = flat.detach().numpy()  # the network's own memory: fetched parameters land in it
    gamma = SimpleNamespace(gamma=welcome["gamma"])  # what ``act`` needs to bootstrap a time limit's cut
    obs = torch.from_numpy(envs.reset())
    num_actions = int(envs.action_space.n)
    version, unrolls = -1, 0
    while link.wait_for_credit(stop):
        version = link.fetch(own, version, stop)
        if link.stopped is not None:
            break
        rollout = Rollout(n_steps, num_envs, obs.shape[1:], obs.dtype, torch.device("cpu"))
        rollout.obs[0].copy_(obs)
        logits = torch.empty((n_steps, num_envs, num_actions))
        act(model, envs, rollout, gamma, logits)
        obs = rollout.obs[-1]
        arrays = {name: tensor.numpy() for name, tensor in unroll_arrays(rollout, logits).items()}
        link.send_unroll(unrolls, version, arrays, envs.pop_episodes())
        unrolls += 1
    return unrolls


def actor_process(
    endpoint: str, env_id: str, sticky_actions: float, env_threads: int, routing_id: bytes, curve: tuple | None
) -> None:
    """Body of an actor process its learner spawned: ``run_actor`` until the learner says stop or
    is gone. An error was sent to the learner already, which reports it: exit 1 without a traceback."""
    # Ctrl-C, or a scheduler's SIGTERM to the whole job, reaches the learner too, which stops us: an actor
    # that died of it first would read to the learner as a failed one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop = threading.Event()
    threading.Thread(target=_watch_parent, args=(stop,), name="learner-watch", daemon=True).start()
    try:
        run_actor(endpoint, env_id, sticky_actions, env_threads, stop=stop, curve=curve, routing_id=routing_id)
    except LearnerGone:
        if not stop.is_set():
            raise
    except Exception:
        raise SystemExit(1) from None


def actor_context():
    """The context a learner starts its actor processes from: on Linux a forkserver that has
    imported this module (torch with it), so each actor forks ready instead of importing torch
    again (seconds of CPU each: a learner with 8 actors paid it 8 times); elsewhere spawn, as the
    agents do (launch.agent_context). Either way an actor starts from a process without the
    learner's threads and sockets. If this process's forkserver already runs (a test that also
    launched agents), it is used as it is: its preload only saves imports."""
    if not sys.platform.startswith("linux"):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["gossiprl.rl.forkserver", __name__])
    return ctx


def _watch_parent(stop: threading.Event) -> None:
    mp.connection.wait([mp.parent_process().sentinel])
    stop.set()


class ActorProcesses:
    """``--actor-placement process``: the learner's end of the channel and the ``actors_per_agent``
    actor processes it spawns; with ``--actors-bind``, actors from other hosts may join as well."""

    def __init__(self, cfg, hp, seed: int, env_threads: int):
        self.cfg, self.hp, self.seed = cfg, hp, seed
        probe = make_env(cfg.env_id, 1, seed, sticky_actions=cfg.sticky_actions, num_threads=1)
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        self.frames_per_step = probe.frames_per_step
        probe.close()
        self.env_threads = max(1, env_threads // max(1, hp.actors_per_agent))
        self.curve = (hp.actors_curve_secret, hp.actors_curve_allow) if hp.actors_curve_secret else None
        self.processes: list[mp.Process] = []
        self.private_dir: str | None = None
        self.end: LearnerEnd | None = None

    def start(self, flat_params: torch.Tensor, stop=None) -> None:
        bind = self.hp.actors_bind
        if bind is None:  # only this learner's own processes: a socket in a 0700 directory
            self.private_dir = tempfile.mkdtemp(prefix="gossiprl-actors-")
            bind = f"ipc://{self.private_dir}/trajectories"
        cfg, hp, obs_space = self.cfg, self.hp, self.observation_space
        own = [uuid.uuid4().hex.encode() for _ in range(hp.actors_per_agent)]
        curve, own_curve = self.curve, None
        if curve is not None:  # its own actors get a key pair of this run's, admitted beside the allowed keys
            public, secret = zmq.curve_keypair()
            curve = (curve[0], keys.load_allowed(curve[1]) | {public})
            own_curve = (public, secret, keys.load_secret(curve[0])[0])
        self.end = LearnerEnd(
            bind,
            self.cfg.env_id,
            unroll_specs(
                hp.n_steps, hp.num_envs, obs_space.shape, np.dtype(obs_space.dtype).name, int(self.action_space.n)
            ),
            {"params": flat_params.numel(), "n_steps": hp.n_steps, "num_envs": hp.num_envs, "gamma": float(hp.gamma)},
            capacity=hp.queue_size,
            seed_of=lambda actor: self.seed + actor * hp.num_envs,  # no two actors play the same episodes
            curve=curve,
            # a seat for each of its own, and with --actors-bind as many from other hosts as the queue has
            # room for unrolls: more could never all hold a credit at once
            max_actors=hp.queue_size if self.hp.actors_bind is not None else 0,
            reserved=own,
        )
        if self.hp.actors_bind is not None:
            print(
                f"actors join this learner with: gossiprl actor --connect {self.end.endpoint} --env {self.cfg.env_id}",
                flush=True,
            )
        self.publish(flat_params, 0)
        context = actor_context()
        for a, routing_id in enumerate(own):
            process = context.Process(
                target=actor_process,
                args=(self.end.endpoint, cfg.env_id, cfg.sticky_actions, self.env_threads, routing_id, own_curve),
                name=f"actor-process-{a}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)
        self.wait_for_joins(stop)

    def wait_for_joins(self, stop=None) -> None:
        """Return once every actor process has joined: each imports torch and builds its envs first,
        which on a loaded host takes many seconds, and the learner's clock (its frames/s, its first
        updates) should not count that. Its own by name: actors from elsewhere may join first. A
        learner with none of its own (--actors-per-agent 0) waits for the first from elsewhere.
        Return at once when ``stop`` is set: the wait is up to START_S, and a stopped agent that
        sat it out was killed by its launcher first."""
        deadline = time.monotonic() + START_S
        while self.end.reserved_missing() or not self.end.joined:
            if stop is not None and stop.is_set():
                return
            self.check_processes()
            if time.monotonic() > deadline:
                raise ActorFailed(self._missing())
            time.sleep(0.1)

    def _missing(self) -> str:
        if not self.processes:
            return (
                f"no actor joined {self.end.endpoint} within {START_S:g} s: with --actors-per-agent 0 this learner "
                f"has only actors from elsewhere (gossiprl actor --connect {self.end.endpoint} --env {self.cfg.env_id})"
            )
        joined = len(self.processes) - self.end.reserved_missing()
        return f"only {joined} of {len(self.processes)} actor processes joined within {START_S:g} s"

    def publish(self, flat_params: torch.Tensor, version: int) -> None:
        self.check_processes()  # once per update: the others' unrolls must not hide a dead actor
        self.end.publish(flat_params.detach().cpu().numpy(), version)

    def depth(self) -> int:
        return self.end.depth()

    def channel_counts(self) -> dict[str, int]:
        """What the channel turned away so far: JOINs past the bound, credits taken back from
        actors that held them silent, messages dropped as malformed or unexpected, and actors from
        elsewhere dropped because they left or fell silent, or because they failed."""
        end = self.end
        return {
            "refused_joins": end.refused_joins,
            "reclaimed": end.reclaimed,
            "bad_messages": end.bad_messages,
            "left": end.left,
            "failed": end.failed,
        }

    def take(self, timeout: float) -> Trajectory | None:
        trajectory = self.end.take(timeout)
        if trajectory is None:
            self.check_processes()
        return trajectory

    def check_processes(self) -> None:
        """An actor process leaves only when told to: one that exited failed, in its own words if it sent them."""
        for process in self.processes:
            if process.exitcode is not None:
                said = self.end.failure(LAST_WORD_S)
                raise ActorFailed(said or f"{process.name} (pid {process.pid}) exited with code {process.exitcode}")

    def close(self) -> None:
        """Tell the actors to stop, give them JOIN_S in all to leave, then kill the rest (they ignore SIGTERM). One
        deadline for all, not JOIN_S each: 8 actors still starting (deaf to STOP until they join)
        took 40 s in turn, past the launcher's LAUNCHER_JOIN_S, which then killed the agent unsaved."""
        try:
            if self.end is not None:
                self.end.close()  # tells every actor to stop
            deadline = time.monotonic() + JOIN_S
            for process in self.processes:
                process.join(max(deadline - time.monotonic(), 0.0))
        finally:  # even if the goodbye failed: multiprocessing's own clean-up would terminate them, in vain
            for process in self.processes:
                if process.is_alive():
                    process.kill()
                    process.join()
            if self.private_dir is not None:
                shutil.rmtree(self.private_dir, ignore_errors=True)
