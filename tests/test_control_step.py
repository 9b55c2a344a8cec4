"""The batch script's control step (hpctrain.recovery.control) and hpctrain-follow with a Slurm that
does not answer: its settings through the schema, its Slurm calls within one budget, a requeue
without an answer looked at before it is asked again, a silence that ends nothing."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakeslurm import FIXTURES, FakeSlurm, Said, captured, install

from hpctrain.cli import follow
from hpctrain.config.schema import SlurmConfig
from hpctrain.recovery import control, outage
from hpctrain.recovery import requeue as requeue_calls
from hpctrain.recovery.control import Controller
from hpctrain.recovery.facts import Budgets
from hpctrain.run import exitcodes, fencing, generations, protocol
from hpctrain.run.causes import Action

RUNNING = (FIXTURES / "scontrol" / "running.txt").read_text()  # JobId=1, Restarts=0
REQUEUED = RUNNING.replace("JobState=RUNNING", "JobState=COMPLETING").replace("Restarts=0", "Restarts=1")


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    return install(tmp_path, monkeypatch)


def run_dir(root: Path, config: str = "slurm:\n  nodes: 1\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(config)
    (root / "job.sbatch").write_text("#!/bin/sh\n")
    (root / "submission.json").write_text(json.dumps({"job_id": "1"}))
    return root


def events(root: Path) -> list[dict]:
    path = root / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---- settings through the schema -----------------------------------------------------------------


def test_a_key_config_yaml_lacks_takes_the_schemas_default(tmp_path: Path) -> None:
    defaults = SlurmConfig()
    for text in ("slurm:\n  nodes: 1\n", "trainer:\n  max_steps: 3\n"):
        controller = Controller(run_dir(tmp_path / str(len(text)), text), env={"SLURM_JOB_ID": "1"})
        assert controller.gather.budgets() == Budgets(
            defaults.restart_budget, None, defaults.no_progress_lives, defaults.health.keep_out_after_lives
        )
        assert controller.gather.budgets().total == 108  # not 0: every restart would have failed the job
        assert controller.gather.outcome(1, False, False, []).signal_delay_s == defaults.signal_delay_s


def test_a_wrong_value_names_its_key_and_fails_the_job(tmp_path: Path) -> None:
    root = run_dir(tmp_path / "run", "slurm:\n  restart_budget: {crash: -1}\n")
    with pytest.raises(SystemExit) as ended:
        control.main(["begin", str(root)])
    assert "slurm.restart_budget.crash" in str(ended.value.code) and "must be >= 0" in str(ended.value.code)


def test_the_control_step_imports_neither_torch_nor_hydra() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, hpctrain.recovery.control; "
            "print(sorted(m for m in ('torch', 'hydra', 'optuna') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.stdout.strip() == "[]", loaded.stderr


# ---- the protocol with the batch shell (hpctrain.run.protocol) ---------------------------------------

# argv as the batch shell passes it -> the call the control step reads
CALLS = {
    "begin": (["begin", "/r"], protocol.Begin(Path("/r"))),
    "after-step, a step ended": (
        ["after-step", "/r", "137", "0", "1", "node2,node3", "1700000000.25"],
        protocol.AfterStep(Path("/r"), 137, False, True, ("node2", "node3"), 1700000000.25),
    ),
    # No step launched (a signal first), no exclusion yet, a name the shell would never pass dropped.
    "after-step, nothing launched": (
        ["after-step", "/r", "-", "1", "0", "node2,a b", ""],
        protocol.AfterStep(Path("/r"), None, True, False, ("node2",), 0.0),
    ),
    "the SIGTERM trap": (["cancelled", "/r"], protocol.Trapped(Path("/r"))),
    "requeue, nothing kept out": (["requeue", "/r", ""], protocol.Requeue(Path("/r"), ())),
    "requeue-refused": (
        ["requeue-refused", "/r", "node2", "scontrol: error: Job is pending execution"],
        protocol.RequeueRefused(Path("/r"), ("node2",), "scontrol: error: Job is pending execution"),
    ),
    "a word too few": (["requeue", "/r"], None),
    "no such call": (["resubmit", "/r"], None),
}


@pytest.mark.parametrize("argv, call", CALLS.values(), ids=CALLS.keys())
def test_the_control_steps_calls_as_the_batch_shell_makes_them(argv: list[str], call: object) -> None:
    assert protocol.parse_call(argv) == call


def test_no_such_call_says_how_to_call(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as ended:
        control.main(["resubmit", str(run_dir(tmp_path / "run"))])
    assert str(ended.value.code).startswith("usage: python -m hpctrain.recovery.control begin RUN_DIR")


@pytest.mark.parametrize(
    "answer, line",
    [
        (protocol.Answer(Action.FINISH), "finish"),
        (protocol.Answer(Action.REQUEUE), "requeue"),
        (protocol.Answer(Action.REQUEUE, ("node2", "node3")), "requeue node2,node3"),
        (protocol.Answer(Action.RELAUNCH, ("node2",)), "relaunch node2"),
        (protocol.Answer(Action.RELAUNCH, ("node2",), 2), "relaunch node2 2"),  # slurm.nodes a range
        (protocol.Answer(Action.STOP), "stop"),
        (protocol.Answer(Action.FAIL), "fail"),
    ],
)
def test_the_answer_line_the_batch_shell_reads(answer: protocol.Answer, line: str) -> None:
    assert answer.line() == line


# ---- Slurm calls within one budget -----------------------------------------------------------------


def test_a_silent_controller_costs_the_step_its_budget_not_more(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step ended by SIGTERM is killed KillWait seconds later: the decision must come first."""
    monkeypatch.setattr(control, "SLURM_BUDGET_S", 1.0)
    for name in ("sinfo", "scontrol", "squeue"):
        slurm.says(name, Said(sleep_s=10))
    root = run_dir(tmp_path / "run")
    began = time.monotonic()
    action = Controller(root, env={"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node1"}).after_step(1, False, [])
    assert time.monotonic() - began < 4
    assert action == "requeue"  # a crash, judged without Slurm's facts
    assert "no answer within" in capsys.readouterr().err


