"""Where a run is: with the weights, the optimizer and the RNG, everything a resume needs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed (this rank's shard)
    # (in the micro-batches of the run's layout: trainer.layout.moved_position converts it)
