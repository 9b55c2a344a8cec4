"""hpctrain-status: run dirs written by hand, a fake Slurm that logs its calls, then real Slurm.

The fake squeue, sacct and scontrol are tiny shell scripts first on PATH; they answer with text
in the formats the dev cluster's Slurm 22.05 prints (one-line `scontrol -o` records, echoed
`scontrol: ` prompts when fed on stdin, "Invalid job id specified" for a forgotten job) and log
every call, so the tests count how many times Slurm is asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers.lock_holder import holding

from hpctrain.cli import status as cli
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.status import discover, metrics_tail, slurm_query
from hpctrain.status.rows import collect
from hpctrain.status.usage import parse_tres

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NO_JOB_ID = "slurm_load_jobs error: Invalid job id specified"


# ---- run dirs, written the way the trainer and hpctrain-submit write them --------------------


def make_run(
    root: Path,
    events: Sequence[dict] = (),
    metrics: Sequence[dict] = (),
    job_id: str | None = None,
    max_steps: int = 100,
    checkpoints: dict[int, float] | None = None,  # step -> mtime
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".hydra").mkdir(exist_ok=True)
    (root / "config.yaml").write_text(f"trainer:\n  max_steps: {max_steps}\n  log_every: 10\nslurm:\n  nodes: 1\n")
    if job_id is not None:
        (root / "submission.json").write_text(json.dumps({"job_id": job_id, "submitted_at": 1.0}))
    if events:
        (root / "events.jsonl").write_text("".join(json.dumps({"time": 1.0, **e}) + "\n" for e in events))
    if metrics:
        (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    for step, mtime in (checkpoints or {}).items():
        (root / "checkpoints").mkdir(exist_ok=True)
        for suffix in (".pt", ".json"):
            path = root / "checkpoints" / f"step_{step:08d}{suffix}"
            path.write_text("{}")
            os.utime(path, (mtime, mtime))
    return root


def start(job_id: str | None = None, restart: int = 0, total_steps: int = 100) -> dict:
    return {
        "event": "start",
        "job_id": job_id,
        "restart": restart,
        "world_size": 1,
        "nodes": ["node1"],
        "resumed_from_step": 0,
        "total_steps": total_steps,
    }


def finish(step: int = 100) -> dict:
    return {"event": "finish", "step": step, "loss": 0.1, "eval_accuracy": 0.9}


def trained(steps: int, eval_every: int = 20) -> list[dict]:
    lines = []
    for step in range(10, steps + 1, 10):
        line = {"step": step, "loss": 2.0 / step, "lr": 1e-3, "samples_per_s": 1000.0 + step}
        if step % eval_every == 0:
            line.update(eval_loss=1.0 / step, eval_accuracy=step / (steps + 1))
        lines.append(line)
    return lines


def scontrol_record(job_id: str, state: str, reason: str = "None", restarts: int = 0) -> str:
    """A `scontrol -o show job` line as the dev cluster prints it (a job name with spaces)."""
    return (
        f"JobId={job_id} JobName=lr sweep #2 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
        f"Nice=0 Account=(null) QOS=(null) JobState={state} Reason={reason} Dependency=(null) Requeue=1 "
        f"Restarts={restarts} BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:22 TimeLimit=00:30:00 TimeMin=N/A "
        "SubmitTime=2026-11-23T09:07:38 EligibleTime=2026-11-23T09:07:39 StartTime=2026-11-23T09:07:39 "
        "Partition=batch AllocNode:Sid=localhost:1134 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 "
        "BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 Command=/runs/a b/job.sbatch "
        "WorkDir=/work StdErr=/runs/a b/slurm-1.out StdIn=/dev/null StdOut=/runs/a b/slurm-1.out Power= "
    )


# ---- a fake Slurm ------------------------------------------------------------------------------

FAKE_COMMAND = """#!/bin/sh
# A stand-in for {name}: logs the call (and scontrol's commands on stdin), answers from files.
echo "{name} $*" >> "$FAKE_SLURM/calls.log"
if [ "{name}" = scontrol ]; then /bin/cat >> "$FAKE_SLURM/scontrol.stdin"; fi
if [ -f "$FAKE_SLURM/{name}.out" ]; then /bin/cat "$FAKE_SLURM/{name}.out"; fi
if [ -f "$FAKE_SLURM/{name}.err" ]; then /bin/cat "$FAKE_SLURM/{name}.err" >&2; fi
exit "$(/bin/cat "$FAKE_SLURM/{name}.rc" 2>/dev/null || echo 0)"
"""


class FakeSlurm:
    def __init__(self, folder: Path, commands: tuple[str, ...] = ("squeue", "sacct", "scontrol")) -> None:
        self.folder = folder
        self.bin = folder / "bin"
        self.bin.mkdir(parents=True)
        for name in commands:
            script = self.bin / name
            script.write_text(FAKE_COMMAND.format(name=name))
            script.chmod(0o755)

    def answer(self, name: str, out: str = "", err: str = "", rc: int = 0) -> None:
        (self.folder / f"{name}.out").write_text(out)
        (self.folder / f"{name}.err").write_text(err)
        (self.folder / f"{name}.rc").write_text(str(rc))

    def no_accounting(self) -> None:
        self.answer("sacct", err="Slurm accounting storage is disabled\n", rc=1)

    def calls(self, name: str | None = None) -> list[list[str]]:
        log = self.folder / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.split() for line in lines if name is None or line.split()[0] == name]

    def scontrol_asked(self) -> list[str]:
        path = self.folder / "scontrol.stdin"
        return [line.split()[-1] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """Only the fake commands on PATH: the real Slurm (and its cluster) cannot answer."""
    fake = FakeSlurm(tmp_path / "fake-slurm")
    monkeypatch.setenv("PATH", str(fake.bin))
    monkeypatch.setenv("FAKE_SLURM", str(fake.folder))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return fake


def run_status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, dict], str]:
    """--json rows by run dir name."""
    code, out, err = run_status(capsys, "--json", *args)
    return code, {Path(row["run_dir"]).name: row for row in json.loads(out)}, err


# ---- Slurm calls: few, whatever the number of runs --------------------------------------------


def test_fifty_runs_cost_one_squeue_one_sacct_one_scontrol(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [str(1000 + i) for i in range(50)]
    for i, job_id in enumerate(ids):
        # 0-14 running, 15-19 waiting for their first start, 20-49 finished.
        events = [start(job_id)] if i < 15 else [] if i < 20 else [start(job_id), finish()]
        make_run(tmp_path / "runs" / f"r{i:02d}", events, job_id=job_id)
    queued, remembered = ids[:20], ids[20:40]  # the last 10: forgotten by Slurm, told by the journal
    slurm.answer(
        "squeue",
        "".join(f"{j}|RUNNING|None\n" for j in queued[:15]) + "".join(f"{j}|PENDING|Resources\n" for j in queued[15:]),
    )
    slurm.no_accounting()
    slurm.answer(
        "scontrol",
        "".join(f"scontrol: show job {j}\n{scontrol_record(j, 'COMPLETED')}\n" for j in remembered) + "scontrol: \n",
        err=f"{NO_JOB_ID}\n" * 10,
        rc=1,
    )
    code, rows, err = rows_of(capsys, "-n", "0", str(tmp_path / "runs"))
    assert code == 0 and err == ""
    assert len(slurm.calls("squeue")) == len(slurm.calls("sacct")) == len(slurm.calls("scontrol")) == 1
    assert len(slurm.calls()) == 3
    squeue = slurm.calls("squeue")[0]
    assert squeue[1:4] == ["-h", "-j", ",".join(ids)] and squeue[-2:] == ["-o", "%i|%T|%r"]
    # Every job (the running ones' usage too, for the cost); states only for what squeue did not list.
    assert slurm.calls("sacct")[0][6] == ",".join(ids)
    assert slurm.scontrol_asked() == ids[20:]  # one scontrol, every leftover id on its stdin
    by_job = {row["job_id"]: row for row in rows.values()}
    assert {by_job[j]["state"] for j in queued[:15]} == {"RUNNING"}
    assert {by_job[j]["state"] for j in queued[15:]} == {"PENDING (Resources)"}
    assert {(by_job[j]["state"], by_job[j]["source"]) for j in remembered} == {("COMPLETED", "scontrol")}
    assert {(by_job[j]["state"], by_job[j]["source"]) for j in ids[40:]} == {("COMPLETED", "journal")}


def test_no_job_ids_no_slurm_call(tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path / "local", [start(), finish()], metrics=trained(100))
    code, rows, _ = rows_of(capsys, str(tmp_path / "local"))
    assert code == 0 and rows["local"]["state"] == "FINISHED" and rows["local"]["job_id"] is None
    assert slurm.calls() == []


def test_accounting_answers_before_scontrol(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path / "done", [start("7"), finish()], job_id="7")
    make_run(tmp_path / "cancelled", [start("8")], job_id="8")
    make_run(tmp_path / "preempted", [start("9")], job_id="9")
    slurm.answer("squeue")  # several ids, none queued: an empty answer, exit 0
    slurm.answer("sacct", "7|COMPLETED\n8|CANCELLED by 1000\n9|PREEMPTED\n")
    code, rows, _ = rows_of(capsys, *(str(tmp_path / n) for n in ("done", "cancelled", "preempted")))
    assert slurm.calls("scontrol") == []  # sacct knew them all
    assert slurm.calls("sacct")[0][1:] == [
        "-n",
        "-P",
        "-X",
        "--duplicates",
        "-j",
        "7,8,9",
        "-o",
        slurm_query.SACCT_FIELDS,
    ]
    assert (rows["done"]["state"], rows["done"]["source"]) == ("COMPLETED", "sacct")
    assert rows["cancelled"]["state"] == "CANCELLED" and rows["cancelled"]["failed"]
    assert rows["preempted"]["state"] == "PREEMPTED"
    assert code == 1  # cancelled before its finish


# ---- states ------------------------------------------------------------------------------------


def test_requeued_job_waits_with_its_cause(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    requeued = [
        start("21"),
        {"event": "checkpoint", "step": 40, "reason": "timelimit", "blocking_s": 0.1, "write_s": 0.2},
        {"event": "requeue", "job_id": "21", "restart": 0, "cause": "timelimit", "excluded": []},
    ]
    make_run(tmp_path / "timelimit", requeued, metrics=trained(40), job_id="21")
    # The batch node died: Slurm requeued it on its own, the journal has no word yet.
    make_run(tmp_path / "node", [start("22")], metrics=trained(30), job_id="22")
    make_run(tmp_path / "waiting", [], job_id="23")  # never started: an ordinary wait
    slurm.answer("squeue", "21|PENDING|BeginTime\n22|PENDING|BeginTime\n23|PENDING|Priority\n")
    code, rows, _ = rows_of(capsys, *(str(tmp_path / n) for n in ("timelimit", "node", "waiting")))
    assert code == 0
    assert rows["timelimit"]["state"] == "PENDING (requeued: timelimit)"
    assert rows["timelimit"]["restarts"] == 1 and rows["timelimit"]["step"] == 40
    assert rows["node"]["state"] == "PENDING (requeued)"
    assert rows["waiting"]["state"] == "PENDING (Priority)"


def test_states_from_scontrol_without_accounting(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path / "held", [start("31")], job_id="31")
    make_run(tmp_path / "oom", [start("32")], job_id="32")
    slurm.answer("squeue", err=f"{NO_JOB_ID}\n", rc=1)  # asked about jobs it no longer lists
    slurm.no_accounting()
    slurm.answer(
        "scontrol",
        "scontrol: show job 31\n"
        + scontrol_record("31", "PENDING", "BeginTime", 2)
        + "\nscontrol: show job 32\n"
        + scontrol_record("32", "OUT_OF_MEMORY")
        + "\nscontrol: \n",
        rc=0,
    )
    code, rows, err = rows_of(capsys, str(tmp_path / "held"), str(tmp_path / "oom"))
    assert err == ""  # neither squeue's "Invalid job id" nor the missing accounting is news
    assert (rows["held"]["state"], rows["held"]["restarts"]) == ("PENDING (requeued)", 2)
    assert rows["oom"]["state"] == "OUT_OF_MEMORY" and rows["oom"]["failed"] and code == 1


def test_journal_decides_when_slurm_forgot(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path / "done", [start("41"), finish()], job_id="41")
    make_run(
        tmp_path / "mistake",
        [{"event": "failure", "cause": "user_error", "message": "bad", "job_id": "42", "restart": 0}],
        job_id="42",
    )
    budget = [
        start("43"),
        {"event": "failure", "job_id": "43", "cause": "crash", "nodes": [], "exit_code": 1},
        {"event": "failure", "job_id": "43", "cause": "budget", "reason": "slurm.max_restarts spent"},
    ]
    make_run(tmp_path / "budget", budget, job_id="43")
    make_run(tmp_path / "scancel", [start("44"), {"event": "cancelled", "job_id": "44", "step": 30}], job_id="44")
    # Resubmitted after a failure: the new job has written nothing yet.
    make_run(tmp_path / "again", [start("45"), budget[2] | {"job_id": "45"}], job_id="46")
    slurm.answer("squeue")
    slurm.no_accounting()
    slurm.answer("scontrol", "scontrol: \n", err=f"{NO_JOB_ID}\n", rc=1)
    names = ("done", "mistake", "budget", "scancel", "again")
    code, rows, _ = rows_of(capsys, *(str(tmp_path / n) for n in names))
    assert {n: rows[n]["state"] for n in names} == {
        "done": "COMPLETED",
        "mistake": "FAILED (user_error)",
        "budget": "FAILED (budget)",
        "scancel": "CANCELLED",
        "again": "UNKNOWN",
    }
    assert {n for n in names if rows[n]["failed"]} == {"mistake", "budget", "scancel"}
    assert code == 1


def test_local_runs_from_their_journal(tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path / "finished", [start(), finish()], metrics=trained(100))
    make_run(
        tmp_path / "ctrl-c", [start(), {"event": "checkpoint", "step": 30, "reason": "interrupt"}], metrics=trained(30)
    )
    make_run(tmp_path / "training", [start()], metrics=trained(50))
    code, rows, _ = rows_of(capsys, *(str(tmp_path / n) for n in ("finished", "ctrl-c", "training")))
    assert rows["finished"]["state"] == "FINISHED"
    assert rows["ctrl-c"]["state"] == "STOPPED (interrupt)" and not rows["ctrl-c"]["failed"]
    assert rows["training"]["state"] == "UNKNOWN"
    assert code == 0 and slurm.calls() == []
    broken = make_run(tmp_path / "broken")
    (broken / "events.jsonl").mkdir()  # unreadable as a file: said on its row, the others still shown
    code, rows, _ = rows_of(capsys, str(broken), str(tmp_path / "finished"))
    assert rows["broken"]["state"] == "UNREADABLE (Is a directory)" and rows["finished"]["state"] == "FINISHED"


def test_a_local_crash_a_dry_run_and_a_run_training_here_say_so(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    # hpctrain-train journals a rank's crash (hpctrain.cli.train) as a batch script does a job's.
    crash = {"event": "failure", "cause": "crash", "exit_code": 1, "rank": 1, "reason": "training process 1 exited"}
    make_run(tmp_path / "crashed", [start(), crash], metrics=trained(30))
    dry = make_run(tmp_path / "dry")
    (dry / "job.sbatch").write_text("#!/bin/bash\n")  # hpctrain-submit dry_run=true: never submitted
    live = make_run(tmp_path / "live", [start()], metrics=trained(50))
    with holding(live):
        code, rows, _ = rows_of(capsys, *(str(tmp_path / n) for n in ("crashed", "dry", "live")))
    assert rows["crashed"]["state"] == "FAILED (crash)" and rows["crashed"]["failed"]
    assert rows["dry"]["state"] == "DRY RUN" and not rows["dry"]["failed"]
    assert rows["live"]["state"] == "RUNNING (local)"
    assert code == 1 and slurm.calls() == []  # a failed run: exit 1, as docs/operate.md says
    # Its command gone, the same run dir has no end recorded: not said to be running.
    _, rows, _ = rows_of(capsys, str(live))
    assert rows["live"]["state"] == "UNKNOWN"


def test_no_squeue_on_path_rows_from_the_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    make_run(tmp_path / "run", [start("51"), finish()], metrics=trained(100), job_id="51")
    code, out, err = run_status(capsys, str(tmp_path / "run"))
    assert code == 0
    assert "note: squeue not found on PATH" in err
    assert "COMPLETED" in out.splitlines()[1] and "100/100" in out


def test_squeue_that_cannot_reach_the_controller_is_a_note(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path / "run", [start("61")], metrics=trained(20), job_id="61")
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
    slurm.answer("squeue", err=down, rc=1)
    slurm.answer("sacct", err="sacct: error: Problem talking to the database: Connection refused\n", rc=1)
    slurm.answer("scontrol", err=down, rc=1)
    code, out, err = run_status(capsys, str(tmp_path / "run"))
    assert code == 0 and "UNKNOWN" in out
    assert "note: squeue failed: slurm_load_jobs error: Unable to contact slurm controller" in err
    assert "note: scontrol failed" in err and "Traceback" not in err
    # Accounting that fails (not "disabled") is said too, with the line that tells why.
    assert "note: sacct failed: sacct: error: Problem talking to the database: Connection refused" in err


# ---- numbers of a row ----------------------------------------------------------------------------


def test_row_numbers_and_table(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    make_run(
        tmp_path / "runs" / "a",
        [start("71", total_steps=200)],
        metrics=trained(70),
        job_id="71",
        max_steps=0,
        checkpoints={40: now - 3 * 3600, 60: now - 5 * 60 - 5},
    )
    make_run(tmp_path / "runs" / "b", [], job_id="72", max_steps=500)  # queued: no start yet
    slurm.answer("squeue", "71|RUNNING|None\n72|PENDING|Priority\n")
    code, rows, _ = rows_of(capsys, str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b"))
    a = rows["a"]
    assert (a["step"], a["max_steps"], a["checkpoint_step"]) == (70, 200, 60)  # total_steps of the start
    assert a["loss"] == pytest.approx(2.0 / 70) and a["samples_per_s"] == pytest.approx(1070.0)
    assert a["eval_accuracy"] == pytest.approx(60 / 71)  # the last evaluation, two lines back
    assert 300 <= a["checkpoint_age_s"] < 320
    assert (rows["b"]["step"], rows["b"]["max_steps"], rows["b"]["checkpoint_age_s"]) == (None, 500, None)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_status(capsys, "runs/a", "runs/b")
    header, first, second = out.splitlines()
    assert header.split() == [
        "JOB",
        "STATE",
        "RESTARTS",
        "STEP",
        "LOSS",
        "EVAL",
        "ACC",
        "SAMPLES/S",
        "CKPT",
        "AGE",
        "NODE-H",
        "GPU-H",
        "RUN",
        "DIR",
    ]
    cells = first.split()
    assert cells[:8] + cells[9:] == ["71", "RUNNING", "0", "70/200", "0.0286", "0.8451", "1070", "5m", "-", "runs/a"]
    # Its one node held since its `start` (at t=1 s in this journal) until now; no GPU: `-`.
    assert float(cells[8]) == pytest.approx((time.time() - 1.0) / 3600, rel=1e-3)
    assert second.split() == ["72", "PENDING", "(Priority)", "0", "?/500", "-", "-", "-", "-", "-", "-", "runs/b"]
    assert code == 0


def test_metrics_tail_matches_a_full_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = trained(3000, eval_every=500)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3010, "lo')  # a torn last line
    monkeypatch.setattr(metrics_tail, "BLOCK_BYTES", 97)  # lines cross every block boundary
    tail = metrics_tail.read_tail(path)
    assert (tail.step, tail.loss, tail.samples_per_s) == (3000, 2.0 / 3000, 4000.0)
    assert (tail.eval_step, tail.eval_accuracy) == (3000, 3000 / 3001)
    lines[-1].pop("eval_accuracy"), lines[-1].pop("eval_loss")
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert metrics_tail.read_tail(path).eval_step == 2500
    # A run that never evaluated: the search stops at the cap instead of reading everything.
    assert metrics_tail.read_tail(path, max_bytes_back=2000).eval_step is None
    path.write_text('{"step": 5, "loss": null, "lr": 0.1, "samples_per_s": 10.0}\n')
    assert str(metrics_tail.read_tail(path).loss) == "nan"  # a diverged loss: nan, not "no loss"
    assert metrics_tail.read_tail(tmp_path / "none.jsonl").step is None


def test_a_hundred_long_runs_render_fast(tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    # The worst case: runs that never evaluate, so the search for an eval line reads back the
    # whole file (or up to its cap).
    line = json.dumps({"step": 10, "loss": 0.5, "lr": 1e-3, "samples_per_s": 1000.0}) + "\n"
    metrics = line * 3000
    for i in range(100):
        run = make_run(
            tmp_path / "runs" / f"{i:03d}", [start(str(2000 + i))], job_id=str(2000 + i), checkpoints={10: time.time()}
        )
        (run / "metrics.jsonl").write_text(metrics)
    slurm.answer("squeue", "".join(f"{2000 + i}|RUNNING|None\n" for i in range(100)))
    code, out, _ = run_status(capsys, "-n", "0", str(tmp_path / "runs"))
    # squeue, and sacct for the cost (its usage of every job, running ones too).
    assert code == 0 and len(out.splitlines()) == 101 and [c[0] for c in slurm.calls()] == ["squeue", "sacct"]
    # The CPU time it costs, not the wall time: on a loaded machine that is the others' too. Against
    # a baseline taken in the same run, as this machine's pace drifts by a third from run to run
    # (1.8 to 2.9 s of CPU for the same work, and an absolute bound of 2 s failed in CI): reading
    # the 100 metrics files once, which any status must do (300,000 lines of JSON). The first call
    # above was the warm-up (the modules status imports on first use, the page cache); then three
    # rounds in rotated order, compared by their medians, as one round alone was once 2.6x in CI
    # where it is 1.6x to 1.9x on a quiet machine.
    status_cpu: list[float] = []
    baseline_cpu: list[float] = []
    for round_ in range(3):
        for measure in ("status", "baseline") if round_ % 2 == 0 else ("baseline", "status"):
            started, started_cpu = time.perf_counter(), cpu_s()
            if measure == "status":
                assert run_status(capsys, "-n", "0", str(tmp_path / "runs"))[0] == 0
                status_cpu.append(cpu_s() - started_cpu)
                elapsed = time.perf_counter() - started
            else:
                for i in range(100):
                    read_jsonl(tmp_path / "runs" / f"{i:03d}" / "metrics.jsonl")
                baseline_cpu.append(cpu_s() - started_cpu)
    used, baseline = statistics.median(status_cpu), statistics.median(baseline_cpu)
    ratio = used / baseline
    print(f"100 runs: {elapsed:.3f} s, {used:.3f} s of CPU (median of 3), {ratio:.2f}x reading their metrics once")
    assert used < 2.5 * baseline, f"{used:.2f} s of CPU for 100 runs, {ratio:.2f}x reading their metrics"


def cpu_s() -> float:
    """CPU seconds used by this process and the children it has waited for (the fake squeue)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


