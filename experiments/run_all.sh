#!/bin/sh
# The CPU studies behind RESULTS.md, most important cells first, each resumable (re-run this
# script after an interruption: finished cells are kept). Then RESULTS.md from whatever finished.
# nice -n 19: the studies yield the cores to anything else on the machine.
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
run() { nice -n 19 python -m "experiments.$@"; }
run swarm_learning --frames 250000 --out experiments/results/swarm_learning
run swarm_vs_one --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/swarm_vs_one
run swarm_vs_one --env MinAtar/SpaceInvaders-v1 --frames 1000000 --seeds 1,2,3,4,5 \
    --out experiments/results/swarm_vs_one_spaceinvaders
run lr_sweep --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/lr_sweep
run lr_sweep --env MinAtar/SpaceInvaders-v1 --frames 1000000 --seeds 1,2,3,4,5 \
    --out experiments/results/lr_sweep_spaceinvaders
run baselines --out experiments/results/baselines
run baselines --env MinAtar/SpaceInvaders-v1 --out experiments/results/baselines-spaceinvaders
run learners --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/learners
run table1 --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/table1
run ordering_ablation --out experiments/results/ordering_ablation
run scaling --max-agents 8 --out experiments/results/scaling
run topology_ablation --max-agents 4 --out experiments/results/topology_ablation
run batch_period --out experiments/results/batch_period
run layout --out experiments/results/layout
run topology_ablation --out experiments/results/topology_ablation
run scaling --out experiments/results/scaling
python -m experiments.make_results
