"""Which points hpctrain-cancel and hpctrain-submit --retry take, as tables; scancel's words
(captured from the dev cluster); naming points of a sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.sweep.cancel import parse_scancel_errors
from hpctrain.sweep.pick import cancel_verdict, retry_verdict
from hpctrain.sweep.points import PointError, PointFacts, choose

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def point(state: str | None, ending: str | None = None, cause: str | None = None, job: str | None = "36") -> PointFacts:
    return PointFacts("3", Path("sweep/3"), job, state, None, ending, cause, 40)


# (Slurm's state, the journal's ending and cause, squeue answered) -> retried?, words in the reason
RETRY = {
    "cancelled while running": (point("CANCELLED", "stopped", "preempt"), True, True, "ended CANCELLED"),
    "cancelled while pending (never started)": (point("CANCELLED", "cancelled"), True, True, "ended CANCELLED"),
    "crash budget spent": (point("FAILED", "failure", "budget"), True, True, "ended FAILED (budget)"),
    "a user's mistake is retried when asked (the config may be fixed now)": (
        point("FAILED", "failure", "user_error"),
        True,
        True,
        "FAILED (user_error)",
    ),
    "time limit without requeue": (point("TIMEOUT"), True, True, "ended TIMEOUT"),
    "node failure": (point("NODE_FAIL"), True, True, "ended NODE_FAIL"),
    "out of memory": (point("OUT_OF_MEMORY"), True, True, "OUT_OF_MEMORY"),
    "boot failure": (point("BOOT_FAIL"), True, True, "BOOT_FAIL"),
    "deadline": (point("DEADLINE"), True, True, "DEADLINE"),
    "preempted for good": (point("PREEMPTED"), True, True, "PREEMPTED"),
    "an array task": (point("FAILED", job="36_7"), True, True, "job 36_7 ended FAILED"),
    "gone from Slurm, journal ends in a requeue": (
        point(None, "requeue", "timelimit"),
        True,
        True,
        "gone from Slurm without a finish (its journal's last word: requeue)",
    ),
    "gone from Slurm, never wrote a word": (point(None), True, True, "gone from Slurm without a finish"),
    "COMPLETED without a finish": (point("COMPLETED", "failure", "crash"), True, True, "without a finish"),
    # never
    "running": (point("RUNNING"), True, False, "RUNNING: still queued or running; cancel it first (hpctrain-cancel)"),
    "pending": (point("PENDING"), True, False, "PENDING: still queued"),
    "requeued, waiting": (point("PENDING", "requeue", "preempt"), True, False, "still queued"),
    "completing": (point("COMPLETING"), True, False, "still queued or running"),
    "suspended": (point("SUSPENDED"), True, False, "still queued or running"),
    "finished": (point("COMPLETED", "finish"), True, False, "finished (step 40): nothing to retry"),
    "finished, then Slurm forgot it": (point(None, "finish"), True, False, "finished"),
    "finished, then cancelled while tearing down": (point("CANCELLED", "finish"), True, False, "finished"),
    "squeue did not answer: it may still run": (point("FAILED"), False, False, "squeue did not answer"),
    "never submitted": (point(None, job=None), True, False, "never submitted"),
    # Held after a chosen exit code: released, it runs again in the same run dir.
    "held": (point("SPECIAL_EXIT"), True, False, "still queued or running"),
    # A federation started the job on another cluster: it runs there.
    "a state no retry takes": (point("REVOKED"), True, False, "not a state a retry takes"),
    # Preempted without a requeue (PreemptMode=CANCEL): it will not run again by itself.
    "preempted": (point("PREEMPTED"), True, True, "ended PREEMPTED"),
}


@pytest.mark.parametrize("facts, answered, chosen, words", RETRY.values(), ids=RETRY.keys())
def test_retry_picks(facts: PointFacts, answered: bool, chosen: bool, words: str) -> None:
    verdict = retry_verdict(facts, answered)
    assert verdict.chosen is chosen
    assert words in verdict.why


CANCEL = {
    "running": (point("RUNNING"), True, True, "job 36 (RUNNING)"),
    "pending": (point("PENDING"), True, True, "job 36 (PENDING)"),
    "requeued, waiting": (point("REQUEUED"), True, True, "(REQUEUED)"),
    "an array task": (point("PENDING", job="36_7"), True, True, "job 36_7 (PENDING)"),
    "squeue did not answer: scancel tells": (point(None), False, True, "scancel will tell"),
    "completed": (point("COMPLETED", "finish"), True, False, "already ended (COMPLETED)"),
    "failed": (point("FAILED", "failure", "budget"), True, False, "already ended (FAILED)"),
    "gone from Slurm": (point(None, "finish"), True, False, "already ended (journal: finish)"),
    "never submitted": (point(None, job=None), True, False, "never submitted"),
}


@pytest.mark.parametrize("facts, answered, chosen, words", CANCEL.values(), ids=CANCEL.keys())
def test_cancel_picks(facts: PointFacts, answered: bool, chosen: bool, words: str) -> None:
    verdict = cancel_verdict(facts, answered)
    assert verdict.chosen is chosen
    assert words in verdict.why


def test_scancel_says_which_jobs_had_ended() -> None:
    text = (FIXTURES / "scancel_verbose_mixed.txt").read_text()
    assert parse_scancel_errors(text) == {
        "1": "Job/step already completing or completed",
        "99999": "Invalid job id specified",
        "7_3": "Invalid job id specified",
    }


def sweep_dir(root: Path, points: int = 3) -> Path:
    (root / "sweep").mkdir()
    (root / "sweep" / "multirun.yaml").write_text("{}\n")
    for n in range(points):
        (root / "sweep" / str(n)).mkdir()
        (root / "sweep" / str(n) / "submission.json").write_text(f'{{"job_id": "4{n}"}}\n')
    return root / "sweep"


def test_points_are_named_by_name_or_path(tmp_path: Path) -> None:
    sweep = sweep_dir(tmp_path, 11)
    assert [p.name for p in choose(sweep, [])] == [str(n) for n in range(11)]
    assert [p.name for p in choose(sweep, ["10", str(sweep / "2"), "10"])] == ["10", "2"]
    assert choose(sweep / "3", []) == [sweep / "3"]  # one run dir


@pytest.mark.parametrize(
    "target, names, words",
    [
        ("sweep", ["3", "x"], "no point 3, x in"),
        ("sweep/1", ["2"], "is a run dir, not a sweep dir"),
        ("nothing", [], "no such directory"),
        (".", [], "neither a sweep dir"),
    ],
)
def test_unknown_points_are_refused_naming_the_sweeps_points(
    tmp_path: Path, target: str, names: list[str], words: str
) -> None:
    sweep_dir(tmp_path)
    with pytest.raises(PointError, match=words) as error:
        choose(tmp_path / target, names)
    if names == ["3", "x"]:
        assert str(error.value).endswith("its points are 0, 1, 2")
