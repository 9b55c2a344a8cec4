#!/usr/bin/env bash
# Install hpctrain and what it needs into .venv at the top of the repository.
#   bash scripts/install.sh          # the package (train, submit)
#   bash scripts/install.sh test     # plus the test tools
# Editable in "compat" mode (the repository on sys.path) so Hydra can discover
# hydra_plugins/hpctrain_launcher. torch is pinned to the CPU build these machines carry; on a GPU site install your CUDA build
# of torch first (any 2.x >= 2.4) and `pip install -e .` keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install --quiet -e ".[$extras]" --config-settings editable_mode=compat
else
  .venv/bin/python -m pip install --quiet -e . --config-settings editable_mode=compat
fi
.venv/bin/python -c "import torch, hydra, hpctrain; print('hpctrain', hpctrain.__version__, 'torch', torch.__version__)"
