"""Generations of a run dir (hpctrain.run.generations): the rule a life begins by, as a table;
the compare-and-swap raced by real processes; and a replaced life's writes refused
(hpctrain.run.fencing) with nothing of them on disk."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers.generation_racer import race

from hpctrain.checkpoint import store
from hpctrain.run import fencing, generations, lives
from hpctrain.run.events import Journal, Start
from hpctrain.run.generations import LIFE, RELAUNCH, REQUEUE, SUBMIT, Generation, Superseded
from hpctrain.run.jsonlines import JsonLines
from hpctrain.run.launch_marks import LAUNCHED_AT_ENV
from hpctrain.run.lives import LifeClaim

T1, T2 = "token-of-the-first-submission", "token-of-the-keepers-submission"


def submitted(number: int, job: str | None, token: str, by: str = "hpctrain-submit", **fields: object) -> Generation:
    return Generation(number, SUBMIT, by, job_id=job, token=token, time=time.time(), **fields)  # type: ignore[arg-type]


def life(number: int, job: str, restart: int, names: tuple[str, ...] = ()) -> Generation:
    return Generation(number, LIFE, "slurm", job_id=job, restart=restart, names=names)


@dataclass(frozen=True)
class Row:
    current: Generation | None
    claim: LifeClaim
    allowed: bool
    began_before: bool = False  # a life of the claim's job took a generation already


ROWS = {
    "a run dir's first life (or one from before generations)": Row(None, LifeClaim("36", 0, token=T1), True),
    "the first life after its own submission": Row(submitted(1, "36", T1), LifeClaim("36", 0, token=T1), True),
    "its submission, before sbatch's answer named the job": Row(
        submitted(1, None, T1), LifeClaim("36", 0, token=T1), True
    ),
    "Slurm's requeue: restart 1 after its own restart 0": Row(life(2, "36", 0), LifeClaim("36", 1, token=T1), True),
    "the control step's requeue of its own job": Row(
        Generation(3, REQUEUE, "hpctrain", job_id="36"), LifeClaim("36", 1, token=T1), True
    ),
    "Slurm's requeue after a relaunch in restart 0": Row(
        Generation(3, RELAUNCH, "hpctrain", job_id="36", restart=0), LifeClaim("36", 1, token=T1), True
    ),
    "an array task named by its own number": Row(life(2, "40_3", 0, names=("43",)), LifeClaim("43", 1, token=T1), True),
    # ---- a life that must not begin ----
    "a stale start of a life that began already": Row(life(2, "36", 1), LifeClaim("36", 1, token=T1), False),
    "an older life of its job after a newer one": Row(life(2, "36", 2), LifeClaim("36", 1, token=T1), False),
    "a stale start of a life that relaunched a step already": Row(
        Generation(3, RELAUNCH, "hpctrain", job_id="36", restart=1), LifeClaim("36", 1, token=T1), False
    ),
    "the old job after the keeper's submission of a new one": Row(
        submitted(3, "41", T2, by="keeper"), LifeClaim("36", 1, token=T1), False
    ),
    "the old job after the keeper's submission, its sbatch unanswered": Row(
        submitted(3, None, T2, by="keeper"), LifeClaim("36", 1, token=T1), False
    ),
    "the old job after the new job's first life": Row(life(4, "41", 0), LifeClaim("36", 1, token=T1), False),
    # ---- the user's own word ----
    "a job submitted by hand (no token) takes the run over": Row(life(4, "41", 0), LifeClaim("50", 0), True),
    "its first life to begin, requeued before it began (a prolog failed)": Row(
        life(4, "41", 0), LifeClaim("50", 1), True
    ),
    "not a later life of it, requeued after it was replaced": Row(
        life(4, "41", 0), LifeClaim("50", 1), False, began_before=True
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_may_begin(row: Row) -> None:
    allowed, why = lives.may_begin(row.current, row.claim, row.began_before)
    assert allowed is row.allowed, why


# ---- the compare-and-swap, raced by processes ------------------------------------------------


def test_of_sixteen_processes_taking_the_next_generation_exactly_one_wins(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    generations.take(run, 0, life(0, "36", 0))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    go = time.time() + 3.0  # every racer started and spinning by then
    racers = [context.Process(target=race, args=(str(run), 1, f"actor{i}", go, results)) for i in range(16)]
    for racer in racers:
        racer.start()
    outcomes = dict(results.get(timeout=60) for _ in racers)
    for racer in racers:
        racer.join(timeout=30)
    winners = [by for by, said in outcomes.items() if said == 2]
    assert len(winners) == 1, outcomes
    losers = [said for by, said in outcomes.items() if by not in winners]
    assert all(isinstance(s, str) and "taken over" in s and winners[0] in s for s in losers), losers
    assert generations.numbers(run) == [1, 2]
    newest = generations.newest(run)
    assert newest is not None and newest.by == winners[0]
    assert not [p for p in generations.folder(run).iterdir() if p.name.startswith(".")]  # no temporary left


def test_an_act_based_on_a_generation_long_gone_loses(tmp_path: Path) -> None:
    generations.take(tmp_path, 0, life(0, "36", 0))
    generations.take(tmp_path, 1, submitted(0, "41", T2))
    generations.take(tmp_path, 2, life(0, "41", 0))
    with pytest.raises(Superseded) as lost:
        generations.take(tmp_path, 1, submitted(0, None, T1, by="guardian"))
    assert lost.value.newer is not None and lost.value.newer.job_id == "41"


# ---- a life's begin and an act's basis --------------------------------------------------------


def test_a_life_waits_for_its_submitter_to_name_it_then_begins_after(tmp_path: Path) -> None:
    claim = generations.take(tmp_path, 0, generations.submission("keeper", T2))
    namer = threading.Timer(0.5, generations.name_job, (tmp_path, claim, "41"))
    namer.start()
    started = time.monotonic()
    began = lives.begin_life(tmp_path, LifeClaim("41", 0, token=T2), wait_s=30)
    waited = time.monotonic() - started
    namer.join()
    assert 0.4 < waited < 10, waited
    assert (began.number, began.kind, began.job_id) == (2, LIFE, "41")
    assert lives.life_of(tmp_path, ["41"], 0) == began


def test_a_job_whose_submission_was_abandoned_does_not_begin(tmp_path: Path) -> None:
    """sbatch gave no answer and the submitter marked its generation abandoned: a job it may
    have queued all the same trains nothing."""
    claim = generations.take(tmp_path, 0, generations.submission("guardian", T2))
    generations.name_job(tmp_path, claim, None)
    with pytest.raises(Superseded):
        lives.begin_life(tmp_path, LifeClaim("41", 0, token=T2), wait_s=0)


def test_an_act_is_based_on_its_jobs_newest_generation_only(tmp_path: Path) -> None:
    assert generations.basis(tmp_path, ["36"]) is None  # no generations: a run dir from before
    generations.take(tmp_path, 0, submitted(0, "36", T1))
    generations.take(tmp_path, 1, life(0, "36", 0))
    based = generations.basis(tmp_path, ["36"])
    assert based is not None and based.number == 2
    keeper = generations.take(tmp_path, 2, generations.submission("keeper", T2))
    with pytest.raises(Superseded):  # submitting right now
        generations.basis(tmp_path, ["36"])
    generations.name_job(tmp_path, keeper, "41")
    with pytest.raises(Superseded):  # the run goes on in job 41: a retry of 36 loses
        generations.basis(tmp_path, ["36"])
    assert generations.basis(tmp_path, ["41"]) is not None
    generations.take(tmp_path, 3, generations.submission("retry", T1))
    with pytest.raises(Superseded):  # a second submission while one waits for its sbatch
        generations.claim_submission(tmp_path, "guardian", "x")


def test_a_submission_whose_submitter_died_stops_counting_as_pending() -> None:
    old = Generation(3, SUBMIT, "guardian", token=T2, time=time.time() - generations.PENDING_SUBMIT_S - 1)
    assert not generations.pending(old)
    assert generations.pending(Generation(3, SUBMIT, "guardian", token=T2, time=time.time()))


# ---- a replaced life writes nothing ------------------------------------------------------------


@pytest.fixture
def replaced_life(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run dir where this process is rank 0 of job 36's first life, generation 2 (its
    submission was 1), then replaced by the keeper's submission of job 41 (generation 3)."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "36")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    generations.take(run, 0, submitted(0, "36", T1))
    generations.take(run, 1, life(0, "36", 0))
    fencing.forget(run)
    Journal(run / "events.jsonl").write_event(Start(job_id="36", restart=0, world_size=1, nodes=["node1"]))
    assert fencing.own(run) == 2
    generations.take(run, 2, submitted(0, "41", T2, by="keeper"))
    yield run
    fencing.forget(run)


def test_a_replaced_life_writes_no_journal_or_metrics_line(replaced_life: Path) -> None:
    before = (replaced_life / "events.jsonl").read_bytes()
    with pytest.raises(fencing.Fenced) as fenced:
        Journal(replaced_life / "events.jsonl").write_event(Start(job_id="36", restart=0, world_size=1))
    assert "generation 3: submission of job 41 by keeper" in str(fenced.value)
    with pytest.raises(fencing.Fenced):
        JsonLines(replaced_life / "metrics.jsonl").write({"step": 10, "loss": 1.0})
    assert (replaced_life / "events.jsonl").read_bytes() == before
    assert not (replaced_life / "metrics.jsonl").exists()


def test_a_replaced_life_publishes_prunes_and_clears_no_checkpoint(replaced_life: Path) -> None:
    """The new life's files under the same names (its step-100 write in flight, its step-50
    checkpoint) are left exactly as they are."""
    folder = replaced_life / "checkpoints"
    folder.mkdir()
    theirs = {
        "step_00000050.pt": b"the new life's checkpoint",
        "step_00000050.json": b"{}",
        "step_00000100.pt.tmp": b"the new life's write in flight",
    }
    for name, data in theirs.items():
        (folder / name).write_bytes(data)
    with pytest.raises(fencing.Fenced):
        store.write(folder, 100, {"weights": torch.zeros(3)}, {"reason": "periodic"})
    with pytest.raises(fencing.Fenced):
        store.prune(folder, keep=0)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == theirs
    with pytest.raises(fencing.Fenced):
        from hpctrain.run.paths import RunDir

        RunDir(replaced_life).update_submission(job_id="36")
    assert not (replaced_life / "submission.json").exists()


def test_a_life_writes_on_under_its_own_generation(replaced_life: Path) -> None:
    """The keeper that took generation 3 writes on (its failure, new_job_id): it adopted it."""
    fencing.adopt(replaced_life, generations.read(replaced_life, 3))  # type: ignore[arg-type]
    Journal(replaced_life / "events.jsonl").write_event(Start(job_id="36", restart=0, world_size=1))
    assert len((replaced_life / "events.jsonl").read_text().splitlines()) == 2


def test_outside_slurm_nothing_is_fenced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    generations.take(tmp_path, 0, life(0, "36", 0))
    generations.take(tmp_path, 1, life(0, "41", 0))
    JsonLines(tmp_path / "metrics.jsonl").write({"step": 1})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1}
    assert os.path.isdir(generations.folder(tmp_path))


def test_a_refused_submission_leaves_no_generation(tmp_path: Path) -> None:
    """sbatch refused (nothing queued): the run dir is as it was before the submission, the
    earlier generations kept; after another act, the refused one is only marked abandoned."""
    first = generations.take(tmp_path, 0, generations.submission("hpctrain-submit", T1))
    generations.withdraw(tmp_path, first)
    assert not generations.folder(tmp_path).exists()
    generations.take(tmp_path, 0, life(0, "36", 0))
    refused = generations.take(tmp_path, 1, generations.submission("retry", T1))
    generations.withdraw(tmp_path, refused)  # marked, never removed: no gap, whoever came after
    marked = generations.read(tmp_path, 2)
    assert generations.numbers(tmp_path) == [1, 2] and marked is not None and marked.abandoned
    assert generations.dead(marked) and generations.standing(tmp_path) == generations.read(tmp_path, 1)


def test_a_submission_that_queued_nothing_decides_nothing(tmp_path: Path) -> None:
    """The guardian's claim whose sbatch never answered and whose guardian died (unnamed, older
    than PENDING_SUBMIT_S): a user's --retry of the job before it is based on the job's own life,
    and the job's requeued life begins, both numbered after the dead claim."""
    generations.take(tmp_path, 0, submitted(0, "36", T1))
    generations.take(tmp_path, 1, life(0, "36", 0))
    generations.take(tmp_path, 2, generations.submission("guardian", T2))
    # Its record as it is left when no job was ever named: taken long ago.
    record = json.loads(generations.path_of(tmp_path, 3).read_text())
    record["time"] = time.time() - generations.PENDING_SUBMIT_S - 1
    generations.path_of(tmp_path, 3).write_text(json.dumps(record))
    assert generations.dead(generations.read(tmp_path, 3))  # type: ignore[arg-type]
    based = generations.basis(tmp_path, ["36"])
    assert based is not None and based.number == 3  # numbered after it, decided before it
    began = lives.begin_life(tmp_path, LifeClaim("36", 1, token=T1), wait_s=0)
    assert began.number == 4


