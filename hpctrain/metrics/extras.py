"""The optional integrations and the pip extra that installs each.

Checked twice with the same words: by the CLI before any process starts (a user's mistake,
nothing written), and by the training process itself, whose node may run another environment.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hpctrain.config.schema import MetricsConfig
from hpctrain.errors import UserError

# metrics.<key> -> (what users call it, the module the sink imports, the pip extra).
EXTRAS = {
    "tensorboard": ("TensorBoard", "torch.utils.tensorboard", "tensorboard"),
    "mlflow": ("MLflow", "mlflow", "mlflow"),
    "wandb": ("W&B", "wandb", "wandb"),
}


def import_extra(key: str) -> ModuleType:
    """The module behind metrics.<key>; UserError naming the pip command when it will not import."""
    label, module, extra = EXTRAS[key]
    try:
        return importlib.import_module(module)
    except Exception as error:  # a half-installed package fails in more ways than ImportError
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(
            f"metrics.{key}=true needs {label}, which cannot be imported here ({reason}): "
            f"pip install 'hpctrain[{extra}]', or set metrics.{key}=false"
        ) from None


def check_extras(settings: MetricsConfig) -> None:
    """Import every integration switched on; UserError for the first that is missing."""
    for key in EXTRAS:
        if getattr(settings, key):
            import_extra(key)