# ---- which runs ----------------------------------------------------------------------------------


def test_sweep_dir_expands_to_its_points_in_order(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "multirun" / "2026-01-02" / "10-00-00"
    for point in range(12):
        make_run(sweep / str(point), [start(str(300 + point))], job_id=str(300 + point))
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    slurm.answer("squeue", "".join(f"{300 + p}|RUNNING|None\n" for p in range(12)))
    code, out, _ = run_status(capsys, "--json", "--limit", "3", str(sweep))  # named sweeps are not cut
    points = [Path(row["run_dir"]).name for row in json.loads(out)]
    assert points == [str(p) for p in range(12)] and [c[0] for c in slurm.calls()] == ["squeue", "sacct"]


def test_a_sweep_s_cost_heads_the_table_and_rides_on_its_rows(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "multirun" / "2026-01-02" / "10-00-00"
    for point, job_id in enumerate(("61", "62")):
        events = [{**start(job_id), "time": 10.0}, {**finish(), "time": 60.0}]
        make_run(sweep / str(point), events, [{"step": 100, "loss": 0.1, "time": 59.0}], job_id=job_id)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    slurm.answer("squeue")
    # As the dev cluster's accounting prints them when it counts GPUs (tests/fixtures/sacct_usage).
    slurm.answer(
        "sacct",
        "61|COMPLETED|61|100|billing=1,cpu=1,gres/gpu=2,node=1\n62|COMPLETED|62|200|billing=2,cpu=2,gres/gpu=4,node=2\n",
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_status(capsys, "multirun/2026-01-02/10-00-00")
    header, columns, first, second = out.splitlines()
    # 100 s x 2 GPUs + 200 s x 4 GPUs; each run kept its 49 s of training (10 s to step 100 at 59 s).
    kept = (49 * 2 + 49 * 4) / 3600
    assert header == (
        f"sweep multirun/2026-01-02/10-00-00: 2 runs; 0.28 GPU-h allocated, {kept:.3f} on kept steps "
        f"({100 * kept / (1000 / 3600):.1f}%); 0.14 node-h (from sacct)"
    )
    assert columns.split()[-4:] == ["NODE-H", "GPU-H", "RUN", "DIR"]
    assert first.split()[-3:] == ["0.028", "0.056/0.027", "multirun/2026-01-02/10-00-00/0"]
    assert second.split()[-3:] == ["0.11", "0.22/0.054", "multirun/2026-01-02/10-00-00/1"]
    code, rows, _ = rows_of(capsys, "multirun/2026-01-02/10-00-00")
    assert rows["0"]["cost"]["gpu_hours"] == pytest.approx(200 / 3600, abs=1e-6)
    assert rows["1"]["cost"]["allocations"][0]["gpus"] == 4
    for row in rows.values():
        assert row["sweep"]["runs"] == 2 and row["sweep"]["source"] == "sacct"
        assert row["sweep"]["gpu_hours"] == pytest.approx(1000 / 3600, abs=1e-6)
        assert row["sweep"]["kept_gpu_hours"] == pytest.approx(kept, abs=1e-6)
        assert row["sweep"]["sweep_dir"] == str(sweep.resolve())


def test_default_is_the_recent_runs_under_runs(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # conf/config.yaml: hydra.run.dir runs/<date>/<time>, hydra.sweep.dir runs/multirun/<date>/<time>/<n>.
    runs = [tmp_path / "runs" / "2026-01-01" / f"0{h}-00-00" for h in range(5)]
    runs.append(tmp_path / "runs" / "multirun" / "2026-01-02" / "08-00-00" / "0")
    for age, run in enumerate(reversed(runs)):
        make_run(run, [start(), finish()])
        for name in ("events.jsonl", "config.yaml"):
            os.utime(run / name, (1e9 - age * 60, 1e9 - age * 60))
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("defaults: []\n")  # a Hydra config folder, not a run
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_status(capsys, "--json")
    shown = [Path(row["run_dir"]) for row in json.loads(out)]
    assert shown == [run.resolve() for run in reversed(runs)]  # most recent first
    code, out, _ = run_status(capsys, "--json", "-n", "2")
    assert [Path(row["run_dir"]) for row in json.loads(out)] == [runs[-1].resolve(), runs[-2].resolve()]
    (tmp_path / "runs").rename(tmp_path / "elsewhere")
    code, out, err = run_status(capsys)
    assert code == 2 and err.startswith("error: runs: no such directory")


def test_a_path_that_is_not_a_run_is_named(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    good = make_run(tmp_path / "good", [start(), finish()])
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    cases = {
        "empty": "is not a run dir, a sweep dir or a folder holding runs (no events.jsonl",
        "file.txt": "is not a run dir (it is a file)",
        "missing": ": no such directory",
    }
    for name, words in cases.items():
        code, out, err = run_status(capsys, str(good), str(tmp_path / name))
        assert code == 2 and out == "", err
        assert err.startswith(f"error: {tmp_path / name}") and words in err and err.count("\n") == 1, err


# ---- output forms ------------------------------------------------------------------------------


def test_json_round_trip(tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    make_run(tmp_path / "a", [start("81")], metrics=trained(50), job_id="81", checkpoints={50: now})
    make_run(tmp_path / "b", [start(), finish()], metrics=trained(100))
    slurm.answer("squeue", "81|RUNNING|None\n")
    code, out, _ = run_status(capsys, "--json", str(tmp_path / "a"), str(tmp_path / "b"))
    parsed = json.loads(out)
    # What --json prints is what the rows hold, field for field, in the order given.
    rows = collect([tmp_path / "a", tmp_path / "b"], now=now, with_goodput=True).rows
    expected = [{**row.to_json(), "sweep": None} for row in rows]  # a row of a named sweep: its total
    for got, want in zip(parsed, expected, strict=True):
        assert got.keys() == want.keys()
        assert abs(got.pop("checkpoint_age_s") or 0) < 30 and abs(want.pop("checkpoint_age_s") or 0) < 30
        # A running run's allocation counts until the moment it is read.
        got_cost, want_cost = got.pop("cost"), want.pop("cost")
        assert got_cost["node_hours"] == pytest.approx(want_cost["node_hours"], abs=30 / 3600)
        assert got == want
    assert [row["state"] for row in parsed] == ["RUNNING", "FINISHED"]
    assert parsed[0]["run_dir"] == str((tmp_path / "a").resolve()) and parsed[1]["job_id"] is None


def test_failed_run_makes_the_exit_code_non_zero(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path / "ok", [start("91"), finish()], job_id="91")
    make_run(tmp_path / "bad", [start("92")], job_id="92")
    slurm.no_accounting()
    slurm.answer("squeue", "")
    slurm.answer("scontrol", scontrol_record("91", "COMPLETED") + "\n" + scontrol_record("92", "FAILED") + "\n")
    assert run_status(capsys, str(tmp_path / "ok"))[0] == 0
    code, out, _ = run_status(capsys, str(tmp_path / "ok"), str(tmp_path / "bad"))
    assert code == 1 and "FAILED" in out
    assert run_status(capsys, "--json", str(tmp_path / "bad"))[0] == 1


def test_plot_writes_a_png(tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    # A resumed run logs steps 30..40 twice: the curve takes the later values.
    resumed = trained(40) + trained(60)[2:]
    make_run(tmp_path / "a", [start(), finish(60)], metrics=resumed)
    make_run(tmp_path / "b", [start()])  # nothing logged yet
    code, out, err = run_status(
        capsys, "--plot", str(tmp_path / "curves.png"), str(tmp_path / "a"), str(tmp_path / "b")
    )
    assert code == 0, err
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC
    assert f"drawn to {tmp_path / 'curves.png'}" in err  # it says where the picture went
    from hpctrain.status.plot import curves

    loss = curves(tmp_path / "a")["loss"]
    assert [s for s, _ in loss] == list(range(10, 61, 10))
    code, _, err = run_status(capsys, "--plot", str(tmp_path / "no" / "dir.png"), str(tmp_path / "a"))
    assert code == 2 and err.startswith(f"error: --plot: cannot write {tmp_path / 'no' / 'dir.png'}")


def test_plot_without_matplotlib_says_how_to_install(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path / "a", [start(), finish()], metrics=trained(100))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, out, err = run_status(capsys, "--plot", str(tmp_path / "c.png"), str(tmp_path / "a"))
    assert code == 2 and out == "" and not (tmp_path / "c.png").exists()
    assert err == "error: --plot needs matplotlib, which is not installed: pip install 'hpctrain[plot]'\n"


# Seconds the watch gets to draw its first frame: Python's start and the imports take under 1 s
# here, measured with both cores busy (4 CPU-bound processes beside it); only a watch that never
# draws should reach this.
FIRST_FRAME_S = 60
# Seconds from SIGINT to the exit: measured 0.2 s at most with both cores busy (the handler raises
# at once, mid-refresh or mid-sleep); a SIGINT that is ignored never ends the watch at all.
STOP_S = 30


def read_lines(proc: subprocess.Popen[str], count: int, timeout_s: float) -> list[str]:
    """`count` lines of the process's stdout, or fewer if `timeout_s` passes first (no hang)."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [lines.put(stdout.readline()) for _ in range(count)], daemon=True).start()
    deadline = time.monotonic() + timeout_s
    got = []
    with contextlib.suppress(queue.Empty):
        while len(got) < count:
            got.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
    return got


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_watch_redraws_until_ctrl_c(tmp_path: Path, sigint: str) -> None:
    """The real command in a subprocess: SIGINT ends it quietly, with the last refresh's code.
    Also when it was started with SIGINT ignored, as a script's `cmd &` starts it (a shell without
    job control does that): that is how this test once ran, and the watch never ended."""
    run = make_run(tmp_path / "run", [start(), finish()], metrics=trained(100))
    env = {**os.environ, "PATH": str(tmp_path / "no-slurm"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.cli.status", "--json", "--watch", "0.2", str(run)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if sigint == "ignored" else None,
    )
    try:
        # SIGINT only once the loop runs (three frames drawn), never during the start.
        lines = read_lines(proc, 3, FIRST_FRAME_S)
        assert len(lines) == 3 and all(lines), f"{len(lines)} frames in {FIRST_FRAME_S} s"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=STOP_S)
    finally:
        if proc.poll() is None:  # failed: leave no watch running
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert all(rows[0]["state"] == "FINISHED" for rows in map(json.loads, lines))
    # `--watch PATH`: argparse hands the path to --watch; it is taken as a path, every 5 s.
    parsed = cli.options(["--watch", str(run)])
    assert parsed.watch == cli.DEFAULT_WATCH_S and parsed.paths == [run]


def test_watch_tables_are_told_apart_by_their_time(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path / "bad", [{"event": "failure", "cause": "user_error", "message": "bad"}])
    naps = []

    def nap(seconds: float) -> None:  # the third nap is the user's Ctrl-C
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", nap)
    code, out, err = run_status(capsys, "--watch", "7", str(tmp_path / "bad"))
    assert naps == [7.0] * 3 and code == 1 and err == ""  # the last table's code: a failed run
    assert out.count("hpctrain-status, every 7 s,") == 3 and out.count("FAILED (user_error)") == 3


def test_a_users_mistake_through_the_real_command(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", str(tmp_path / "nope")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == f"error: {tmp_path / 'nope'}: no such directory\n"
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", "--watch", "-1", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--watch: SECONDS must be > 0" in done.stderr


def test_discover_search_stops_at_run_dirs(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs" / "a", [start()])
    make_run(run / "checkpoints" / "looks-like-a-run", [start()])  # never searched: inside a run
    assert discover.run_dirs([tmp_path / "runs"]) == [run]


# ---- the real Slurm dev cluster (no accounting: sacct fails there, as on many small sites) -------

LOGGED_COMMAND = """#!/bin/sh
# The real {name}, each call logged first.
echo "{name} $*" >> "{log}"
exec {real} "$@"
"""
LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    """The suite's cluster, strict like a site: accounting on, so sacct answers."""
    from slurmtools import start_cluster

    return start_cluster()


@pytest.fixture(scope="module")
def lenient_env() -> dict[str, str]:
    """One node without accounting (sacct: "accounting storage is disabled"), as on many small sites."""
    from slurmtools import start_cluster

    return start_cluster(accounting=False)


def logged_slurm(env: dict[str, str], folder: Path) -> tuple[dict[str, str], Path]:
    """(env with squeue, sacct and scontrol logging each call before running the real one, the log)."""
    import shutil

    bin_dir, log = folder / "logged-bin", folder / "slurm-calls.log"
    bin_dir.mkdir(parents=True)
    for name in ("squeue", "sacct", "scontrol"):
        real = shutil.which(name, path=env["PATH"])
        assert real, f"{name} not on the dev cluster's PATH"
        (bin_dir / name).write_text(LOGGED_COMMAND.format(name=name, log=log, real=real))
        (bin_dir / name).chmod(0o755)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}, log


def status_json(env: dict[str, str], *runs: Path) -> tuple[int, dict[str, dict], str]:
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", "--json", *map(str, runs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, {Path(row["run_dir"]).name: row for row in json.loads(done.stdout)}, done.stderr


def calls(log: Path) -> list[str]:
    calls = [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


@pytest.mark.slurm
def test_a_real_job_from_the_queue_to_completed(lenient_env: dict[str, str], tmp_path: Path) -> None:
    from slurmtools import job_output, submit, wait_finished

    cluster_env = lenient_env  # no accounting: after the queue, scontrol answers

    env, log = logged_slurm(cluster_env, tmp_path)
    # A job Slurm has forgotten (older than MinJobAge, no accounting): its journal says how it ended.
    forgotten = make_run(tmp_path / "forgotten", [start("999999", total_steps=20), finish(20)], job_id="999999")
    run = tmp_path / "run"
    # Held until status has seen it queued once: a job of 20 steps may otherwise end before the
    # first look (a Python start on a loaded machine is seconds too).
    job_ids, _ = submit(
        cluster_env,
        run,
        "trainer.max_steps=20",
        "trainer.log_every=5",
        "trainer.eval_every=10",
        "slurm.extra=['--hold']",
    )
    seen = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        code, rows, err = status_json(env, run, forgotten)
        # Two runs: one squeue for both; while the job is queued or running nothing else is asked.
        asked = calls(log)
        assert asked[0] == "squeue" and asked.count("squeue") == 1 and len(asked) <= 3, asked
        seen.append(rows["run"]["state"])
        if rows["run"]["state"].split()[0] not in LIVE:
            break
        assert rows["run"]["job_id"] == job_ids[0] and rows["run"]["source"] == "squeue"
        if len(seen) == 1:
            subprocess.run(["scontrol", "release", job_ids[0]], env=cluster_env, check=True, capture_output=True)
        time.sleep(0.5)
    print("states seen:", seen)
    assert seen[0].split()[0] == "PENDING", seen  # held
    assert wait_finished(cluster_env, job_ids[0]) == "COMPLETED", job_output(run)
    code, rows, err = status_json(env, run, forgotten)
    assert calls(log) == ["squeue", "sacct", "scontrol"]  # sacct fails here: no accounting
    assert err == ""  # a site without accounting is normal, not worth a note
    done = rows["run"]
    assert (done["state"], done["source"], done["step"], done["max_steps"]) == ("COMPLETED", "scontrol", 20, 20)
    assert done["eval_accuracy"] is not None and done["checkpoint_step"] == 20 and done["restarts"] == 0
    assert (rows["forgotten"]["state"], rows["forgotten"]["source"]) == ("COMPLETED", "journal")
    assert code == 0
    table = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", str(run)], env=env, capture_output=True, text=True, timeout=120
    )
    assert table.stdout.splitlines()[1].split()[:4] == [job_ids[0], "COMPLETED", "0", "20/20"], table.stdout


@pytest.mark.slurm
def test_a_site_without_accounting_falls_back_to_the_journal(lenient_env: dict[str, str], tmp_path: Path) -> None:
    """One forgotten job: the real squeue fails ("Invalid job id specified"), the real sacct
    fails (accounting storage is disabled), the real scontrol does not know it either."""
    env, log = logged_slurm(lenient_env, tmp_path)
    failed = make_run(
        tmp_path / "failed",
        [start("999998"), {"event": "failure", "job_id": "999998", "cause": "budget", "reason": "spent"}],
        job_id="999998",
    )
    code, rows, err = status_json(env, failed)
    assert calls(log) == ["squeue", "sacct", "scontrol"]
    assert err == "" and code == 1
    assert (rows["failed"]["state"], rows["failed"]["source"]) == ("FAILED (budget)", "journal")


@pytest.mark.slurm
def test_a_real_time_limit_requeue_shows_its_cause(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """The time-limit warning sent by hand: the job saves, writes `requeue` (timelimit) and
    Slurm holds it PENDING with Reason=BeginTime; status says why it waits, then it finishes."""
    from slurmtools import job_output, lift_requeue_hold, submit, wait_finished, wait_for_step

    env, log = logged_slurm(cluster_env, tmp_path)
    run = tmp_path / "run"
    (job_id,), _ = submit(cluster_env, run, "trainer.max_steps=3000", "trainer.log_every=10", "trainer.eval_every=0")
    wait_for_step(run, 20)
    subprocess.run(["scancel", "--signal=USR2", "--full", job_id], env=cluster_env, check=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        code, rows, err = status_json(env, run)
        if rows["run"]["state"].startswith("PENDING"):
            break
        time.sleep(0.5)
    waiting = rows["run"]
    assert waiting["state"] == "PENDING (requeued: timelimit)", job_output(run)
    assert waiting["restarts"] == 1 and waiting["source"] == "squeue" and code == 0
    assert calls(log)[-2:] == ["squeue", "sacct"]  # sacct for the cost only: squeue knows the state
    lift_requeue_hold(cluster_env, job_id)
    assert wait_finished(cluster_env, job_id, timeout_s=600) == "COMPLETED", job_output(run)
    # slurmctld tells slurmdbd of the end through a queue, after scontrol knows it: sacct may say
    # RUNNING for a moment (longer on a loaded machine). The bound is for a record never sent.
    deadline = time.monotonic() + 60
    code, rows, err = status_json(env, run)
    while rows["run"]["state"].split()[0] in LIVE and time.monotonic() < deadline:
        time.sleep(0.5)
        code, rows, err = status_json(env, run)
    assert (rows["run"]["state"], rows["run"]["step"], rows["run"]["restarts"]) == ("COMPLETED", 3000, 1)
    assert rows["run"]["source"] == "sacct"  # accounting knows the ended job (and both its lives)
    assert calls(log)[-2:] == ["squeue", "sacct"]
    assert code == 0
    # Its cost is accounting's: each life's ElapsedRaw x its nodes (a CPU job: no GPU-hours).
    done = subprocess.run(
        ["sacct", "-n", "-P", "-X", "--duplicates", "-j", job_id, "-o", "ElapsedRaw,AllocTRES"],
        env=cluster_env,
        capture_output=True,
        text=True,
        check=True,
    )
    lives = [line.split("|") for line in done.stdout.splitlines() if line.strip()]
    cost = rows["run"]["cost"]
    print(f"sacct: {lives}; hpctrain-status: {cost}")
    assert [a["elapsed_s"] for a in cost["allocations"]] == [float(elapsed) for elapsed, _ in lives]
    node_s = sum(int(elapsed) * parse_tres(tres)["node"] for elapsed, tres in lives)
    assert cost["node_hours"] == pytest.approx(node_s / 3600, abs=1e-6)
    assert (cost["source"], cost["gpu_hours"], len(lives)) == ("sacct", None, 2)
    assert 0 < cost["kept_node_hours"] < cost["node_hours"]


# ---- goodput: --detail and --json ---------------------------------------------------------------


def test_detail_and_json_show_each_life_and_the_goodput(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    preempted = {
        "event": "checkpoint",
        "time": 150.0,
        "step": 50,
        "reason": "preempt",
        "blocking_s": 1.0,
        "write_s": 1.0,
    }
    events = [
        {**start("95"), "time": 100.0},
        preempted,
        {"event": "requeue", "time": 152.0, "job_id": "95", "cause": "preempt"},
        {**start("95", restart=1), "resumed_from_step": 50, "resumed_from": "disk", "time": 300.0},
        {"event": "finish", "time": 352.0, "step": 100},
    ]
    metrics = [{"step": 50, "loss": 1.0, "time": 148.0}, {"step": 100, "loss": 0.5, "time": 350.0}]
    make_run(tmp_path / "r", events, metrics, job_id="95")
    slurm.no_accounting()
    slurm.answer("squeue", "")
    slurm.answer("scontrol", "")
    code, out, _ = run_status(capsys, "--detail", str(tmp_path / "r"))
    assert code == 0, out
    # 104 s allocated over two lives, 98 s of it training kept steps; the 148 s between them
    # (Slurm's hold and the queue) are shown apart.
    assert "goodput 94.2%: 1m38s kept of 1m44s allocated" in out, out
    assert "checkpoint stalls 2.0s, redone 4.0s; waits between lives 2m28s" in out, out
    lines = out.splitlines()
    life_lines = [line.split() for line in lines[2:4]]
    assert lines[1].split()[0] == "LIFE" and lines[4].startswith("goodput")
    # STATE FROM: a fresh start has none; the second life's state came from a checkpoint.
    assert [(cells[0], cells[9], cells[10], cells[11]) for cells in life_lines] == [
        ("1", "0-50", "-", "requeue"),
        ("2", "50-100", "disk", "finish"),
    ]
    # No accounting, no GPU: each allocation's 52 s on its one node, from the records.
    assert lines[5] == "cost: no GPUs; 0.029 node-h allocated, 0.027 on kept steps (94.2%) (from records)"
    assert lines[6].split() == [
        "ALLOC",
        "JOB",
        "RESTART",
        "ELAPSED",
        "NODES",
        "GPUS",
        "NODE-H",
        "GPU-H",
        "KEPT",
        "GPU-H",
        "SOURCE",
        "GPUS",
        "FROM",
    ]
    assert [line.split() for line in lines[7:]] == [
        ["1", "95", "0", "52.0s", "1", "-", "0.014", "-", "-", "records", "-"],
        ["2", "95", "1", "52.0s", "1", "-", "0.014", "-", "-", "records", "-"],
    ]
    code, rows, _ = rows_of(capsys, str(tmp_path / "r"))
    figures = rows["r"]["goodput"]
    assert figures["goodput_pct"] == pytest.approx(100 * 98 / 104, abs=1e-3)
    assert [(life["resumed_from"], life["kept_to"], life["allocated_s"]) for life in figures["lives"]] == [
        (0, 50, 52.0),
        (50, 100, 52.0),
    ]
    assert figures["wait_s"] == 148.0
    cost = rows["r"]["cost"]
    assert (cost["node_hours"], cost["kept_node_hours"], cost["gpu_hours"], cost["source"]) == (
        pytest.approx(104 / 3600, abs=1e-6),
        pytest.approx(98 / 3600, abs=1e-6),
        None,
        "records",
    )
    assert cost["kept_pct"] == pytest.approx(figures["goodput_pct"], abs=1e-3)
