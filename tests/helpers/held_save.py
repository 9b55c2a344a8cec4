"""The paced ConvNet whose state_dict() waits while a file named in the environment exists: a
save (which starts by taking the state) that a test holds for as long as it wants, as a slow disk
or a huge model would, and can kill half-way. Same weights as the built-in ConvNet."""

import os
import time
from pathlib import Path

from helpers.paced import PacedConvNet

HOLD_ENV = "HPCTRAIN_TEST_HOLD_SAVE"
HOLD_AT_MOST_S = 120.0  # a test that went wrong fails instead of hanging


class HeldSaveConvNet(PacedConvNet):
    def state_dict(self, *args, **kwargs):
        hold = os.environ.get(HOLD_ENV)
        give_up = time.monotonic() + HOLD_AT_MOST_S
        while hold and Path(hold).exists() and time.monotonic() < give_up:
            time.sleep(0.05)
        return super().state_dict(*args, **kwargs)
