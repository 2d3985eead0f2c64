#!/bin/sh
# The CPU studies behind RESULTS.md, most important cells first, each resumable (re-run this
# script after an interruption: finished cells are kept). Then RESULTS.md from whatever finished.
# nice -n 19: the studies yield the cores to other work of their session. Where the kernel groups
# processes by session (autogroup: /proc/sys/kernel/sched_autogroup_enabled is 1, as on this VM),
# another session's jobs get no more than an equal share beside them, whatever its nice.
# ./experiments/run_all.sh --plan runs and writes nothing: each study's last line of --plan (its cells
# done and left, the frames left and the hours they take at its pace so far).
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = --plan ]; then
    run() {
        study=$1
        shift
        if [ "$study" = baselines ]; then
            echo "baselines $*: no --plan (Stable-Baselines3 cells, each kept once run)"
        else
            python -m "experiments.$study" "$@" --plan | tail -n 1
        fi
    }
else
    run() { nice -n 19 python -m "experiments.$@"; }
fi
run swarm_learning --frames 250000 --out experiments/results/swarm_learning
run swarm_vs_one --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/swarm_vs_one
run swarm_vs_one --env MinAtar/SpaceInvaders-v1 --frames 1000000 --seeds 1,2,3,4,5 \
    --out experiments/results/swarm_vs_one_spaceinvaders
run lr_sweep --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/lr_sweep
run lr_sweep --env MinAtar/SpaceInvaders-v1 --frames 1000000 --seeds 1,2,3,4,5 \
    --out experiments/results/lr_sweep_spaceinvaders
# The sweep's ring-above-one-agent at 4x the rate, tested on seeds 6-10 (25 M frames a game)
run lr_confirm --frames 1000000 --out experiments/results/lr_confirm
run lr_confirm --env MinAtar/SpaceInvaders-v1 --frames 1000000 --out experiments/results/lr_confirm_spaceinvaders
run baselines --out experiments/results/baselines
run baselines --env MinAtar/SpaceInvaders-v1 --out experiments/results/baselines-spaceinvaders
run learners --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/learners
run table1 --frames 1000000 --seeds 1,2,3,4,5 --out experiments/results/table1
run table1 --env MinAtar/SpaceInvaders-v1 --frames 1000000 --seeds 1,2,3,4,5 \
    --out experiments/results/table1_spaceinvaders
# The papers' questions at 1M frames per agent, 5 seeds, two games: about 1.1 G frames (a 16-agent cell
# is 16M), 14-28 hours of this 2-core VM when nothing else runs (4-agent swarms train 11-22k frames/s
# then), two to three times that beside other work. Small swarms first on each game. `--plan` on a
# study says what it has left.
for game in Breakout SpaceInvaders; do
    suffix=$([ "$game" = Breakout ] || echo _spaceinvaders)
    env="--env MinAtar/$game-v1"
    run ordering_ablation $env --out "experiments/results/ordering_ablation$suffix"
    run topology_ablation $env --max-agents 4 --out "experiments/results/topology_ablation$suffix"
    run scaling $env --max-agents 8 --out "experiments/results/scaling$suffix"
done
run batch_period --out experiments/results/batch_period
run layout --out experiments/results/layout
for game in Breakout SpaceInvaders; do
    suffix=$([ "$game" = Breakout ] || echo _spaceinvaders)
    run topology_ablation --env "MinAtar/$game-v1" --out "experiments/results/topology_ablation$suffix"
    run scaling --env "MinAtar/$game-v1" --out "experiments/results/scaling$suffix"
done
[ "${1:-}" = --plan ] || python -m experiments.make_results
