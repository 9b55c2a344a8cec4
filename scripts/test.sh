#!/usr/bin/env bash
# The test suite, from a fresh clone: install, then pytest (Slurm tests included where the dev
# cluster can run: root on Debian/Ubuntu). Extra arguments go to pytest (one run, in order).
#
# With no arguments (CI), the tests that use the dev cluster (marker `slurm`) and the rest run as
# two pytest processes side by side: the Slurm tests spend much of their time waiting on Slurm
# (holds, time limits, purges), and the rest fill that time. The rest run at a lower CPU priority
# (nice), so the Slurm jobs' timing (grace times, hang timeouts) is what it would be alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
export OMP_NUM_THREADS=1
# The suite stops the dev clusters it starts (tests/conftest.py). Clusters already up before the run
# are reused and left up, so the check below only holds when none was.
up_before=0
.venv/bin/python tests/slurmtools.py >/dev/null || up_before=1
status=0
if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest -q --durations=15 "$@" || status=$?
else
  rest_log=$(mktemp "${TMPDIR:-/tmp}/hpctrain-tests-rest.XXXXXX")
  started=$(date +%s)
  nice -n 10 .venv/bin/python -m pytest -q --durations=15 -m "not slurm" -p no:cacheprovider >"${rest_log}" 2>&1 &
  rest_pid=$!
  slurm_status=0
  .venv/bin/python -m pytest -q --durations=15 -m slurm || slurm_status=$?
  rest_status=0
  wait "${rest_pid}" || rest_status=$?
  echo
  echo "==== the tests without Slurm (run beside the Slurm tests above) ===="
  cat "${rest_log}"
  rm -f "${rest_log}"
  echo "test.sh: Slurm tests exit ${slurm_status}, the rest exit ${rest_status}; $(( $(date +%s) - started )) s in all"
  if [ "${slurm_status}" != 0 ] || [ "${rest_status}" != 0 ]; then status=1; fi
fi
if [ "${up_before}" = 0 ] && [ "${HPCTRAIN_TEST_KEEP_CLUSTERS:-}" != 1 ]; then
  if ! .venv/bin/python tests/slurmtools.py; then
    echo "test.sh: the run left dev cluster daemons running (listed above)" >&2
    status=1
  fi
fi
exit "${status}"
