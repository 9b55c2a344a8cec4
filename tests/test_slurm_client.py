"""hpctrain.slurm.client: Slurm's words for "no answer" as kinds (captured on the dev cluster),
then its plumbing on stand-in commands: time limits, retries per policy, a missing command, the
environment of a job that submits. Last, the source tree: no other module runs Slurm."""

from __future__ import annotations

import ast
import math
import os
import time
from pathlib import Path

import pytest
from fakeslurm import FIXTURES, FakeSlurm, Said, captured, install

from hpctrain.slurm import client
from hpctrain.slurm.client import Kind, Policy

ROOT = Path(__file__).resolve().parent.parent


def fast(timeout_s: float, retry_for_s: float = 0.0, retry_unsure: bool = True) -> Policy:
    """A policy whose pauses are short enough for a test."""
    return Policy(timeout_s, retry_for_s, retry_unsure, first_pause_s=0.05, max_pause_s=0.1)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    return install(tmp_path, monkeypatch)


# ---- Slurm's words -------------------------------------------------------------------------------

KINDS = {
    # slurmctld dead: the command could not connect, nothing was sent.
    "down_squeue_one": Kind.UNREACHABLE,
    "down_sinfo_nodes": Kind.UNREACHABLE,
    "down_sbatch": Kind.UNREACHABLE,
    "down_scancel_unknown": Kind.UNREACHABLE,
    # slurmctld stopped: sent, never answered; it may act on it later.
    "stopped_squeue_many": Kind.NO_REPLY,
    "stopped_scontrol_stdin": Kind.NO_REPLY,
    "stopped_sbatch": Kind.NO_REPLY,
    "stopped_scancel_unknown": Kind.NO_REPLY,
    # scontrol requeue/update say "Unexpected message received" either way: never taken as unsent.
    "stopped_scontrol_requeue": Kind.NO_REPLY,
    "down_scontrol_requeue": Kind.NO_REPLY,
    "down_scontrol_update": Kind.NO_REPLY,
}


@pytest.mark.parametrize("name, kind", KINDS.items(), ids=KINDS.keys())
def test_slurms_words_for_no_answer(name: str, kind: Kind) -> None:
    said = captured(name)
    assert said.rc != 0 and client.kind_of(said.rc, said.err) is kind


def test_every_captured_silence_is_no_answer_and_a_refusal_is_an_answer() -> None:
    for path in sorted((FIXTURES / "no_answer").glob("*.err")):
        said = captured(path.stem)
        assert client.kind_of(said.rc, said.err) in (Kind.UNREACHABLE, Kind.NO_REPLY), path.name
    # Answers, though failures: a job Slurm no longer knows, a requeue of a pending job.
    assert client.kind_of(1, (FIXTURES / "squeue_gone.err").read_text()) is Kind.ANSWERED
    assert client.kind_of(1, (FIXTURES / "scontrol" / "requeue_pending.err").read_text()) is Kind.ANSWERED
    assert client.kind_of(0, "") is Kind.ANSWERED


# ---- plumbing ------------------------------------------------------------------------------------


def test_an_answer_in_slurms_own_words(slurm: FakeSlurm) -> None:
    slurm.says("squeue", Said(out="RUNNING\n"))
    done = client.run(["squeue", "-h", "-j", "7", "-o", "%T"], client.LOOK)
    assert (done.ok, done.kind, done.exit_code, done.stdout, done.tries) == (True, Kind.ANSWERED, 0, "RUNNING\n", 1)
    assert slurm.calls("squeue") == [["squeue", "-h", "-j", "7", "-o", "%T"]]

    slurm.says("sacct", Said(err="sacct: error: Problem talking to the database: Connection refused\n", rc=1))
    refused = client.run(["sacct", "-X"], fast(5.0, 5.0))
    assert refused.answered and not refused.ok and refused.tries == 1  # an answer is never retried
    assert refused.why() == "exit 1: sacct: error: Problem talking to the database: Connection refused"


def test_a_read_waits_out_a_controller_restart(slurm: FakeSlurm) -> None:
    slurm.says("squeue", captured("down_squeue_one"), captured("stopped_squeue_one"), Said(out="PENDING\n"))
    done = client.run(["squeue", "-h"], fast(5.0, 10.0))
    assert done.ok and done.stdout == "PENDING\n" and done.tries == 3
    assert done.unsure  # a NO_REPLY came before: the caller knows a write may have happened


def test_sbatch_is_sent_again_only_when_it_was_never_sent(slurm: FakeSlurm) -> None:
    slurm.says("sbatch", captured("down_sbatch"), Said(out="42\n"))
    done = client.run(["sbatch", "--parsable", "job.sbatch"], fast(5.0, 10.0, retry_unsure=False))
    assert done.ok and done.stdout == "42\n" and done.tries == 2 and not done.unsure


def test_sbatch_without_a_reply_is_not_sent_again(slurm: FakeSlurm) -> None:
    slurm.says("sbatch", captured("stopped_sbatch"), Said(out="43\n"))
    done = client.run(["sbatch", "--parsable", "job.sbatch"], fast(5.0, 10.0, retry_unsure=False))
    assert done.kind is Kind.NO_REPLY and done.unsure and done.tries == 1
    assert len(slurm.calls("sbatch")) == 1
    assert done.why() == "sbatch: sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"


