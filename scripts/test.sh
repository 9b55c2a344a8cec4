#!/usr/bin/env bash
# The test suite, from a fresh clone: install, then pytest (Slurm tests included where the dev
# cluster can run: root on Debian/Ubuntu). Extra arguments go to pytest.
#
# The tests run in two lanes side by side, each on pytest-xdist workers: the main lane on
# HPCTRAIN_TEST_WORKERS (default 3), and the waiting lane on HPCTRAIN_TEST_WAITING_WORKERS (default
# 2): the modules that mostly wait on Slurm's own clocks (SlurmdTimeout 300 s, MinJobAge, time
# limits) at half a core or less (tests/suite_order.py WAITING_LANE). Their waiting then
# overlaps the main lane's work instead of holding one of its workers. HPCTRAIN_TEST_WORKERS=0 runs
# everything in this one process, one lane. Each worker has dev clusters of its own
# (tests/slurmtools.py: its own folders and ports; the waiting lane's numbered after the main
# lane's), so a node set down or a preemption in one never touches another's jobs. Each module is
# one unit of work (its module fixtures are built once), handed out longest first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
export OMP_NUM_THREADS=1
status=0
# Lint first (a few seconds), types beside the tests: a failure is reported, the tests still run, the run fails.
check() { "$@" || { echo "test.sh: \`$*\` failed (above)" >&2; status=1; }; }
check .venv/bin/ruff check hpctrain hydra_plugins scripts tests
check .venv/bin/ruff format --check hpctrain hydra_plugins scripts tests
# mypy takes ~18 s of one core from a fresh clone: it runs beside the tests, reported after them.
mypy_log="$(mktemp)"
.venv/bin/mypy hpctrain hydra_plugins scripts >"${mypy_log}" 2>&1 &
mypy_pid=$!
workers="${HPCTRAIN_TEST_WORKERS:-3}"
waiting_workers="${HPCTRAIN_TEST_WAITING_WORKERS:-2}"
# The suite stops the dev clusters it starts (tests/conftest.py). Clusters already up before the run
# are reused and left up, so the check below only holds when none was.
up_before=0
.venv/bin/python tests/slurmtools.py >/dev/null || up_before=1
lane_ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: pytest collected nothing (a selection of the other lane)
if [ "${workers}" = 0 ]; then
  .venv/bin/python -m pytest -q --durations=15 "$@" || status=$?
else
  # One store of shared reference runs for both lanes (tests/slurmtools.py Reference).
  export HPCTRAIN_TEST_RUN_ID="run-$$-$(date +%s)"
  spread=(--dist loadfile --no-loadscope-reorder)
  waiting_log="$(mktemp)"
  HPCTRAIN_TEST_LANE=waiting HPCTRAIN_TEST_WORKER_OFFSET="${workers}" \
    .venv/bin/python -m pytest -q --durations=8 -n "${waiting_workers}" "${spread[@]}" "$@" >"${waiting_log}" 2>&1 &
  waiting_pid=$!
  main_status=0
  HPCTRAIN_TEST_LANE=main .venv/bin/python -m pytest -q --durations=15 -n "${workers}" "${spread[@]}" "$@" ||
    main_status=$?
  waiting_status=0
  wait "${waiting_pid}" || waiting_status=$?
  echo "==== the waiting lane (${waiting_workers} workers, beside the main lane) ===="
  cat "${waiting_log}"
  rm -f "${waiting_log}"
  if ! lane_ok "${main_status}" || ! lane_ok "${waiting_status}" || [ "${main_status}${waiting_status}" = 55 ]; then
    status=1
  fi
fi
if ! wait "${mypy_pid}"; then
  cat "${mypy_log}"
  echo "test.sh: \`mypy hpctrain hydra_plugins scripts\` failed (above)" >&2
  status=1
fi
rm -f "${mypy_log}"
# The reference runs the workers shared (tests/slurmtools.py Reference): this run's only.
rm -rf "${TMPDIR:-/tmp}/hpctrain-references"
if [ "${up_before}" = 0 ] && [ "${HPCTRAIN_TEST_KEEP_CLUSTERS:-}" != 1 ]; then
  if ! .venv/bin/python tests/slurmtools.py; then
    echo "test.sh: the run left dev cluster daemons running (listed above)" >&2
    status=1
  fi
fi
exit "${status}"
