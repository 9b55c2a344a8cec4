"""One guardian for a job array (hpctrain.recovery.array_guardian): its argument, its dependency,
and which tasks one look at the array asks it to judge, from Slurm's own records
(tests/fixtures/slurm/guardian/array_tasks.txt). The dev-cluster run:
tests/test_slurm_guardian.py::test_a_sweeps_array_has_one_guardian_which_submits_its_lost_point_again."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.recovery.array_guardian import by_task, ended_tasks, watched
from hpctrain.run.paths import SweepArrays, is_array_links
from hpctrain.slurm.jobid import task_ranges
from hpctrain.slurm.records import parse_job_records
from hpctrain.submit.guardian_job import array_dependency, array_watch_argument

FIXTURE = Path(__file__).parent / "fixtures" / "slurm" / "guardian" / "array_tasks.txt"
ARRAY = "26817014"


@pytest.mark.parametrize(
    "tasks, written",
    [
        ([0], "0"),
        ([0, 1, 2], "0-2"),
        ([5, 0, 1, 2, 7, 8], "0-2,5,7-8"),
        ([3, 3, 4], "3-4"),
        (list(range(1000)), "0-999"),
    ],
)
def test_tasks_are_written_as_slurm_writes_an_arrays_and_read_back(tasks: list[int], written: str) -> None:
    assert task_ranges(tasks) == written
    argument = array_watch_argument("36", tasks)
    assert argument == f"36_[{written}]"
    assert watched(argument) == ("36", sorted(set(tasks)))


@pytest.mark.parametrize("bad", ["36", "36_7x", "x_[1-2]", "36_[1-2],37_[3]", ""])
def test_anything_but_one_arrays_tasks_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not an array's tasks"):
        watched(bad)


def test_the_dependency_is_satisfied_by_any_one_task() -> None:
    assert array_dependency("36", [2, 0, 1]) == "afternotok:36_0?afternotok:36_1?afternotok:36_2"
    assert len(array_dependency("26817014", list(range(1000)))) == 23889  # accepted by sbatch


def test_one_look_at_the_array_says_which_tasks_to_judge_and_which_to_watch_on() -> None:
    records = by_task(ARRAY, parse_job_records(FIXTURE.read_text()))
    assert {task: record.state for task, record in records.items()} == {
        0: "RUNNING",
        1: "FAILED",
        2: "COMPLETED",
        3: "RUNNING",
        4: "RUNNING",
        5: "PENDING",  # the array's own record, standing for the task not started yet
    }
    # Task 1 failed: judged. Task 2 completed: nothing. Task 6 has no record (ended more than
    # MinJobAge ago): judged on its journal, as a point's own guardian does.
    to_judge, live = ended_tasks([0, 1, 2, 3, 4, 5, 6], records)
    assert (to_judge, live) == ([1, 6], [0, 3, 4, 5])
    # A successor watches only the tasks still to end.
    assert ended_tasks([0, 3], records) == ([], [0, 3])


def test_a_pending_remainder_stands_for_each_of_its_tasks() -> None:
    line = next(line for line in FIXTURE.read_text().splitlines() if "ArrayTaskId=5 " in line)
    remainder = line.replace("ArrayTaskId=5 ", "ArrayTaskId=5-9%4 ")
    records = by_task(ARRAY, parse_job_records(remainder))
    assert sorted(records) == [5, 6, 7, 8, 9] and {r.state for r in records.values()} == {"PENDING"}


def test_an_arrays_links_folder_is_told_from_a_run_dir(tmp_path: Path) -> None:
    arrays = SweepArrays(tmp_path)
    arrays.links(3).mkdir(parents=True)
    assert is_array_links(arrays.links(3))
    assert arrays.guardian_script(3) == tmp_path / ".array" / "array-3.guardian.sbatch"
    run_dir = tmp_path / "0"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    assert not is_array_links(run_dir)


def test_a_guardians_dependency_stays_within_one_arguments_limit() -> None:
    """Linux takes at most 128 KiB in one argument (MAX_ARG_STRLEN): a guardian watches at most
    ARRAY_GUARDIAN_TASKS tasks, whose dependency fits with the longest task ids Slurm gives."""
    from hpctrain.submit.guardian_job import ARRAY_GUARDIAN_TASKS

    tasks = list(range(4_000_000 - ARRAY_GUARDIAN_TASKS, 4_000_000))
    assert len(f"--dependency={array_dependency('4294967294', tasks)}".encode()) < 128 * 1024