def test_a_requeue_refused_in_a_process_of_its_own_is_this_lifes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`control requeue` took the life's REQUEUE generation, then the batch shell's own scontrol
    was refused and `control requeue-refused` runs as a new process: the REQUEUE is its own."""
    monkeypatch.setenv("SLURM_JOB_ID", "36")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    generations.take(tmp_path, 0, life(0, "36", 0))
    generations.take(tmp_path, 1, Generation(0, REQUEUE, "hpctrain", job_id="36", restart=0))
    fencing.forget(tmp_path)
    assert fencing.own(tmp_path) == 2
    fencing.check(tmp_path)  # not fenced by its own requeue
    fencing.forget(tmp_path)


def test_a_withdrawn_submission_leaves_no_gap(tmp_path: Path) -> None:
    """The keeper's sbatch refused: its claim stays, marked, and the keeper's next act (Slurm's
    own requeue instead) is numbered after it; the job's requeued life begins after that."""
    generations.take(tmp_path, 0, life(0, "36", 0))
    claim = generations.take(tmp_path, 1, generations.submission("keeper", T2))
    fencing.adopt(tmp_path, claim)
    fencing.withdraw(tmp_path, claim)
    assert fencing.own(tmp_path) == 2
    generations.take(tmp_path, 2, Generation(0, REQUEUE, "hpctrain", job_id="36", restart=0))
    assert lives.begin_life(tmp_path, LifeClaim("36", 1, token=T1), wait_s=0).number == 4
    fencing.forget(tmp_path)