def test_our_time_limit_ends_a_command_that_hangs(slurm: FakeSlurm) -> None:
    slurm.says("sinfo", Said(out="late\n", sleep_s=5))
    began = time.monotonic()
    done = client.run(["sinfo", "-N"], Policy(0.5))
    assert time.monotonic() - began < 3
    assert (done.kind, done.exit_code, done.unsure) == (Kind.TIMED_OUT, None, True)
    assert done.why() == "sinfo: no answer within 0.5 s"


def test_retries_stop_when_the_policy_is_spent(slurm: FakeSlurm) -> None:
    slurm.says("squeue", captured("down_squeue_many"))
    began = time.monotonic()
    done = client.run(["squeue"], fast(5.0, 0.3))
    assert done.kind is Kind.UNREACHABLE and 2 <= done.tries <= 5
    assert time.monotonic() - began < 2


def test_until_bounds_every_try_and_pause(slurm: FakeSlurm) -> None:
    slurm.says("scontrol", Said(sleep_s=5))
    began = time.monotonic()
    done = client.run(["scontrol", "show", "job", "7"], Policy(30.0, retry_for_s=60.0), until=began + 0.5)
    assert done.kind is Kind.TIMED_OUT and time.monotonic() - began < 3
    spent = client.run(["scontrol", "show", "job", "7"], client.IN_JOB, until=time.monotonic() - 1)
    assert spent.kind is Kind.TIMED_OUT and "no time left" in spent.why()
    assert len(slurm.calls("scontrol")) == 1  # the second was not even started


def test_a_missing_command_and_a_command_not_slurms(slurm: FakeSlurm) -> None:
    done = client.run(["scancel", "7"], client.CANCEL)  # no scancel among the fakes
    assert (done.kind, done.exit_code, done.tries) == (Kind.MISSING, None, 1)
    assert done.why() == "scancel: not found on PATH" and not done.unsure
    with pytest.raises(ValueError, match="not a Slurm command"):
        client.run(["git", "status"], client.LOOK)


def test_stdin_and_env_reach_the_command(slurm: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "fake-slurm" / "bin" / "scontrol"
    script.write_text('#!/bin/sh\n/bin/cat\necho "conf=$SLURM_CONF"\n')
    script.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": "/etc/x.conf"}
    done = client.run(["scontrol", "-o"], client.LOOK, stdin="show job 7\n", env=env)
    assert done.stdout == "show job 7\nconf=/etc/x.conf\n"


def test_every_policy_has_a_time_limit() -> None:
    policies = [value for value in vars(client).values() if isinstance(value, Policy)]
    assert len(policies) >= 5
    for policy in policies:
        assert 0 < policy.timeout_s < math.inf and policy.retry_for_s < math.inf


# ---- a job that submits ------------------------------------------------------------------------


def test_a_job_submits_without_its_own_slurm_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    job = {
        "SLURM_JOB_ID": "7",
        "SLURM_NNODES": "2",
        "SBATCH_PARTITION": "batch",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "PATH": "/usr/bin",
        "MY_SLURM_NOTE": "kept",
        # The job's heartbeat watcher: a job submitted from here must listen to its own.
        "HPCTRAIN_HEARTBEAT_ADDR": "node1:40123",
    }
    assert client.outside_job_env(job) == {
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "PATH": "/usr/bin",
        "MY_SLURM_NOTE": "kept",
    }
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    with client.outside_the_job():
        assert "SLURM_JOB_ID" not in os.environ and os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert os.environ["SLURM_JOB_ID"] == "7"


# ---- the source tree -----------------------------------------------------------------------------

SLURM_WORDS = set(client.COMMANDS)
# git_state runs git; heartbeat starts each training process's beater (Python, no Slurm command).
ALLOWED = {"hpctrain/slurm/client.py", "hpctrain/submit/git_state.py", "hpctrain/process/heartbeat.py"}


def _modules() -> list[tuple[str, ast.Module]]:
    files = sorted([*(ROOT / "hpctrain").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")])
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text())) for path in files]


def test_only_the_client_runs_slurm() -> None:
    runners = {"subprocess", "os.system", "os.popen", "pty", "asyncio.subprocess"}
    for name, tree in _modules():
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        calls = {
            f"{node.func.value.id}.{node.func.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if isinstance(node.func.value, ast.Name)
        }
        if name not in ALLOWED:
            assert not (imported | calls) & runners, f"{name} runs a process itself: go through hpctrain.slurm.client"
    for allowed in ("hpctrain/submit/git_state.py", "hpctrain/process/heartbeat.py"):
        tree = dict(_modules())[allowed]
        words = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not words & SLURM_WORDS, allowed


def _client_runs(tree: ast.Module) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "client"
    ]


def test_every_client_call_names_its_policy() -> None:
    calls = 0
    for name, tree in _modules():
        for node in _client_runs(tree):
            calls += 1
            has_policy = len(node.args) >= 2 or any(k.arg == "policy" for k in node.keywords)
            assert has_policy, f"{name}:{node.lineno}: client.run without a policy"
    assert calls >= 15
