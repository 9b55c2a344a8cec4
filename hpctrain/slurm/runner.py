"""Running one Slurm command: its time limit and retries (`Policy`), and a `Reply` that says
plainly whether Slurm answered:

    ANSWERED     Slurm answered: the exit code and the words are its own (a refusal too)
    MISSING      the command cannot run here (not on PATH: an image without Slurm's commands)
    UNREACHABLE  it could not connect to slurmctld: the request was never sent
    NO_REPLY     the request went out and no reply came back: Slurm may have acted on it
    TIMED_OUT    our time limit ended the command: Slurm may have acted on it

A slurmctld restart (an upgrade, a failover) shows as UNREACHABLE or NO_REPLY for a while; each
Slurm command already waits about MessageTimeout (10 s by default) before it says so. What a
policy retries, with a doubling pause, until its `retry_for_s` is spent:
  - reads (squeue, scontrol show, sinfo, sacct, sacctmgr) and scancel (cancelling twice changes
    nothing): every kind of no answer;
  - sbatch and scontrol requeue: UNREACHABLE only (`retry_unsure=False`). After NO_REPLY or
    TIMED_OUT the request may have been carried out: on Slurm 22.05 an sbatch and an `scontrol
    requeue` sent to a stopped slurmctld were both carried out once it went on, so the caller
    looks at the queue before it acts again.

Which command runs, with which policy, is hpctrain.slurm.client's to say; this module only runs it.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Generic, TypeVar

log = logging.getLogger(__name__)


class Kind(Enum):
    ANSWERED = "answered"
    MISSING = "missing"
    UNREACHABLE = "unreachable"
    NO_REPLY = "no reply"
    TIMED_OUT = "timed out"


# Slurm's own words for "no answer" (src/common/slurm_errno.c; the ones seen on the dev cluster
# are in tests/fixtures/slurm/no_answer/). Each command puts its own prefix before them.
_NOT_SENT = (
    "Unable to contact slurm controller (connect failure)",
    "Slurm backup controller in standby mode",
    "Rate limit exceeded, please retry",  # newer Slurm: refused before it was looked at
)
_SENT_UNANSWERED = (
    "Socket timed out on send/recv operation",
    "Unable to contact slurm controller (send failure)",
    "Unable to contact slurm controller (receive failure)",
    "Unable to contact slurm controller (shutdown failure)",
    "Zero Bytes were transmitted or received",
    # What `scontrol requeue` and `scontrol update` print for a stopped and for a dead slurmctld
    # alike; a requeue sent to the stopped one was carried out once it went on.
    "Unexpected message received",
)
_UNSURE = (Kind.NO_REPLY, Kind.TIMED_OUT)


@dataclass(frozen=True)
class Policy:
    timeout_s: float  # one try's limit; then the command is killed (TIMED_OUT)
    # Retry a no-answer while less than this has passed since the first try. math.inf: for as
    # long as the caller's `until` allows (a call without one is refused).
    retry_for_s: float = 0.0
    retry_unsure: bool = True  # NO_REPLY and TIMED_OUT too (False for sbatch, scontrol requeue)
    first_pause_s: float = 1.0  # the pause before the second try, doubled after each
    max_pause_s: float = 8.0


@dataclass(frozen=True)
class Reply:
    command: tuple[str, ...]
    exit_code: int | None  # None when the command did not run to its end
    stdout: str
    stderr: str
    kind: Kind
    tries: int = 1
    # An earlier try may have been carried out (NO_REPLY or TIMED_OUT before this answer).
    unsure_before: bool = False

    @property
    def answered(self) -> bool:
        return self.kind is Kind.ANSWERED

    @property
    def ok(self) -> bool:
        return self.kind is Kind.ANSWERED and self.exit_code == 0

    @property
    def unsure(self) -> bool:
        """Slurm may have carried out the request without saying so."""
        return self.kind in _UNSURE or self.unsure_before

    def first_line(self) -> str:
        text = (self.stderr or self.stdout).strip()
        return text.splitlines()[0] if text else f"exit {self.exit_code}"

    def last_line(self) -> str:
        text = (self.stderr or self.stdout).strip()
        return text.splitlines()[-1] if text else f"exit {self.exit_code}"

    def why(self) -> str:
        """One line for a user: what went wrong, in Slurm's words when it said anything."""
        if self.kind in (Kind.MISSING, Kind.TIMED_OUT):
            return self.stderr
        if self.kind is Kind.ANSWERED:
            said = (self.stderr or self.stdout).strip()
            return f"exit {self.exit_code}: {self.last_line()}" if said else f"exit {self.exit_code}"
        return f"{_name(self.command)}: {self.last_line()}"