# ---- a relaunch within a life fences the step it replaced --------------------------------------


@pytest.fixture
def relaunched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, float, float]:
    """Job 36's first life (generation 2) launched a step at `old`, lost a node, and its control
    step took a relaunch (generation 3); the new step was launched at `new`, after it."""
    monkeypatch.setenv("SLURM_JOB_ID", "36")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", LAUNCHED_AT_ENV):
        monkeypatch.delenv(name, raising=False)
    generations.take(tmp_path, 0, submitted(0, "36", T1))
    generations.take(tmp_path, 1, life(0, "36", 0))
    old = time.time()
    time.sleep(0.01)
    generations.take(tmp_path, 2, Generation(0, RELAUNCH, "hpctrain", job_id="36", restart=0))
    time.sleep(0.01)
    new = time.time()
    yield tmp_path, old, new
    fencing.join_step({})
    fencing.forget(tmp_path)


def test_a_rank_of_the_replaced_step_writes_nothing_after_the_relaunch(relaunched: tuple[Path, float, float]) -> None:
    """A node frozen with its rank, thawed once the relaunch trains on: that rank's `hang` (its
    watchdog saw the frozen minutes) and its metrics are refused, nothing of them on disk."""
    run, old, _new = relaunched
    fencing.join_step({LAUNCHED_AT_ENV: f"{old:.6f}"})
    with pytest.raises(fencing.Fenced) as fenced:
        Journal(run / "events.jsonl").write_event(Start(job_id="36", restart=0, world_size=2))
    assert "generation 3: relaunch of job 36 restart 0 by hpctrain" in str(fenced.value)
    with pytest.raises(fencing.Fenced):
        JsonLines(run / "metrics.jsonl").write({"step": 10, "loss": 1.0})
    assert not (run / "events.jsonl").exists() and not (run / "metrics.jsonl").exists()


