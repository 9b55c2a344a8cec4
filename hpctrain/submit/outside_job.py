"""The environment for sbatch run from inside a job (a guardian's, the control step's, a study's
next trials): the job's own settings left out, so the new job is not shaped by the old one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from hpctrain.faults import ENV as FAULTS_ENV
from hpctrain.run.generations import TOKEN_ENV
from hpctrain.run.heartbeats import ADDR_ENV as HEARTBEAT_ADDR_ENV

# This life's warm standbys' token (hpctrain.process.standby.STANDBY_ENV, which imports torch; a
# test holds the two names equal): the new job draws its own.
STANDBY_ENV = "HPCTRAIN_STANDBY"
# hpctrain's own variables a job must not pass on: a test's armed fault points (hpctrain.faults)
# were meant for the job that had them; this job's heartbeat watcher's address (the new job's
# ranks would beat to a watcher that is gone); this job's standby token; the token of the
# submission that queued this job (hpctrain.run.generations: a new job carries its own).
LEFT_OUT = frozenset({FAULTS_ENV, HEARTBEAT_ADDR_ENV, STANDBY_ENV, TOKEN_ENV})


def outside_job_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the job's own SLURM_*/SBATCH_* (they would become the new job's options: its
    nodes, its name) and without LEFT_OUT; SLURM_CONF (which cluster to talk to) is kept."""
    return {
        k: v
        for k, v in env.items()
        if k == "SLURM_CONF" or (not k.startswith(("SLURM_", "SBATCH_")) and k not in LEFT_OUT)
    }


@contextlib.contextmanager
def outside_the_job() -> Iterator[None]:
    """os.environ as `outside_job_env` makes it, for code that calls sbatch without an env of its
    own; restored on the way out."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(outside_job_env(saved))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
