#!/usr/bin/env bash
# The test suite, from a fresh clone: install, then pytest (Slurm tests included where the dev
# cluster can run: root on Debian/Ubuntu). Extra arguments go to pytest.
#
# The tests run on HPCTRAIN_TEST_WORKERS pytest-xdist workers (default 4; 0 runs them in this one
# process). A Slurm test mostly waits on Slurm (its timers, requeue holds, time limits, a silent
# node's timeout) and uses half a core or less, so four workers keep the two cores busy where
# three left them idle a sixth of the run. Each worker has dev clusters of
# its own (tests/slurmtools.py: its own folders and ports), so a node set down or a preemption in
# one never touches another's jobs. Each module is one unit of work (its module fixtures are built
# once), handed out longest first (tests/suite_order.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
export OMP_NUM_THREADS=1
status=0
# Lint and types first (a few seconds): a failure is reported, the tests still run, the run fails.
check() { "$@" || { echo "test.sh: \`$*\` failed (above)" >&2; status=1; }; }
check .venv/bin/ruff check hpctrain hydra_plugins scripts tests
check .venv/bin/ruff format --check hpctrain hydra_plugins scripts tests
check .venv/bin/mypy hpctrain hydra_plugins scripts
workers="${HPCTRAIN_TEST_WORKERS:-4}"
parallel=(-n "${workers}")
if [ "${workers}" != 0 ]; then
  parallel+=(--dist loadfile --no-loadscope-reorder)
fi
# The suite stops the dev clusters it starts (tests/conftest.py). Clusters already up before the run
# are reused and left up, so the check below only holds when none was.
up_before=0
.venv/bin/python tests/slurmtools.py >/dev/null || up_before=1
.venv/bin/python -m pytest -q --durations=15 "${parallel[@]}" "$@" || status=$?
# The reference runs the workers shared (tests/slurmtools.py Reference): this run's only.
rm -rf "${TMPDIR:-/tmp}/hpctrain-references"
if [ "${up_before}" = 0 ] && [ "${HPCTRAIN_TEST_KEEP_CLUSTERS:-}" != 1 ]; then
  if ! .venv/bin/python tests/slurmtools.py; then
    echo "test.sh: the run left dev cluster daemons running (listed above)" >&2
    status=1
  fi
fi
exit "${status}"
