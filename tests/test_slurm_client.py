"""hpctrain.slurm.client: Slurm's words for "no answer" as kinds (captured on the dev cluster),
then its plumbing on stand-in commands: time limits, retries per policy, a missing command, the
environment of a job that submits; each verb's command and what it reads from Slurm's captured
words; the one table of policies. Last, the source tree: no other module runs Slurm."""

from __future__ import annotations

import ast
import inspect
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fakeslurm import FIXTURES, FakeSlurm, Said, captured, install

from hpctrain.process.standby import STANDBY_ENV
from hpctrain.run.heartbeats import ADDR_ENV
from hpctrain.slurm import client
from hpctrain.slurm.client import POLICIES, Kind, Policy, Purpose
from hpctrain.slurm.node_columns import NodeColumns
from hpctrain.slurm.records import parse_job_record, parse_job_records
from hpctrain.submit import outside_job
from hpctrain.submit.outside_job import outside_job_env, outside_the_job

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
    done = client.run(["squeue", "-h", "-j", "7", "-o", "%T"], POLICIES[Purpose.LOOK])
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
    spent = client.run(["scontrol", "show", "job", "7"], POLICIES[Purpose.IN_JOB], until=time.monotonic() - 1)
    assert spent.kind is Kind.TIMED_OUT and "no time left" in spent.why()
    assert len(slurm.calls("scontrol")) == 1  # the second was not even started


def test_a_missing_command_and_a_command_not_slurms(slurm: FakeSlurm) -> None:
    done = client.run(["scancel", "7"], POLICIES[Purpose.CANCEL])  # no scancel among the fakes
    assert (done.kind, done.exit_code, done.tries) == (Kind.MISSING, None, 1)
    assert done.why() == "scancel: not found on PATH" and not done.unsure
    with pytest.raises(ValueError, match="not a Slurm command"):
        client.run(["git", "status"], POLICIES[Purpose.LOOK])


