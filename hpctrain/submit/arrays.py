"""A sweep as Slurm job arrays (slurm.array): which points share an array, and its script.

Each point keeps its own rendered job.sbatch (a retry, a refused requeue's resubmission and a
reader all use it). An array's script takes the #SBATCH header its points share, adds `--array`
and an --output through `<sweep>/.array/array-<k>/%a`, a relative symlink to the task's run dir
(Slurm expands %a in a folder and follows the link: seen on 22.05), and its body `exec`s the
task's own job.sbatch: the same process, so the signals Slurm sends the batch shell and the
traps that take them are the point script's. Task ids restart at 0 in every array, so a sweep
split into several arrays (MaxArraySize bounds the highest index) maps each with its own links.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain import __version__
from hpctrain.run.paths import SLURM_OUTPUT_PATTERN, SweepArrays
from hpctrain.submit.render import filename_pattern, sbatch_quote

# The directive that differs between points of one array: each task writes its output in its
# own run dir. Any other difference (a job name too: squeue shows the user's, verbatim) makes
# another array.
_PER_POINT = ("--output=",)


@dataclass(frozen=True)
class ArrayPlan:
    """One array: the indices (into the sweep's points) of its tasks 0, 1, ..."""

    points: tuple[int, ...]
    header: tuple[str, ...]  # the shared #SBATCH lines, per-point ones left out
    # The only point with its header: queued as its own job.sbatch (an array of one adds nothing).
    alone: bool = False


def header_of(script: str) -> tuple[str, ...]:
    """The #SBATCH lines at the top of a rendered script (sbatch reads none after the first command)."""
    lines = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH "):
            lines.append(line)
        elif line.strip() and not line.startswith("#"):
            break
    return tuple(lines)


def shared(header: Sequence[str]) -> tuple[str, ...]:
    return tuple(line for line in header if not line[len("#SBATCH ") :].startswith(_PER_POINT))


def plan_arrays(headers: Sequence[tuple[str, ...]], max_tasks: int) -> list[ArrayPlan]:
    """Points with the same shared header go to one array, in sweep order; a group larger than
    `max_tasks` (MaxArraySize: task ids 0..max_tasks-1) is split into several. A point alone with
    its header is no array (`alone`)."""
    if max_tasks < 1:
        raise ValueError(f"an array holds at least one task (got {max_tasks})")
    groups: dict[tuple[str, ...], list[int]] = {}
    for index, header in enumerate(headers):
        groups.setdefault(shared(header), []).append(index)
    plans = []
    for header, members in groups.items():
        if len(members) == 1:
            plans.append(ArrayPlan(tuple(members), header, alone=True))
            continue
        for start in range(0, len(members), max_tasks):
            plans.append(ArrayPlan(tuple(members[start : start + max_tasks]), header))
    return plans


def array_directive(tasks: int, parallelism: int | None) -> str:
    """`--array=0-N` with `%K` when slurm.array_parallelism limits the tasks running at once."""
    limit = f"%{parallelism}" if parallelism is not None and parallelism < tasks else ""
    return f"#SBATCH --array=0-{tasks - 1}{limit}"


def render_array(plan: ArrayPlan, links: Path, job_script_name: str, parallelism: int | None) -> str:
    """The array's script: the shared header, --array, --output through the links, and a body
    that runs task SLURM_ARRAY_TASK_ID's own job script in this same process."""
    output = filename_pattern(links) + "/%a/" + SLURM_OUTPUT_PATTERN
    lines = [
        "#!/bin/bash",
        f"# Rendered by hpctrain {__version__}: a sweep's job array. Task T trains in the run dir that",
        f"# {links.name}/T links to, by running that run dir's own {job_script_name}.",
        *plan.header,
        array_directive(len(plan.points), parallelism),
        f"#SBATCH --output={sbatch_quote(output)}",
        "",
        "set -u",
        f"links={shlex.quote(str(links))}",
        'script="${links}/${SLURM_ARRAY_TASK_ID}/' + job_script_name + '"',
        'if [ ! -f "${script}" ]; then',
        '  echo "hpctrain: array task ${SLURM_ARRAY_TASK_ID}: no ${script} (was the sweep moved?)" >&2',
        "  exit 1",
        "fi",
        "# exec: the point's script is this batch shell, its traps take Slurm's signals.",
        'exec /bin/bash "${script}"',
        "",
    ]
    return "\n".join(lines)


def write_array(
    sweep: SweepArrays,
    k: int,
    plan: ArrayPlan,
    run_dirs: Sequence[Path],
    job_script_name: str,
    parallelism: int | None,
) -> Path:
    """Write array `k`'s links (task t -> its point's run dir, relative) and its script."""
    links = sweep.links(k)
    links.mkdir(parents=True)
    here = links.resolve()
    # Each distinct parent resolved once: Path.resolve stats every folder of the path again, up
    # to a millisecond a point on a busy filesystem, and a sweep's points share one parent.
    parents: dict[Path, Path] = {}
    for task, index in enumerate(plan.points):
        run_dir = run_dirs[index]
        if run_dir.is_symlink() or run_dir.name in ("", ".", ".."):
            target = run_dir.resolve()
        else:
            if run_dir.parent not in parents:
                parents[run_dir.parent] = run_dir.parent.resolve()
            target = parents[run_dir.parent] / run_dir.name
        os.symlink(os.path.relpath(target, here), links / str(task))
    script = sweep.script(k)
    tmp = script.with_name(script.name + ".tmp")
    tmp.write_text(render_array(plan, links.resolve(), job_script_name, parallelism))
    tmp.replace(script)
    return script


def free_number(sweep: SweepArrays) -> int:
    """The first array number not used yet in this sweep folder (a second submission into it)."""
    k = 0
    while sweep.script(k).exists() or sweep.links(k).exists():
        k += 1
    return k
