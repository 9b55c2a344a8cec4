"""hpctrain-export: a run's checkpoint as a plain model state_dict, loadable without hpctrain.

    hpctrain-export runs/2026-11-27/10-04-31-ab12cd                 # newest complete checkpoint
    hpctrain-export RUN_DIR --step 4000 --out /data/gpt-4000.pt      # that step's
    hpctrain-export RUN_DIR --hf out/gpt2-small                      # a Hugging Face model, its format

Reads either kind of checkpoint: a `.pt` (trainer.strategy=ddp) or a sharded `.dcp` folder
(trainer.strategy=fsdp, any number of ranks wrote it), checked against its .json's sha256 first;
of a sharded one only the model's tensors are read, never the optimizer's. Runs in one process,
on a login node, without a GPU or a process group. The file is written atomically; the keys are
the unwrapped model's (`model.load_state_dict(torch.load(PATH))`). Exit 0 when written, 2 when the
run dir, the step or the checkpoint is not usable (said in one `error:` line).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpctrain.run.exitcodes import CLI_OK, CLI_USER_ERROR
from hpctrain.run.paths import RunDir, checkpoints_in


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="hpctrain-export",
        description="Write a run's checkpoint (.pt or sharded) as a plain model state_dict, loadable without hpctrain.",
    )
    parse.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run dir whose checkpoint to export")
    parse.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest complete one)")
    parse.add_argument("--out", type=Path, help="where to write it (default: RUN_DIR/model-step<N>.pt)")
    parse.add_argument(
        "--hf",
        type=Path,
        metavar="DIR",
        help="also write a Hugging Face model in its own format to DIR (from_pretrained loads it)",
    )
    return parse


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        written, step = export(args.run_dir, args.step, args.out)
        if args.hf is not None:
            import torch

            from hpctrain.cli.export_hf import save_pretrained

            save_pretrained(args.run_dir, torch.load(written, weights_only=True), args.hf)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return CLI_USER_ERROR
    print(f"hpctrain-export: step {step} of {args.run_dir} -> {written}")
    if args.hf is not None:
        print(f"hpctrain-export: Hugging Face format -> {args.hf} (from_pretrained loads it)")
    return CLI_OK


def export(run_dir: Path, step: int | None, out: Path | None) -> tuple[Path, int]:
    import torch

    from hpctrain.checkpoint import shard_files, store

    folder = RunDir(run_dir).checkpoints
    complete = checkpoints_in(folder)
    if not complete:
        raise ValueError(f"{folder}: no complete checkpoint (is {run_dir} a run dir that has saved one?)")
    if step is None:
        step = complete[0].step
    entry = next((e for e in complete if e.step == step), None)
    if entry is None:
        steps = ", ".join(str(e.step) for e in complete)
        raise ValueError(f"--step {step}: {folder} has no complete checkpoint of that step (it has: {steps})")
    if shard_files.shards_dir(folder, step).is_dir():
        weights = shard_files.read_model_weights(folder, step)
    else:
        store.verify(entry)
        weights = torch.load(entry.data, map_location="cpu", weights_only=True)["model"]
    target = out or run_dir / f"model-step{step}.pt"
    tmp = target.with_name(target.name + ".tmp")
    torch.save(weights, tmp)
    os.replace(tmp, target)
    return target, step


if __name__ == "__main__":
    sys.exit(main())
