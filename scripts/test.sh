#!/usr/bin/env bash
# The test suite, from a fresh clone: install, then pytest (Slurm tests included where the dev
# cluster can run: root on Debian/Ubuntu). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
export OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -q --durations=15 "$@"
