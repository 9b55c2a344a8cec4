#!/usr/bin/env bash
# The test suite, from a fresh clone: install, then pytest (Slurm tests included where the dev
# cluster can run: root on Debian/Ubuntu). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
export OMP_NUM_THREADS=1
# The suite stops the dev clusters it starts (tests/conftest.py). Clusters already up before the run
# are reused and left up, so the check below only holds when none was.
up_before=0
.venv/bin/python tests/slurmtools.py >/dev/null || up_before=1
status=0
.venv/bin/python -m pytest -q --durations=15 "$@" || status=$?
if [ "${up_before}" = 0 ] && [ "${HPCTRAIN_TEST_KEEP_CLUSTERS:-}" != 1 ]; then
  if ! .venv/bin/python tests/slurmtools.py; then
    echo "test.sh: the run left dev cluster daemons running (listed above)" >&2
    status=1
  fi
fi
exit "${status}"