# ---- a requeue without an answer ---------------------------------------------------------------------

NO_ANSWER = captured("stopped_scontrol_requeue").err  # "Unexpected message received for job 7"


def refused(root: Path, message: str, **env_vars: str) -> int:
    env = {**os.environ, "SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0", **env_vars}  # the job's own, as in a job
    return Controller(root, env=env).requeue_refused(("node2",), message)


def test_a_requeue_slurm_carried_out_without_saying_so_is_not_asked_again(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.says("scontrol.show", Said(out=REQUEUED)).says("scontrol.update", Said()).says("sbatch", Said(out="99\n"))
    root = run_dir(tmp_path / "run")
    assert refused(root, NO_ANSWER) == exitcodes.BATCH_FINISHED
    assert [c[:2] for c in slurm.calls("scontrol")] == [["scontrol", "show"], ["scontrol", "update"]]
    assert slurm.calls("scontrol")[-1][2:] == ["jobid=1", "ExcNodeList=node2"]
    assert slurm.calls("sbatch") == [] and events(root) == []


def test_a_requeue_not_carried_out_is_asked_again_once_slurm_answers(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.says("scontrol.show", captured("down_scontrol_show_job"), Said(out=RUNNING))
    slurm.says("scontrol.requeue", Said()).says("scontrol.update", Said())
    root = run_dir(tmp_path / "run")
    assert refused(root, NO_ANSWER) == exitcodes.BATCH_FINISHED
    assert [c[1] for c in slurm.calls("scontrol")] == ["show", "show", "requeue", "update"]


def test_no_answer_at_all_ends_the_job_undecided_without_a_second_job(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No answer, and nothing known of the job's time limit: waited REQUEUE_WAIT_S, then the job
    ends undecided (no `fail`: its guardian submits the run again once Slurm is back)."""
    monkeypatch.setattr(control, "REQUEUE_WAIT_S", 1.5)
    slurm.says("scontrol", captured("stopped_scontrol_show_job")).says("sbatch", Said(out="99\n"))
    root = run_dir(tmp_path / "run")
    assert refused(root, NO_ANSWER) == exitcodes.BATCH_UNDECIDED
    assert slurm.calls("sbatch") == []  # Slurm may still requeue this job into the same run dir
    (failure,) = events(root)
    assert failure["cause"] == "requeue_refused" and failure.get("action") is None
    assert "did not answer the requeue" in failure["reason"] and "may still requeue" in failure["reason"]
    assert "guardian" in failure["reason"]


def test_an_outage_is_waited_out_until_the_jobs_time_limit(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's time limit (slurm.time 01:00:00, started 3,548 s ago) leaves 22 s: slurmctld,
    still away, is asked again with growing pauses for all of it (minus the 30 s margin's
    share), not only REQUEUE_WAIT_S; then the job ends undecided."""

    monkeypatch.setattr(control, "REQUEUE_WAIT_S", 1.0)
    monkeypatch.setattr(outage, "OUTAGE_FIRST_PAUSE_S", 0.5)
    monkeypatch.setattr(outage, "OUTAGE_END_MARGIN_S", 18.0)  # 4 s of waiting left: a test's share
    slurm.says("scontrol", captured("stopped_scontrol_show_job")).says("sbatch", Said(out="99\n"))
    root = run_dir(tmp_path / "run")
    started = time.monotonic()
    code = refused(root, NO_ANSWER, HPCTRAIN_ALLOCATED_AT=str(time.time() - 3600 + 22))
    waited = time.monotonic() - started
    assert code == exitcodes.BATCH_UNDECIDED
    assert 3.0 < waited < 15.0, waited
    assert len(slurm.calls("scontrol")) >= 3, slurm.calls("scontrol")  # looked again and again, not once
    (failure,) = events(root)
    assert failure.get("action") is None and "until the job's time limit" in failure["reason"]


def test_a_refusal_once_slurm_answers_goes_on_in_a_new_job(tmp_path: Path, slurm: FakeSlurm) -> None:
    pending = (FIXTURES / "scontrol" / "requeue_pending.err").read_text()
    slurm.says("scontrol.show", Said(out=RUNNING)).says("scontrol.requeue", Said(err=pending, rc=1))
    slurm.says("sbatch", Said(out="99\n"))
    root = run_dir(tmp_path / "run")
    assert refused(root, NO_ANSWER) == exitcodes.BATCH_RESUBMITTED
    assert slurm.calls("sbatch")[0][-2:] == ["--exclude=node2", str(root / "job.sbatch")]
    assert json.loads((root / "submission.json").read_text())["job_id"] == "99"
    (failure,) = events(root)
    assert failure["new_job_id"] == "99" and "Job is pending execution" in failure["reason"]


# ---- the job's own requeue (`control requeue`) ----------------------------------------------------


def requeue(root: Path) -> int:
    env = {**os.environ, "SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0"}
    before = signal.getsignal(signal.SIGTERM)
    try:
        code = Controller(root, env=env).requeue(("node2",))
        # The requeue sends this step SIGTERM: it must outlive it to set ExcNodeList.
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        return code
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_accepted_requeue_then_excludes_the_failed_nodes(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.says("scontrol.show", Said(out=RUNNING)).says("scontrol.requeue", Said()).says("scontrol.update", Said())
    root = run_dir(tmp_path / "run")
    assert requeue(root) == exitcodes.BATCH_REQUEUED
    assert slurm.calls("scontrol") == [
        ["scontrol", "show", "job", "-o", "1"],
        ["scontrol", "requeue", "1"],
        ["scontrol", "update", "jobid=1", "ExcNodeList=node2"],
    ]
    assert events(root) == []


def _decided_on_two_nodes(root: Path) -> None:
    """after-step's record: requeue without node2, the job's spare given up (2 nodes of its 3)."""
    record = {"event": "requeue", "time": 100.0, "job_id": "1", "restart": 0, "cause": "timelimit"}
    (root / "events.jsonl").write_text(json.dumps({**record, "excluded": ["node2"], "nodes": 2}) + "\n")


NUMNODES_REFUSED = Said(err=(FIXTURES / "scontrol" / "numnodes_refused.err").read_text(), rc=1)


@pytest.mark.parametrize(
    ("config", "updates", "calls", "told"),
    [
        # The count first (and the tasks with it, 2 a node here), then the failed node kept out.
        (
            "slurm:\n  nodes: 2\n  ntasks_per_node: 2\n",
            [Said()],
            [["NumNodes=2", "NumTasks=4"], ["ExcNodeList=node2"]],
            [],
        ),
        # Not lowered: node2 kept out of a job still asking for its 3 nodes would leave it
        # waiting for ever. Only slurm.exclude is kept out.
        (
            "slurm:\n  nodes: 2\n  exclude: node9\n",
            [NUMNODES_REFUSED, Said()],
            [["NumNodes=2", "NumTasks=2"], ["ExcNodeList=node9"]],
            ["NumNodes=2 not set", "Requested operation not supported", "ExcNodeList=node9"],
        ),
    ],
    ids=["lowered", "refused"],
)
def test_a_requeue_that_gives_up_the_spare_lowers_the_count_before_it_keeps_nodes_out(
    tmp_path: Path,
    slurm: FakeSlurm,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    config: str,
    updates: list[Said],
    calls: list[list[str]],
    told: list[str],
) -> None:
    monkeypatch.setattr(requeue_calls, "EXCLUDE_TRIES", 1)  # a refusal not asked again for 20 s
    slurm.says("scontrol.show", Said(out=RUNNING)).says("scontrol.requeue", Said()).says("scontrol.update", *updates)
    root = run_dir(tmp_path / "run", config)
    _decided_on_two_nodes(root)
    assert requeue(root) == exitcodes.BATCH_REQUEUED
    assert slurm.calls("scontrol")[2:] == [["scontrol", "update", "jobid=1", *call] for call in calls]
    said = capsys.readouterr().err
    assert all(words in said for words in told), said


def test_a_requeue_without_answer_is_looked_at_before_anything_else(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.says("scontrol.requeue", captured("stopped_scontrol_requeue"))
    slurm.says("scontrol.show", Said(out=RUNNING), Said(out=REQUEUED)).says("scontrol.update", Said())
    root = run_dir(tmp_path / "run")
    assert requeue(root) == exitcodes.BATCH_REQUEUED
    assert [c[1] for c in slurm.calls("scontrol")] == ["show", "requeue", "show", "update"]
    assert slurm.calls("sbatch") == []


@pytest.mark.parametrize(
    ("record", "code", "asked", "written"),
    [
        # scancel since the step ended: Slurm 22.05 would grant the requeue of the cancelled job
        # (seen on the dev cluster: Restarts=1, PENDING), and it would come back.
        ("stop_cancelled", exitcodes.BATCH_CANCELLED, False, ["cancelled"]),
        # an admin's requeue (or a preemption's grace ended) meanwhile: done already, asked no more.
        ("stop_admin_requeued", exitcodes.BATCH_REQUEUED, False, []),
        # the time limit reached meanwhile: no cancel; the requeue brings the job back.
        ("stop_timelimit", exitcodes.BATCH_REQUEUED, True, []),
    ],
)
def test_the_requeue_looks_at_the_job_first(
    tmp_path: Path, slurm: FakeSlurm, record: str, code: int, asked: bool, written: list[str]
) -> None:
    """Records printed by `scontrol show job -o` on the dev cluster (README_stop.md); the
    control step ignores SIGTERM from the decision on, so this look is what sees a scancel."""
    shown = (FIXTURES / "scontrol" / f"{record}.txt").read_text()
    slurm.says("scontrol.show", Said(out=shown)).says("scontrol.requeue", Said()).says("scontrol.update", Said())
    root = run_dir(tmp_path / "run")
    assert requeue(root) == code
    assert (["scontrol", "requeue", "1"] in slurm.calls("scontrol")) is asked
    assert [e["event"] for e in events(root)] == written


def test_a_refused_requeue_goes_on_in_a_new_job(tmp_path: Path, slurm: FakeSlurm) -> None:
    pending = (FIXTURES / "scontrol" / "requeue_pending.err").read_text()
    slurm.says("scontrol.requeue", Said(err=pending, rc=1)).says("scontrol.show", Said(out=RUNNING))
    slurm.says("sbatch", Said(out="99\n"))
    root = run_dir(tmp_path / "run")
    assert requeue(root) == exitcodes.BATCH_RESUBMITTED
    (failure,) = events(root)
    assert failure["new_job_id"] == "99" and "Job is pending execution" in failure["reason"]


def test_without_scontrol_the_batch_shell_is_asked_to_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # an image without Slurm's commands
    root = run_dir(tmp_path / "run")
    assert requeue(root) == exitcodes.CONTROL_NO_SLURM
    assert "scontrol: not found on PATH" in capsys.readouterr().err
    assert events(root) == []


# ---- the batch shell's SIGTERM: a scancel, or Slurm requeuing the job ------------------------------


@pytest.mark.parametrize(
    ("record", "written"),
    [
        ("stop_cancelled", ["cancelled"]),  # scancel: Restarts=0, as this life's
        ("stop_admin_requeued", ["requeue"]),  # an admin's `scontrol requeue`: Restarts=1, recorded as Slurm's
        ("stop_timelimit", []),  # the time limit (Reason=TimeLimit): the guardian submits it again
    ],
)
def test_the_sigterm_trap_tells_a_scancel_from_a_requeue_or_the_time_limit_by_the_jobs_record(
    tmp_path: Path, slurm: FakeSlurm, record: str, written: list[str]
) -> None:
    """Records printed by `scontrol show job -o` on the dev cluster during each (README_stop.md)."""
    slurm.says("scontrol", Said(out=(FIXTURES / "scontrol" / f"{record}.txt").read_text()))
    root = run_dir(tmp_path / "run")
    env = {**os.environ, "SLURM_JOB_ID": "25817002", "SLURM_RESTART_COUNT": "0"}
    assert Controller(root, env=env).cancelled() == 0
    assert [e["event"] for e in events(root)] == written


def test_without_an_answer_the_sigterm_counts_as_a_scancel(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.says("scontrol", captured("stopped_scontrol_show_job"))
    root = run_dir(tmp_path / "run")
    env = {**os.environ, "SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0"}
    assert Controller(root, env=env).cancelled() == 0
    assert [e["event"] for e in events(root)] == ["cancelled"]


@pytest.mark.parametrize(("marked", "cause"), [(True, "preempt"), (False, "node_failure")])
def test_a_restart_after_a_marked_sigterm_is_slurms_requeue_not_a_node_failure(
    tmp_path: Path, slurm: FakeSlurm, marked: bool, cause: str
) -> None:
    """The last life's shell marked its SIGTERM (RunDir.sigterm_mark) and was killed before its
    control step wrote anything: the next start records Slurm's requeue (preempt), then clears
    the mark; without the mark, a restart with nothing written is a node failure."""
    slurm.says("scontrol", Said(out=REQUEUED.replace("JobState=COMPLETING", "JobState=RUNNING")))
    root = run_dir(tmp_path / "run")
    env = {**os.environ, "SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "node1"}
    controller = Controller(root, env=env)
    mark = controller.run.sigterm_mark("1", 0)
    if marked:
        mark.touch()
    assert controller.begin() == 0
    assert [(e["event"], e["cause"], e.get("by")) for e in events(root) if e["event"] == "requeue"] == [
        ("requeue", cause, "slurm")
    ]
    assert not mark.exists()


# ---- hpctrain-follow -----------------------------------------------------------------------------


def followed(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    code = follow.follow(root, poll_s=0.01, out=out)
    return code, out.getvalue(), capsys.readouterr().err


def test_follow_waits_out_a_silent_controller(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    root = run_dir(tmp_path / "run")
    (root / "slurm-1.out").write_text("step 10\n")
    (root / "events.jsonl").write_text(json.dumps({"event": "finish", "time": 1.0, "step": 10, "loss": 0.5}) + "\n")
    gone = Said(err=(FIXTURES / "squeue_gone.err").read_text(), rc=1)
    silent = captured("stopped_squeue_one")
    slurm.says("squeue", silent, silent, Said(out="RUNNING\n"), gone)
    slurm.says("scontrol", Said(out=(FIXTURES / "scontrol" / "completed.txt").read_text()))
    code, out, err = followed(root, capsys)
    assert code == 0 and out == "step 10\n"
    assert err.count("Slurm gives no answer") == 1 and "still following" in err
    assert "job 1 RUNNING" in err and "job 1 COMPLETED" in err and "None" not in err


def test_follow_says_a_job_slurm_forgot_is_gone(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = (FIXTURES / "squeue_gone.err").read_text()
    slurm.says("squeue", Said(err=gone, rc=1)).says("scontrol", Said(err=gone, rc=1))
    code, _, err = followed(run_dir(tmp_path / "run"), capsys)
    assert code == 1 and "job 1 is gone from Slurm without finishing" in err and "None" not in err


def test_follow_without_slurms_commands_says_so(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = followed(run_dir(tmp_path / "run"), capsys)
    assert code == 1 and "squeue: not found on PATH" in err


# ---- a step whose srun started no task, slurmctld away -------------------------------------------


def test_a_launch_lost_to_an_outage_waits_for_slurm_then_launches_again(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """srun gave up on a stopped slurmctld (no task began: no launch mark) and the look at the job
    gets no answer: the control step looks again with growing pauses, and once Slurm answers it
    launches the step again, charged to no budget; the launch mark's file is gone after."""
    monkeypatch.setattr(outage, "OUTAGE_FIRST_PAUSE_S", 0.2)
    away = captured("stopped_scontrol_show_job")
    slurm.says("scontrol.show", away, away, Said(out=RUNNING))
    slurm.says("sinfo", Said(out="node1|mixed|||0|none\n"))
    slurm.says("squeue", Said(out="59:00\n"))
    slurm.says("srun", Said(out="hpctrain-node-check node1 ended=0 lingering=\n"))
    root = run_dir(tmp_path / "run")
    launched_at = time.time() - 25.0
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node1", "SLURM_RESTART_COUNT": "0"}
    action = Controller(root, env=env).after_step(1, False, [], False, launched_at)
    assert action.split()[0] == Action.RELAUNCH.value, capsys.readouterr()
    assert [(e["event"], e.get("cause")) for e in events(root)] == [("relaunch", "launch")]
    assert len(slurm.calls("scontrol")) >= 3  # no answer, no answer, then the record
    assert "slurmctld still gives no answer" in capsys.readouterr().err
    assert not list(root.glob(".launched-*"))


def test_a_launch_whose_tasks_began_is_a_crash_whatever_slurm_says(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.says("scontrol.show", Said(out=RUNNING)).says("sinfo", Said(out="node1|mixed|||0|none\n"))
    slurm.says("squeue", Said(out="59:00\n"))
    slurm.says("srun", Said(out="hpctrain-node-check node1 ended=0 lingering=\n"))
    root = run_dir(tmp_path / "run")
    launched_at = time.time() - 25.0
    (root / f".launched-{launched_at:.6f}").touch()  # a task's mark: it began
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node1", "SLURM_RESTART_COUNT": "0"}
    action = Controller(root, env=env).after_step(1, False, [], False, launched_at)
    assert action.split()[0] == Action.RELAUNCH.value  # a crash is trained again in the job first
    assert [(e["event"], e.get("cause")) for e in events(root)] == [("failure", "crash"), ("relaunch", "crash")]
    assert not list(root.glob(".launched-*"))  # judged: the mark is removed


def test_a_relaunch_takes_its_generation_before_it_is_recorded(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relaunch's generation fences the replaced step's ranks (hpctrain.run.fencing); after a
    newer act (the keeper's submission), the control step is fenced and records nothing."""
    slurm.says("scontrol.show", Said(out=RUNNING)).says("sinfo", Said(out="node1|mixed|||0|none\n"))
    slurm.says("squeue", Said(out="59:00\n"))
    slurm.says("srun", Said(out="hpctrain-node-check node1 ended=0 lingering=\n"))
    root = run_dir(tmp_path / "run")
    generations.take(root, 0, generations.Generation(0, generations.LIFE, "slurm", job_id="1", restart=0))
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node1", "SLURM_RESTART_COUNT": "0"}
    for name, value in env.items():  # the journal's fencing reads this process's own environment
        monkeypatch.setenv(name, value)
    launched_at = time.time() - 25.0  # no launch mark: a launch lost, relaunched uncharged
    action = Controller(root, env=env).after_step(1, False, [], False, launched_at)
    assert action.split()[0] == Action.RELAUNCH.value
    taken = generations.read(root, 2)
    assert taken is not None and (taken.kind, taken.job_id, taken.restart) == (generations.RELAUNCH, "1", 0)
    assert [e["event"] for e in events(root)] == ["relaunch"]
    fencing.forget(root)
    generations.take(root, 2, generations.submission("keeper", generations.new_token()))
    with pytest.raises(fencing.Fenced):
        Controller(root, env=env).after_step(1, False, [], False, time.time() - 25.0)
    assert [e["event"] for e in events(root)] == ["relaunch"]
    fencing.forget(root)


def _launch_lost_relaunch(slurm: FakeSlurm, root: Path, look_after_check: Said) -> str:
    """A launch lost and relaunched on node1, whose check's srun gave up as srun does with
    slurmctld stopped; `look_after_check` is Slurm's answer to the look that follows."""
    slurm.says("scontrol.show", Said(out=RUNNING), look_after_check)
    slurm.says("sinfo", Said(out="node1|mixed|||0|none\n")).says("squeue", Said(out="59:00\n"))
    slurm.says("srun", captured("stopped_srun_step"))
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node1", "SLURM_RESTART_COUNT": "0"}
    return Controller(root, env=env).after_step(1, False, [], False, time.time() - 25.0)


def test_a_node_that_does_not_answer_the_check_while_slurm_does_is_left_out(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    root = run_dir(tmp_path / "run")
    action = _launch_lost_relaunch(slurm, root, Said(out=RUNNING))
    assert action.split()[0] == Action.REQUEUE.value, action  # no other node to relaunch on
    assert "node node1 did not answer the relaunch's check" in capsys.readouterr().err
    (failure,) = [e for e in events(root) if e["event"] == "failure"]
    assert (failure["cause"], failure["nodes"], failure["detected_by"]) == ("node_failure", ["node1"], "check")


def test_no_answer_from_any_node_nor_from_slurm_is_slurms_outage_the_relaunch_goes_unchecked(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    root = run_dir(tmp_path / "run")
    action = _launch_lost_relaunch(slurm, root, captured("stopped_scontrol_show_job"))
    assert action.split()[0] == Action.RELAUNCH.value, action
    assert "slurmctld gives no answer: the relaunch's nodes go unchecked" in capsys.readouterr().err
    assert [e["event"] for e in events(root)] == ["relaunch"]
