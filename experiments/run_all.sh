#!/bin/sh
# The CPU studies behind RESULTS.md, most important cells first, each resumable (re-run this
# script after an interruption: finished cells are kept). Then RESULTS.md from whatever finished.
# nice -n 19: the studies yield the cores to anything else on the machine.
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
run() { nice -n 19 python -m "experiments.$@"; }
run swarm_learning --frames 250000
run swarm_vs_one --frames 1000000
run baselines --out experiments/results/baselines
run ordering_ablation
run scaling --max-agents 8
run topology_ablation --max-agents 4
run batch_period
run layout
run topology_ablation
run scaling
python -m experiments.make_results