def test_stdin_and_env_reach_the_command(slurm: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "fake-slurm" / "bin" / "scontrol"
    script.write_text('#!/bin/sh\n/bin/cat\necho "conf=$SLURM_CONF"\n')
    script.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": "/etc/x.conf"}
    done = client.run(["scontrol", "-o"], POLICIES[Purpose.LOOK], stdin="show job 7\n", env=env)
    assert done.stdout == "show job 7\nconf=/etc/x.conf\n"


def test_every_purpose_has_a_policy_with_a_time_limit() -> None:
    assert set(POLICIES) == set(Purpose) and len(POLICIES) >= 5
    for purpose, policy in POLICIES.items():
        assert 0 < policy.timeout_s < math.inf, purpose
        # Retried for as long as there is time: only within the caller's `until` (run refuses
        # a call without one), and never a request that may have been carried out.
        assert policy.retry_for_s < math.inf or purpose in (Purpose.REQUEUE_LOOK, Purpose.REQUEUE), purpose


def test_an_endless_retry_needs_a_deadline(slurm: FakeSlurm) -> None:
    slurm.says("scontrol", Said(out=(FIXTURES / "scontrol" / "running.txt").read_text()))
    with pytest.raises(ValueError, match="needs `until`"):
        client.requeue("1", Purpose.REQUEUE)
    assert slurm.calls() == []
    assert client.show_job("1", Purpose.REQUEUE_LOOK, until=time.monotonic() + 5).ok


# Each purpose's numbers, as they were set where each caller once held its own (a change here is
# a change of behaviour: say why in client.POLICIES).
NUMBERS = {
    Purpose.LOOK: (30.0, 0.0, True),
    Purpose.READ: (30.0, 90.0, True),
    Purpose.SUBMIT: (120.0, 90.0, False),
    Purpose.CANCEL: (60.0, 90.0, True),
    Purpose.IN_JOB: (15.0, 0.0, True),
    Purpose.AFTER_SIGTERM: (3.0, 0.0, True),
    Purpose.KEEPER_LOOK: (15.0, 60.0, True),
    Purpose.RESUBMIT: (30.0, 60.0, False),
    Purpose.GUARDIAN_LOOK: (30.0, 180.0, True),
    Purpose.GUARDIAN_SUBMIT: (60.0, 180.0, False),
    Purpose.REQUEUE_LOOK: (15.0, math.inf, True),
    Purpose.REQUEUE: (15.0, math.inf, False),
    Purpose.UPDATE_PENDING: (15.0, 0.0, True),
    Purpose.KEEPER_PROBE: (20.0, 0.0, True),
    Purpose.NODE_CHECK: (15.0, 0.0, True),
}


def test_the_table_holds_each_purposes_numbers() -> None:
    assert {p: (q.timeout_s, q.retry_for_s, q.retry_unsure) for p, q in POLICIES.items()} == NUMBERS
    # A request that may have been carried out is never sent again: sbatch and scontrol requeue.
    assert {p for p, q in POLICIES.items() if not q.retry_unsure} == {
        Purpose.SUBMIT,
        Purpose.RESUBMIT,
        Purpose.GUARDIAN_SUBMIT,
        Purpose.REQUEUE,
    }


# ---- the verbs -----------------------------------------------------------------------------------


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# (verb called, the command it must run, what Slurm printed (captured), what the verb reads).
VERBS = {
    "show_job": (
        lambda: client.show_job("1", Purpose.IN_JOB).value,
        ["scontrol", "show", "job", "-o", "1"],
        Said(out=fixture("scontrol/running.txt")),
        parse_job_record(fixture("scontrol/running.txt")),
    ),
    "show_job, no answer": (
        lambda: client.show_job("7", Purpose.AFTER_SIGTERM).value,
        ["scontrol", "show", "job", "-o", "7"],
        captured("stopped_scontrol_show_job"),
        None,
    ),
    "show_partition": (
        lambda: client.show_partition("batch", Purpose.IN_JOB).value["GraceTime"],
        ["scontrol", "show", "partition", "-o", "batch"],
        Said(out=fixture("scontrol/partition_batch.txt")),
        "20",
    ),
    "show_config": (
        lambda: {k: client.show_config(Purpose.READ).value[k] for k in ("KillWait", "MaxArraySize")},
        ["scontrol", "show", "config"],
        Said(out=fixture("scontrol/show_config.txt")),
        {"KillWait": "5 sec", "MaxArraySize": "1001"},
    ),
    "show_jobs": (
        # scontrol's prompt before the record (stdin), and an array task's names.
        lambda: [r.names for r in client.show_jobs(["4_0"], Purpose.LOOK).value],
        ["scontrol", "-o"],
        Said(out=fixture("arrays/scontrol_tasks.txt")),
        [r.names for r in parse_job_records(fixture("arrays/scontrol_tasks.txt"))],
    ),
    "requeue": (
        lambda: client.requeue("1", Purpose.REQUEUE, until=time.monotonic() + 5).why(),
        ["scontrol", "requeue", "1"],
        Said(err=fixture("scontrol/requeue_pending.err"), rc=1),
        "exit 1: " + fixture("scontrol/requeue_pending.err").strip().splitlines()[-1],
    ),
    "update_job": (
        lambda: client.update_job("1", {"NumNodes": 2, "NumTasks": 4}, Purpose.UPDATE_PENDING).ok,
        ["scontrol", "update", "jobid=1", "NumNodes=2", "NumTasks=4"],
        Said(),
        True,
    ),
    "submit, a guardian": (
        lambda: client.submit("g.sbatch", "7", dependency="afternotok:7", purpose=Purpose.GUARDIAN_SUBMIT).value,
        ["sbatch", "--parsable", "--dependency=afternotok:7", "g.sbatch", "7"],
        Said(out="42\n"),
        "42",
    ),
    "submit, again without a node": (
        lambda: client.submit("job.sbatch", exclude="node2", nodes=1, purpose=Purpose.RESUBMIT).value,
        ["sbatch", "--parsable", "--exclude=node2", "--nodes=1", "job.sbatch"],
        Said(out="43\n"),
        "43",
    ),
    "submit, no reply": (
        lambda: (lambda sent: (sent.value, sent.unsure))(client.submit("job.sbatch", purpose=Purpose.SUBMIT)),
        ["sbatch", "--parsable", "job.sbatch"],
        captured("stopped_sbatch"),
        (None, True),
    ),
    "cancel": (
        lambda: client.cancel(["1", "99999", "6", "7", "7_3"], Purpose.CANCEL, verbose=True).stderr,
        ["scancel", "-v", "1", "99999", "6", "7", "7_3"],
        Said(err=fixture("scancel_verbose_mixed.txt")),
        fixture("scancel_verbose_mixed.txt"),
    ),
    "signal": (
        lambda: client.signal("7.0", "KILL", Purpose.IN_JOB).ok,
        ["scancel", "--signal=KILL", "7.0"],
        Said(),
        True,
    ),
    "job_state, not queued": (
        lambda: (lambda state: (state.value, state.answered))(client.job_state("7", Purpose.LOOK)),
        ["squeue", "-h", "-r", "-j", "7", "-o", "%T"],
        Said(err=fixture("squeue_gone.err"), rc=1),
        (None, True),
    ),
    "queue, a pending array folded": (
        lambda: client.queue(["4_0", "4_1", "4_2"], Purpose.LOOK).value,
        ["squeue", "-h", "-j", "4_0,4_1,4_2", "-r", "-o", "%i|%T|%r"],
        Said(out=fixture("arrays/squeue_pending_meta.txt")),
        [
            client.QueueRow("4_1", "PENDING", "JobArrayTaskLimit"),
            client.QueueRow("4_2", "PENDING", "JobArrayTaskLimit"),
            client.QueueRow("4_0", "RUNNING", None),
        ],
    ),
    "queue, one row a task": (
        lambda: client.queue(["4_0", "4_1", "4_2"], Purpose.LOOK).value,
        ["squeue", "-h", "-j", "4_0,4_1,4_2", "-r", "-o", "%i|%T|%r"],
        Said(out=fixture("arrays/squeue_r_tasks.txt")),
        [
            client.QueueRow("4_1", "PENDING", "JobArrayTaskLimit"),
            client.QueueRow("4_2", "PENDING", "JobArrayTaskLimit"),
            client.QueueRow("4_0", "RUNNING", None),
        ],
    ),
    "user_jobs": (
        lambda: client.user_jobs("root", Purpose.READ).value,
        ["squeue", "-u", "root", "-h", "-r", "-o", "%i"],
        Said(out=fixture("arrays/squeue_r.txt")),
        ["1_0", "1_1", "1_2"],
    ),
    "time_left": (
        lambda: client.time_left("7", Purpose.IN_JOB).value,
        ["squeue", "-h", "-j", "7", "-o", "%L"],
        Said(out=fixture("squeue_timeleft.txt")),
        "4:58",
    ),
    "job_steps, no answer": (
        lambda: client.job_steps("7", Purpose.IN_JOB).value,
        ["squeue", "-h", "-s", "-j", "7", "-o", "%i"],
        captured("down_squeue_one"),
        [],
    ),
    "nodes, states": (
        lambda: client.nodes(NodeColumns.STATES, Purpose.IN_JOB).value,
        ["sinfo", "-N", "-h", "-a", "-o", "%N|%T|%E"],
        Said(out=fixture("sinfo_not_responding.txt")),
        fixture("sinfo_not_responding.txt"),
    ),
    "nodes, features": (
        lambda: client.nodes(NodeColumns.FEATURES, Purpose.IN_JOB).value,
        ["sinfo", "-N", "-h", "-a", "-o", "%N|%f"],
        Said(out=fixture("sinfo_features.txt")),
        fixture("sinfo_features.txt"),
    ),
    "accounting": (
        lambda: client.accounting(["1_0", "1_1", "1_2"], "JobIDRaw,State,JobID", Purpose.LOOK).value,
        ["sacct", "-n", "-P", "-X", "--duplicates", "-j", "1_0,1_1,1_2", "-o", "JobIDRaw,State,JobID"],
        Said(out=fixture("arrays/sacct.txt")),
        fixture("arrays/sacct.txt"),
    ),
    "associations": (
        lambda: client.associations("root", "Cluster,Account", Purpose.READ).value,
        ["sacctmgr", "-n", "-P", "show", "assoc", "where", "user=root", "format=Cluster,Account"],
        Said(out=fixture("arrays/assoc.txt")),
        fixture("arrays/assoc.txt"),
    ),
    "qos": (
        lambda: client.qos("normal", "Name,MaxSubmitPU,MaxJobsPU", Purpose.READ).value,
        ["sacctmgr", "-n", "-P", "show", "qos", "where", "name=normal", "format=Name,MaxSubmitPU,MaxJobsPU"],
        Said(out=fixture("arrays/qos.txt")),
        fixture("arrays/qos.txt"),
    ),
}


@pytest.mark.parametrize("verb, command, said, read", VERBS.values(), ids=VERBS.keys())
def test_each_verb_runs_its_command_and_reads_slurms_words(
    slurm: FakeSlurm, verb: Callable[[], object], command: list[str], said: Said, read: object
) -> None:
    slurm.says(command[0], said)
    assert verb() == read
    assert slurm.calls()[0] == command


def test_a_verb_without_an_answer_reads_nothing(slurm: FakeSlurm) -> None:
    slurm.says("scontrol", captured("stopped_scontrol_show_partition"))
    shown = client.show_partition("batch", Purpose.IN_JOB)
    assert (shown.kind, shown.value, shown.unsure) == (Kind.NO_REPLY, {}, True)
    assert shown.why() == shown.reply.why() and not shown.ok and not shown.answered
    slurm.says("sinfo", captured("down_sinfo_nodes"))
    assert client.nodes(NodeColumns.STATES, Purpose.IN_JOB).value == ""
    assert client.available(client.SINFO) and not client.available(client.SACCT)


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
        ADDR_ENV: "node1:40123",
        # Its warm standbys' token: the new job draws its own.
        STANDBY_ENV: "7.0.1234",
    }
    assert outside_job_env(job) == {
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "PATH": "/usr/bin",
        "MY_SLURM_NOTE": "kept",
    }
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    with outside_the_job():
        assert "SLURM_JOB_ID" not in os.environ and os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert os.environ["SLURM_JOB_ID"] == "7"


