#!/usr/bin/env bash
# The quickstart: install, then train the default ConvNet on the digits with DDP over 2 local
# processes and print the test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export OMP_NUM_THREADS=1
exec .venv/bin/hpctrain-train trainer.nprocs=2 "$@"
