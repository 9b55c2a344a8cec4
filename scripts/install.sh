#!/usr/bin/env bash
# Install hpctrain and what it needs into .venv at the top of the repository.
#   bash scripts/install.sh          # the package (train, submit)
#   bash scripts/install.sh test     # plus the test tools
# Editable in setuptools' default mode: edits to the source take effect without reinstalling.
# torch is pinned to the CPU build these machines carry; on a GPU site install your CUDA build
# of torch first (any 2.x >= 2.4) and `pip install -e .` keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
if [ -n "$extras" ]; then
  # The pin again: an extra's package that depends on torch (timm's torchvision) then gets the
  # release made for this torch instead of replacing it with another.
  .venv/bin/python -m pip install --quiet -e ".[$extras]" "torch==2.13.0"
else
  .venv/bin/python -m pip install --quiet -e .
fi
# Hydra must find hpctrain's launcher (hydra_plugins/hpctrain_launcher) through this install.
.venv/bin/python -c "
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
import torch, hpctrain
names = [c.__name__ for c in Plugins.instance().discover(Launcher)]
assert 'SubmitLauncher' in names, f'Hydra does not see hpctrain\'s launcher (it sees {names})'
print('hpctrain', hpctrain.__version__, 'torch', torch.__version__)"
