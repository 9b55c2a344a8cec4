#!/bin/bash
# A site's health command for tests/test_slurm_node_health.py: the first node to run it claims to
# be broken (whichever node Slurm placed the first step on), writes its name in the run dir, and
# fails from then on; every other node passes.
claim="${HPCTRAIN_RUN_DIR}/.bad-node"
if mkdir "${claim}.claimed" 2>/dev/null; then
  echo "${SLURMD_NODENAME}" > "${claim}"
fi
if grep -qx "${SLURMD_NODENAME}" "${claim}" 2>/dev/null; then
  echo "${SLURMD_NODENAME}: the test's broken node"
  exit 1
fi
exit 0
