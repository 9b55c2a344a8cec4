"""A ConvNet that crashes at the same place in every life: its `HPCTRAIN_TEST_CRASH_AT`-th
training forward call of each process. A stand-in for a run that cannot get past its newest
checkpoint (a bad batch at the same step, a bug the resume reaches every time)."""

import os

from hpctrain.models.convnet import ConvNet

CRASH_AT_ENV = "HPCTRAIN_TEST_CRASH_AT"


class CrashEveryLifeConvNet(ConvNet):
    calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == int(os.environ.get(CRASH_AT_ENV, "0")):
                raise RuntimeError("crash-always: the same fault in every life (tests/helpers/crash_always.py)")
        return super().forward(x)
