"""`hpctrain-export RUN_DIR --hf OUT`: a Hugging Face model trained by hpctrain, written in Hugging
Face's own format, so that `AutoModel*.from_pretrained(OUT)` (and the Hub) take it.

The model is built again from the run's own config.yaml (its `model` node: `_target_` a
transformers class, `config` a transformers config node), the exported weights are loaded into it
strictly, and its `save_pretrained` writes the folder. A model with no `save_pretrained` (not a
Hugging Face model) is refused, naming the plain export instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from hpctrain.run.paths import RunDir


def save_pretrained(run_dir: Path, weights: dict[str, Any], out: Path) -> None:
    """Raises ValueError saying what to change."""
    import torch

    from hpctrain.config import targets

    here = str(Path.cwd())
    if here not in sys.path:  # the user's own package, as the commands find it
        sys.path.insert(0, here)
    try:
        config = yaml.safe_load(RunDir(run_dir).config.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{RunDir(run_dir).config}: unreadable ({error})") from None
    node = (config or {}).get("model")
    if not isinstance(node, dict) or "_target_" not in node:
        raise ValueError(f"{run_dir}: its config.yaml has no model node to build the model from")
    model = targets.build(node)
    if not hasattr(model, "save_pretrained"):
        raise ValueError(
            f"--hf: {node['_target_']} is not a Hugging Face model (it has no save_pretrained); "
            "export the plain state_dict without --hf"
        )
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied weights (an LM head sharing the embedding) are one tensor saved under both names.
    tied_keys = getattr(model, "_tied_weights_keys", None) or ()
    tied = {name for name in missing if name in tied_keys}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"--hf: the checkpoint's weights do not fit {node['_target_']} built from config.yaml "
            f"(missing {sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]})"
        )
    with torch.no_grad():
        model.save_pretrained(str(out))
