"""What the server that forks hpctrain-train's local ranks imports once, before any rank exists.

hpctrain-train with trainer.nprocs > 1 starts its ranks with the `forkserver` method: a clean
server process (started fresh, never touching CUDA, unlike a `fork` of the launcher) imports
torch and the trainer once, and each rank is forked from it ready to train. With `spawn` every
rank imported them again: about 2 s of CPU and 1 s of waiting per rank at every start.

The stop signals are blocked here, so they never kill the server when they reach the whole
process group (a preemption, `kill -TERM -PGID`): the launcher learns each rank's exit code
through the server, and with the server dead it would read every rank as ended. Each forked
rank inherits the mask: a signal sent to it stays pending until hpctrain.process.door.spawned holds
the signals and unblocks them, so none is lost between the fork and the handlers. (SIGINT the server ignores on
its own, and each rank gets its handler back.)
"""

import gc
import signal

from hpctrain.process.early_signals import HELD

signal.pthread_sigmask(signal.SIG_BLOCK, set(HELD) - {signal.SIGINT})

import torch._dynamo  # noqa: E402, F401  (every optimizer imports it: a second of CPU per rank)

from hpctrain.process import life  # noqa: E402, F401

# Imported for good: kept out of every full collection, in the server and in each rank forked
# from it (whose pages then stay shared, untouched by the collector).
gc.freeze()