def test_the_variables_left_out_are_the_ones_their_owners_set() -> None:
    # outside_job names the standby's variable itself (hpctrain.process.standby imports torch).
    assert outside_job.STANDBY_ENV == STANDBY_ENV and ADDR_ENV in outside_job.LEFT_OUT


# ---- the source tree -----------------------------------------------------------------------------

SLURM_WORDS = set(client.COMMANDS)
# The client's runner runs Slurm's commands; git_state runs git; heartbeat starts each training
# process's beater, and run/listeners the programs a run dir names (Python, no Slurm command).
ALLOWED = {
    "hpctrain/slurm/runner.py",
    "hpctrain/submit/git_state.py",
    "hpctrain/process/heartbeat.py",
    "hpctrain/run/listeners.py",
    "hpctrain/process/node_health.py",  # a site's own health command (slurm.health.command), never Slurm
}
RUNNERS = {"subprocess", "os.system", "os.popen", "pty", "asyncio.subprocess"}
# The verbs: every function of the client that takes a Purpose.
VERBS = {
    name
    for name, value in vars(client).items()
    if inspect.isfunction(value) and "purpose" in inspect.signature(value).parameters
}


def _modules() -> list[tuple[str, ast.Module]]:
    files = sorted([*(ROOT / "hpctrain").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")])
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text())) for path in files]