def test_the_new_steps_ranks_and_the_lifes_other_processes_write_on(relaunched: tuple[Path, float, float]) -> None:
    run, _old, new = relaunched
    fencing.join_step({LAUNCHED_AT_ENV: f"{new:.6f}"})  # a rank of the relaunched step
    Journal(run / "events.jsonl").write_event(Start(job_id="36", restart=0, world_size=2))
    assert fencing.own(run) == 3
    # The watcher, the keeper, the control step: of no step. One that looked before the relaunch
    # (its own found then) is not fenced by it either, and writes under it from then on.
    fencing.join_step({})
    fencing.adopt(run, generations.read(run, 2))  # type: ignore[arg-type]
    JsonLines(run / "metrics.jsonl").write({"step": 11})
    assert fencing.own(run) == 3
    assert len((run / "events.jsonl").read_text().splitlines()) == 1 and (run / "metrics.jsonl").exists()


def test_a_relaunch_after_a_newer_act_is_refused(relaunched: tuple[Path, float, float]) -> None:
    """The keeper submitted the run again while this life's batch host was frozen: the control
    step that comes back decides a relaunch, takes nothing and is fenced (it launches nothing)."""
    run, _old, _new = relaunched
    fencing.join_step({})
    assert fencing.own(run) == 3
    generations.take(run, 3, submitted(0, "41", T2, by="keeper"))
    with pytest.raises(Superseded):
        generations.take(run, 3, Generation(0, RELAUNCH, "hpctrain", job_id="36", restart=0))
    with pytest.raises(fencing.Fenced):
        fencing.check(run)
