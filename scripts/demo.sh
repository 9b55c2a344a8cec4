#!/usr/bin/env bash
# The quickstart: install, then train the default ConvNet on the digits with DDP and print the
# test accuracy. As root on Debian/Ubuntu it starts a real Slurm cluster on this machine
# (scripts/devcluster.py), submits the job on 2 nodes and follows it to the end; elsewhere it
# trains with 2 local processes and says why.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export OMP_NUM_THREADS=1
why=""
if [ "$(id -u)" != 0 ]; then
  why="not root: the dev cluster installs slurm-wlm and starts slurmctld/slurmd"
elif ! command -v apt-get >/dev/null && ! command -v slurmctld >/dev/null; then
  why="no apt-get and no Slurm: the dev cluster needs Debian/Ubuntu's slurm-wlm"
fi
if [ -n "$why" ]; then
  echo "demo: training locally with 2 processes ($why)"
  exec .venv/bin/hpctrain-train trainer.nprocs=2 "$@"
fi
eval "$(.venv/bin/python scripts/devcluster.py up --nodes 2 --gpus-per-node 0)"
run_dir="runs/demo/$(date +%Y-%m-%d_%H-%M-%S)"
.venv/bin/hpctrain-submit cluster=devcluster slurm.nodes=2 hydra.run.dir="$run_dir" "$@"
exec .venv/bin/hpctrain-follow "$run_dir"