T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[T]):
    """A verb's reply and what it means: `value` is parsed from Slurm's words (the verb says what
    it holds when Slurm did not answer). The reply's verdicts read through."""

    reply: Reply
    value: T

    @property
    def kind(self) -> Kind:
        return self.reply.kind

    @property
    def answered(self) -> bool:
        return self.reply.answered

    @property
    def ok(self) -> bool:
        return self.reply.ok

    @property
    def unsure(self) -> bool:
        return self.reply.unsure

    def why(self) -> str:
        return self.reply.why()


def run_command(
    command: Sequence[str],
    policy: Policy,
    *,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    until: float | None = None,
) -> Reply:
    """Run one command under `policy`; never raises for Slurm's sake. `until` (a
    time.monotonic() value) bounds every try and pause of this call."""
    if until is None and math.isinf(policy.retry_for_s):
        raise ValueError(f"{_name(command)}: a policy that retries for as long as there is time needs `until`")
    give_up = time.monotonic() + policy.retry_for_s
    if until is not None:
        give_up = min(give_up, until)
    pause, tries, unsure_before = policy.first_pause_s, 0, False
    while True:
        limit = policy.timeout_s if until is None else min(policy.timeout_s, until - time.monotonic())
        reply = _once(tuple(command), limit, env, stdin) if limit > 0 else _no_time(tuple(command))
        tries += 1
        if not _retried(reply, policy) or time.monotonic() + pause > give_up:
            return replace(reply, tries=tries, unsure_before=unsure_before)
        log.info("%s; trying again in %.0f s", reply.why(), pause)
        unsure_before = unsure_before or reply.kind in _UNSURE
        time.sleep(pause)
        pause = min(pause * 2, policy.max_pause_s)


def kind_of(exit_code: int, stderr: str) -> Kind:
    """A finished command's reply: a failure in Slurm's words for "no answer" is not an answer."""
    if exit_code == 0:
        return Kind.ANSWERED
    if any(words in stderr for words in _NOT_SENT):
        return Kind.UNREACHABLE
    if any(words in stderr for words in _SENT_UNANSWERED):
        return Kind.NO_REPLY
    return Kind.ANSWERED


def _retried(reply: Reply, policy: Policy) -> bool:
    if reply.kind is Kind.UNREACHABLE:
        return True
    return policy.retry_unsure and reply.kind in _UNSURE


def _once(command: tuple[str, ...], timeout_s: float, env: Mapping[str, str] | None, stdin: str | None) -> Reply:
    try:
        done = subprocess.run(
            command,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Reply(command, None, "", f"{_name(command)}: no answer within {timeout_s:g} s", Kind.TIMED_OUT)
    except FileNotFoundError:
        return Reply(command, None, "", f"{_name(command)}: not found on PATH", Kind.MISSING)
    except OSError as error:  # not executable
        return Reply(command, None, "", f"{_name(command)}: {error.strerror or error}", Kind.MISSING)
    return Reply(command, done.returncode, done.stdout, done.stderr, kind_of(done.returncode, done.stderr))


def _no_time(command: tuple[str, ...]) -> Reply:
    return Reply(command, None, "", f"{_name(command)}: not run, no time left for Slurm", Kind.TIMED_OUT)


def _name(command: Sequence[str]) -> str:
    """`sbatch` for `sbatch` or `/usr/bin/sbatch`."""
    return os.path.basename(command[0])
