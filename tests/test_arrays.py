"""Sweeps as job arrays, the pure parts: array ids, grouping and splitting, the site's limits.
Slurm's answers are fixtures captured from the dev cluster (tests/fixtures/slurm/arrays/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import SweepArrays
from hpctrain.slurm.jobid import expand, sort_key, split, tasks_in
from hpctrain.slurm.records import parse_config, parse_job_records
from hpctrain.status import slurm_query
from hpctrain.submit import arrays, limits
from hpctrain.submit.limits import Limit, Limits, check

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "arrays"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"SLURM_JOB_ID": "36"}, "36"),
        # The last task of an array has the array's own number as SLURM_JOB_ID.
        ({"SLURM_JOB_ID": "36", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "7"}, "36_7"),
        ({"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "0"}, "36_0"),
        ({}, ""),
    ],
)
def test_a_life_names_its_job_as_slurm_commands_take_it(env: dict[str, str], expected: str) -> None:
    assert (LifeStamp.from_env(env).job_id or "") == expected


@pytest.mark.parametrize(
    "printed, expected",
    [
        ("36", ["36"]),
        ("36_7", ["36_7"]),
        ("4_[1-2]", ["4_1", "4_2"]),  # squeue without -r, captured
        ("36_[3-5%4]", ["36_3", "36_4", "36_5"]),
        ("36_[1,4-5]", ["36_1", "36_4", "36_5"]),
        ("1_[0-2]", ["1_0", "1_1", "1_2"]),
    ],
)
def test_a_pending_arrays_meta_record_stands_for_each_task(printed: str, expected: list[str]) -> None:
    assert expand(printed) == expected
    assert tasks_in(printed) == len(expected)


def test_ids_sort_and_split_by_array_then_task() -> None:
    assert sorted(["36_10", "5", "36_2", "36"], key=sort_key) == ["5", "36", "36_2", "36_10"]
    assert split("36_7") == ("36", 7) and split("36") == ("36", None)


H = ("#SBATCH --nodes=1", "#SBATCH --time=10")


def header(*extra: str, name: str = "a", out: str = "x") -> tuple[str, ...]:
    return (f"#SBATCH --job-name={name}", *H, *extra, f"#SBATCH --output={out}")


@pytest.mark.parametrize(
    "headers, max_tasks, expected",
    [
        # Outputs differ per point: one array; a job name of its own: another.
        ([header(out="0"), header(out="1", name="b"), header(out="2")], 10, [(0, 2), (1,)]),
        # A different account: its own array; sweep order kept within each.
        ([header(), header("#SBATCH --account=b"), header()], 10, [(0, 2), (1,)]),
        # Over MaxArraySize: split, every array's task ids from 0.
        ([header()] * 7, 3, [(0, 1, 2), (3, 4, 5), (6,)]),
        ([header()] * 3, 3, [(0, 1, 2)]),
        ([header(), header("#SBATCH --mem=1G")] * 2, 1, [(0,), (2,), (1,), (3,)]),
    ],
)
def test_points_are_grouped_by_header_and_split_at_max_array_size(
    headers: list[tuple[str, ...]], max_tasks: int, expected: list[tuple[int, ...]]
) -> None:
    assert [plan.points for plan in arrays.plan_arrays(headers, max_tasks)] == expected


def test_a_point_alone_with_its_header_is_its_own_job_and_a_split_remainder_is_an_array() -> None:
    plans = arrays.plan_arrays([header(), header("#SBATCH --account=b"), header(), header()], 2)
    assert [(plan.points, plan.alone) for plan in plans] == [((0, 2), False), ((3,), False), ((1,), True)]


def test_the_header_stops_at_the_first_command() -> None:
    script = "#!/bin/bash\n# note\n#SBATCH --nodes=2\n\n#SBATCH --time=5\nset -u\n#SBATCH --mem=1G\n"
    assert arrays.header_of(script) == ("#SBATCH --nodes=2", "#SBATCH --time=5")


@pytest.mark.parametrize(
    "tasks, parallelism, expected",
    [(4, 2, "#SBATCH --array=0-3%2"), (4, None, "#SBATCH --array=0-3"), (2, 8, "#SBATCH --array=0-1")],
)
def test_array_directive(tasks: int, parallelism: int | None, expected: str) -> None:
    assert arrays.array_directive(tasks, parallelism) == expected


def test_array_script_links_each_task_to_its_run_dir(tmp_path: Path) -> None:
    sweep = SweepArrays(tmp_path / "sweep 100%")  # a space and a % in the path
    run_dirs = [tmp_path / "sweep 100%" / "a" / str(n) for n in range(3)]
    for run_dir in run_dirs:
        run_dir.mkdir(parents=True)
    scripts = ["#!/bin/bash\n#SBATCH --job-name=j\n#SBATCH --nodes=1\n#SBATCH --output=o\nexit 0\n"] * 3
    plan = arrays.plan_arrays([arrays.header_of(s) for s in scripts], 2)[1]
    k = arrays.free_number(sweep)
    script = arrays.write_array(sweep, k, plan, run_dirs, "job.sbatch", None)
    assert script == sweep.script(0) and arrays.free_number(sweep) == 1
    link = sweep.links(0) / "0"
    assert not os.readlink(link).startswith("/") and link.resolve() == run_dirs[2].resolve()
    text = script.read_text()
    assert "#SBATCH --job-name=j\n#SBATCH --nodes=1\n#SBATCH --array=0-0\n" in text
    assert '#SBATCH --output="' + str(sweep.links(0).resolve()).replace("%", "%%") + '/%a/slurm-%j.out"' in text
    assert 'exec /bin/bash "${script}"' in text


L = Limits(1001)


@pytest.mark.parametrize(
    "points, given, parallelism, refusal, note",
    [
        (1000, L, None, None, None),
        (1000, Limits(1001, Limit(1000, "QOS normal (MaxSubmitJobsPerUser)")), None, None, None),
        (
            1000,
            Limits(1001, Limit(1000, "QOS normal (MaxSubmitJobsPerUser)"), queued=3),
            None,
            "the sweep has 1000 points but QOS normal (MaxSubmitJobsPerUser) allows 1000 jobs queued or running "
            "and 3 are queued already, so 997 more fit; submit a sweep of at most 997 points, or wait",
            None,
        ),
        (5, Limits(3, Limit(4, "association root/root (MaxSubmitJobs)"), queued=6), None, "so 0 more fit", None),
        # MaxJobs limits what runs at once, not what may be queued.
        (8, Limits(3, None, Limit(2, "association root/root (MaxJobs)")), 4, None, "at most 2 of the 8 points run"),
        (8, L, 4, None, "at most 4 of the 8 points run at once (slurm.array_parallelism)"),
        (3, L, 4, None, None),
    ],
)
def test_limits_table(
    points: int, given: Limits, parallelism: int | None, refusal: str | None, note: str | None
) -> None:
    verdict = check(points, given, parallelism)
    assert (verdict.refusal is None) == (refusal is None) and (verdict.note is None) == (note is None)
    assert refusal is None or refusal in (verdict.refusal or "")
    assert note is None or note in (verdict.note or "")


@pytest.mark.parametrize(
    "points, guardians, given, refusal",
    [
        # Each guarded point is two jobs queued: its training job (an array task) and its guardian.
        (2, 2, Limits(1001, Limit(4, "association root/root (MaxSubmitJobs)")), None),
        (
            3,
            3,
            Limits(1001, Limit(4, "association root/root (MaxSubmitJobs)")),
            "the sweep has 3 points but association root/root (MaxSubmitJobs) allows 4 jobs queued or running and 0 "
            "are queued already, so 4 more fit; with 3 guardian jobs (slurm.guardian) the sweep queues 6: submit a "
            "sweep of at most 2 points, set slurm.guardian=false",
        ),
        (4, 4, Limits(1001, Limit(9, "QOS normal (MaxSubmitJobsPerUser)"), queued=3), "so 6 more fit; with 4 guardian"),
        (3, 3, Limits(1001, Limit(9, "QOS normal (MaxSubmitJobsPerUser)"), queued=3), None),
        # Some points unguarded (slurm.guardian=false on them): room minus the guardians asked for.
        (4, 1, Limits(1001, Limit(4, "association root/root (MaxSubmitJobs)")), "at most 3 points"),
        (4, 0, Limits(1001, Limit(4, "association root/root (MaxSubmitJobs)")), None),
    ],
)
def test_limits_count_each_guardian_as_a_job(points: int, guardians: int, given: Limits, refusal: str | None) -> None:
    verdict = check(points, given, None, guardians)
    assert (verdict.refusal is None) == (refusal is None), verdict
    assert refusal is None or refusal in (verdict.refusal or ""), verdict.refusal


def test_limits_parsed_from_slurms_answers() -> None:
    config = parse_config(fixture("config.txt"))
    assert config["MaxArraySize"] == "3" and config["ClusterName"] == "hpctrain-dev"
    assert limits.enforces_limits(config) and not limits.enforces_limits({"AccountingStorageEnforce": "none"})
    submit, running, qos = limits.assoc_limits(fixture("assoc.txt"), "hpctrain-dev", None)
    assert (submit, running, qos) == (
        Limit(5, "association root/root (MaxSubmitJobs)"),
        Limit(2, "association root/root (MaxJobs)"),
        "normal",
    )
    assert limits.assoc_limits(fixture("assoc.txt"), "hpctrain-dev", "other") == (None, None, None)
    assert limits.assoc_limits(fixture("assoc_none.txt"), "hpctrain-dev", "root") == (None, None, "normal")
    assert limits.qos_limits(fixture("qos.txt"), "normal") == (
        Limit(4, "QOS normal (MaxSubmitJobsPerUser)"),
        Limit(3, "QOS normal (MaxJobsPerUser)"),
    )
    assert limits.qos_limits(fixture("qos_none.txt"), "normal") == (None, None)
    assert limits.tightest(submit, Limit(4, "q")) == Limit(4, "q")
    # Slurm counts every task of an array: -r lists them, without -r the meta record counts for each.
    assert (
        limits.count_queued(fixture("squeue_r.txt").splitlines())
        == limits.count_queued(fixture("squeue.txt").splitlines())
        == 3
    )


def test_status_reads_array_tasks_from_squeue_sacct_and_scontrol() -> None:
    asked = ["4_0", "4_1", "4_2"]
    jobs = {}
    for line in fixture("squeue_pending_meta.txt").splitlines():
        jobs.update({j: line.split("|")[1] for j in expand(line.split("|")[0])})
    assert jobs == {"4_0": "RUNNING", "4_1": "PENDING", "4_2": "PENDING"}
    sacct = slurm_query.parse_sacct(fixture("sacct.txt"), ["1_0", "1_2"])
    assert {k: v.state for k, v in sacct.items()} == {"1_0": "CANCELLED", "1_2": "CANCELLED"}
    found = {}
    for record in parse_job_records(fixture("scontrol_tasks.txt")):
        found.update({name: record.job_id for name in record.names if name in asked})
    assert found == {"4_0": "5", "4_1": "4", "4_2": "4"}
