"""The built-in ConvNet with a floor on each training step's time, taken from the environment.

A test that needs a run to outlast a time limit cannot rely on how fast the machine is (a fast CI
machine finished a "long" run inside one allocation). The pause lives in the environment, not in
the config, so a paced run and an unpaced reference have the same config and the same weights.
"""

import os
import time

from hpctrain.models.convnet import ConvNet
from hpctrain.models.gpt import GPT

PAUSE_ENV = "HPCTRAIN_TEST_STEP_PAUSE_S"


class PacedConvNet(ConvNet):
    def forward(self, x):
        pause_s = float(os.environ.get(PAUSE_ENV, "0"))
        if self.training and pause_s > 0:
            time.sleep(pause_s)
        return super().forward(x)


# The paced model as a test's config, and small: a paced step's time is its pause, so the
# arithmetic (6 CPU-ms a step for the default 32/64-channel ConvNet, under 2 for this one) only
# costs CPU the suite shares with every other test.
PACED = ["model._target_=helpers.paced.PacedConvNet", "model.channels=[8,16]", "model.hidden=32"]


class PacedGPT(GPT):
    """The GPT with the same floor on each training step (for trainer.strategy=fsdp on Slurm)."""

    def forward(self, idx):
        pause_s = float(os.environ.get(PAUSE_ENV, "0"))
        if self.training and pause_s > 0:
            time.sleep(pause_s)
        return super().forward(idx)


# The pause that gives PACED at least the step time of the default ConvNet on a loaded machine
# (10-20 ms with the suite beside it; 5 on a quiet one): a test timed around that model (a fault
# sent at a step, while the run must still be training) keeps its timing, at a fraction of the CPU.
DEFAULT_STEP_PAUSE_S = "0.015"
