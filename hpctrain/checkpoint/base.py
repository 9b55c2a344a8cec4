"""What the trainer saves through and resumes from: one interface, two kinds behind it.

    PlainCheckpointer    (hpctrain.checkpoint.plain) rank 0 writes the whole state to one .pt
    ShardedCheckpointer  (hpctrain.checkpoint.sharded) every rank writes its shards (DCP), for
                         trainer.strategy=fsdp, where no process holds the whole model

`hpctrain.checkpoint.checkpointer_for` picks one from the config, once; the trainer never asks
which it holds. Each was given the live model and optimizer and saves them its own way: the
`state` the trainer hands over is the rest (scheduler, scaler, data position, layout), and `load`
puts the model's and the optimizer's state back in place before it returns the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from hpctrain.errors import UserError
from hpctrain.run.causes import CheckpointReason, StopReason

# Whether a stop was asked for: a background save that sees one is skipped (see Checkpointer.save).
StopCheck = Callable[[], bool]


class CheckpointMismatch(UserError):
    """The run dir's checkpoints belong to another model, dataset or optimizer: resuming them
    would silently train from the wrong state, and starting over would silently lose them."""


class Checkpointer(Protocol):
    def save(
        self,
        step: int,
        state: dict[str, Any],
        reason: CheckpointReason,
        background: bool,
        stop_requested: StopCheck | None = None,
    ) -> float:
        """Collective. Save `step`; returns the seconds training was blocked (rank 0's view).
        A background save may finish after the return (`wait`), and may be skipped once
        `stop_requested()` is true: the stop's forced save, at the next step boundary, decides."""
        ...

    def forced_save(self, step: int, state: dict[str, Any], reason: StopReason, deadline_s: float | None) -> None:
        """Collective. The save a stop forces, within `deadline_s` seconds (None: no limit):
        what it did (written, waited, skipped, ...) goes to the `forced_save` record."""
        ...

    def wait(self) -> None:
        """The write under way, finished; its error (a full disk) raised here."""
        ...

    def writing(self) -> bool:
        """This rank's background write is under way (the straggler watch leaves its steps untimed)."""
        ...

    def load(self) -> dict[str, Any] | None:
        """Collective. The newest usable checkpoint: the model and the optimizer loaded in place,
        its other parts returned, with this rank's RNG under "rng" (None for a rank the writer
        did not have); None for a fresh run. Refuses (raises, on every rank alike) a checkpoint
        of another model or format rather than starting over."""
        ...
