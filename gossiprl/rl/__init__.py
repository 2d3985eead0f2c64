"""The RL layer: learners (A2C, PPO), their envs and networks, and what a finished run hands over.

Needs the ``rl`` extra (torch, gymnasium, ale-py). ``agent.train`` is one agent's loop; it sees
the comms layer only through the ``GossipHook`` it is handed. ``learners`` (the update rules:
``a2c``, ``ppo``; ``vtrace`` is IMPALA's targets, not yet a learner), ``models`` and ``envs`` are
what it is built from; ``evaluate``, ``consensus`` and ``policy`` read
a finished run's checkpoints; ``swarmlog`` writes the swarm-level TensorBoard run.
"""