def _runs_processes(tree: ast.Module) -> set[str]:
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    calls = {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if isinstance(node.func.value, ast.Name)
    }
    return (imported | calls) & RUNNERS


def test_only_the_client_runs_slurm() -> None:
    modules = dict(_modules())
    for name, tree in modules.items():
        if name not in ALLOWED:
            assert not _runs_processes(tree), f"{name} runs a process itself: go through hpctrain.slurm.client"
    assert _runs_processes(modules["hpctrain/slurm/runner.py"])
    for allowed in ALLOWED:
        words = {
            n.value for n in ast.walk(modules[allowed]) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        assert not words & SLURM_WORDS, allowed  # the runner runs what the client names


def _client_calls(tree: ast.Module, names: set[str]) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "client"
    ]


def _is_purpose(node: ast.expr) -> bool:
    """`Purpose.X`, a module's constant holding one (`ASKING`), or a `purpose` passed on."""
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "Purpose"
    return isinstance(node, ast.Name) and (node.id.isupper() or node.id == "purpose")


def _names_a_purpose(call: ast.Call) -> bool:
    return any(_is_purpose(a) for a in call.args) or any(
        k.arg == "purpose" and _is_purpose(k.value) for k in call.keywords
    )


def test_every_call_names_its_purpose() -> None:
    """Every caller says what it asks for; the client's table says how long that may take."""
    calls = 0
    for name, tree in _modules():
        for node in _client_calls(tree, VERBS):
            calls += 1
            assert _names_a_purpose(node), f"{name}:{node.lineno}: a client verb without a Purpose"
        for node in _client_calls(tree, {"run"}):  # the runner itself, for code not yet on the verbs
            calls += 1
            has_policy = len(node.args) >= 2 or any(k.arg == "policy" for k in node.keywords)
            assert has_policy, f"{name}:{node.lineno}: client.run without a policy"
    assert calls >= 15
