"""The paced ConvNet that crashes once: a stand-in for a transient fault (a bad node, a flaky
file system) that a retry gets past.

It raises at its `HPCTRAIN_TEST_CRASH_AT`-th training forward call of a life, but only while the
file `crash-once` exists in the job's run dir ($HPCTRAIN_RUN_DIR), which it removes first: a test
arms one point of a sweep, and the retried job trains through. Same parameters as ConvNet, so an
unarmed local run is the reference for the weights.
"""

import os
from pathlib import Path

from helpers.paced import PacedConvNet

CRASH_AT_ENV = "HPCTRAIN_TEST_CRASH_AT"
MARKER = "crash-once"


class CrashOnceConvNet(PacedConvNet):
    calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            marker = Path(os.environ.get("HPCTRAIN_RUN_DIR", ".")) / MARKER
            if self.calls == int(os.environ.get(CRASH_AT_ENV, "0")) and marker.exists():
                marker.unlink()
                raise RuntimeError("crash-once: a transient fault (tests/helpers/crash_once.py)")
        return super().forward(x)
