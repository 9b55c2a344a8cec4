"""Hydra's basic sweeper, less its legality check: hpctrain's launcher checks every point
itself before submitting any, so composing each point a second time here only costs time."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

# Hydra 1.3 exports its basic sweeper (override parsing, batching, the multirun.yaml it writes)
# only from this private module; reimplementing it would drift from Hydra's own sweep syntax.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore


@dataclass
class SubmitSweeperConf:
    _target_: str = "hydra_plugins.hpctrain_launcher.sweeper.SubmitSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="hpctrain_submit", node=SubmitSweeperConf, provider="hpctrain")


class SubmitSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        return None
