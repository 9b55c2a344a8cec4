"""Hostile strings in every value that reaches a job script, submitted for real: nothing runs.

Every string field hpctrain-submit writes into job.sbatch (the #SBATCH values, --comment through
slurm.extra, the Python and the template paths, the run dir, the directory it is submitted from)
gets `$(...)`, backticks, `;`, `|`, both quote kinds and spaces, each command of which would
leave a marker file. Fields the dev cluster accepts go into one real job that trains; fields it
refuses (partition, constraint, exclude) are each refused cleanly: sbatch's words, exit 1,
no job, no run dir. Only `slurm.setup` runs, by design: its lines are the user's own shell.
A newline, which would start a new line of the script, is refused for every field with the key
named (these need no cluster).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from clitools import assert_refused, describe, run_cli, world_writable
from omegaconf import OmegaConf
from slurmtools import LIFTED_START, job_field, job_output, start_cluster

STRING_FIELDS = ["job_name", "partition", "account", "qos", "constraint", "exclude", "mem", "python", "template"]


def hostile(tag: str, marks: Path) -> str:
    """A value that, run by a shell anywhere, leaves a file in `marks` (an absolute path)."""
    return (
        f"{tag} $(touch {marks}/{tag}-dollar) `touch {marks}/{tag}-tick`; touch {marks}/{tag}-semi "
        f"| touch {marks}/{tag}-pipe ' \" & q"
    )


def hq(value: str) -> str:
    """Hydra's quoting for an override value (the hostile strings hold no backslash)."""
    return "'" + value.replace("'", "\\'") + "'"


def markers(marks: Path) -> list[str]:
    return sorted(p.name for p in marks.iterdir())


# ---- newlines: refused before anything is written, the key named -------------------------------


@pytest.mark.parametrize(
    "override, key",
    [
        *[(f"slurm.{field}='a\nb'", f"slurm.{field}") for field in STRING_FIELDS],
        ("slurm.extra=['--comment=a\n#SBATCH --uid=0']", "slurm.extra[0]"),
        ("slurm.setup=['ok','echo a\nrm -rf ~']", "slurm.setup[1]"),
        ("slurm.task_prefix=['apptainer','exec\n#SBATCH --uid=0']", "slurm.task_prefix[1]"),
        ("slurm.srun_args=['--comment=a\nrm -rf ~']", "slurm.srun_args[0]"),
        ("slurm.control_python='python\nid'", "slurm.control_python"),
        ("metrics.tensorboard_dir='a\nb'", "metrics.tensorboard_dir"),
        ("hydra.run.dir='run\n#SBATCH --uid=0'", "hydra.run.dir"),
    ],
)
def test_a_newline_is_refused_naming_the_key(tmp_path: Path, override: str, key: str) -> None:
    cwd = tmp_path / "project"
    done = run_cli("submit", override, "dry_run=true", cwd=cwd)
    assert_refused(done, 2, f"error: {key}:")
    assert "single line" in done.stderr
    assert not list(cwd.iterdir()), f"left behind: {list(cwd.rglob('*'))}"


def test_a_hostile_memory_size_is_refused_before_sbatch(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    done = run_cli("submit", f"slurm.mem={hq(hostile('mem', marks))}", "dry_run=true", cwd=tmp_path / "project")
    assert_refused(done, 2, "error: slurm.mem: ", "is not a Slurm memory size")
    assert markers(marks) == [] and not list((tmp_path / "project").iterdir())


@pytest.mark.parametrize(
    "key, says",
    [
        ("socket_ifname", "is not an interface name"),
        ("master_addr_suffix", "may hold only letters, digits"),
        ("master_addr_ifname", "is not an interface name"),
    ],
)
def test_hostile_network_keys_are_refused_by_key(tmp_path: Path, key: str, says: str) -> None:
    """slurm.network values reach export lines and every task's environment: only the
    characters of interface and host names get through, a newline included in the refusal."""
    marks = tmp_path / "marks"
    marks.mkdir()
    value = hq(hostile(key, marks) + "\n#SBATCH --uid=0")
    done = run_cli("submit", f"slurm.network.{key}={value}", "dry_run=true", cwd=tmp_path / "project")
    assert_refused(done, 2, f"error: slurm.network.{key}: ", says)
    assert markers(marks) == [] and not list((tmp_path / "project").iterdir())


def test_a_newline_in_the_directory_submitted_from_is_refused(tmp_path: Path) -> None:
    cwd = tmp_path / "project\n#SBATCH --uid=0"
    done = run_cli("submit", f"hydra.run.dir={tmp_path / 'run'}", "dry_run=true", cwd=cwd)
    assert_refused(done, 2, "error: the current directory (the job's --chdir):", "single line")
    assert not (tmp_path / "run").exists()


# ---- on the dev cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    # Without accounting Slurm keeps any account string as given, so scontrol shows it verbatim;
    # with accounting it puts the job under the user's default account instead.
    return start_cluster(accounting=False)


def submit(env: dict[str, str], cwd: Path, *overrides: str, umask: int | None = None) -> subprocess.CompletedProcess:
    return run_cli("submit", "cluster=devcluster", *overrides, cwd=cwd, env=env, umask=umask)


def queued_ids(text: str) -> list[str]:
    return re.findall(r"^Submitted batch job (\d+)$", text, re.M)


def show_job(env: dict[str, str], job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout


def squeue_named(env: dict[str, str], name: str) -> str:
    return subprocess.run(["squeue", "-h", "-n", name, "-o", "%i %T"], env=env, capture_output=True, text=True).stdout


def wait_done(env: dict[str, str], job_id: str, timeout_s: float = 400) -> str:
    """The final state; a requeue by someone else's preemption test is started again at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = job_field(env, job_id, "JobState")
        if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}:
            return state
        if state == "PENDING" and job_field(env, job_id, "Reason") == "BeginTime":
            subprocess.run(["scontrol", "update", f"jobid={job_id}", LIFTED_START], env=env, capture_output=True)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not end within {timeout_s:.0f} s")


def build_hostile_job(tmp_path: Path, marks: Path) -> tuple[Path, Path, dict[str, str], list[str]]:
    """(cwd, run dir, the hostile value of each field, the overrides) for a job the cluster takes."""
    values = {field: hostile(field, marks) for field in ("job_name", "account", "qos", "comment")}
    cwd = tmp_path / f"cwd {hostile('cwd', marks)}"
    run_dir = tmp_path / f"run {hostile('run', marks)}"
    tools = tmp_path / f"tools {hostile('tools', marks)}"
    tools.mkdir(parents=True)
    python = tools / "python"  # the Python on the compute nodes, behind a hostile path
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    template = tools / "site $(id) `id`; ' \" x.sbatch.j2"
    template.write_text('{% extends "ddp.sbatch.j2" %}\n')
    data = tools / "train.bin"
    (np.arange(2000) % 32).astype(np.uint16).tofile(data)
    overrides = [
        f"hydra.run.dir={hq(str(run_dir))}",
        f"slurm.job_name={hq(values['job_name'])}",
        f"slurm.account={hq(values['account'])}",
        f"slurm.qos={hq(values['qos'])}",
        f"slurm.extra=[{hq('--comment=' + values['comment'])}]",
        f"slurm.python={hq(str(python))}",
        f"slurm.template={hq(str(template))}",
        # The user's own shell lines run as written: the trust boundary, not an injection.
        f"slurm.setup=['touch {marks}/setup-ran']",
        "model=gpt",
        "data=token_file",
        f"data.dataset.path={hq(str(data))}",
        "data.dataset.seq_len=8",
        "data.dataset.vocab_size=32",
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=8",
        "data.batch_size=4",
        "trainer.max_steps=2",
        "trainer.eval_every=0",
        "trainer.ckpt_every=1",
    ]
    return cwd, run_dir, values, overrides


REFUSED = {  # a field refused for such a value, and the words: sbatch's own, or hpctrain's key check
    "partition": "is not a Slurm partition name",  # refused before anything is written (exit 2)
    "constraint": "Invalid feature specification",
    "exclude": "error opening file",  # a value holding "/" is, to sbatch, a file listing the nodes
}


@pytest.mark.slurm
def test_hostile_strings_in_a_real_job_arrive_verbatim_and_nothing_runs(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    cwd, run_dir, values, overrides = build_hostile_job(tmp_path, marks)

    def refused(field: str) -> tuple[str, subprocess.CompletedProcess, Path, str]:
        name = f"hpctrain-refused-{uuid.uuid4().hex[:8]}"
        where = tmp_path / f"refused {field}"
        done = submit(
            slurm_env,
            tmp_path / "refusals",
            f"hydra.run.dir={hq(str(where))}",
            f"slurm.job_name={name}",
            f"slurm.{field}={hq(hostile(field, marks))}",
        )
        return field, done, where, name

    with ThreadPoolExecutor(max_workers=2) as pool:  # the refusals meanwhile: they need no node
        refusals = pool.map(refused, sorted(REFUSED))
        done = submit(slurm_env, cwd, *overrides, umask=0)
        assert done.returncode == 0, describe(done)
        (job_id,) = queued_ids(done.stdout)
        state = wait_done(slurm_env, job_id)
        refusals = list(refusals)

    assert state == "COMPLETED", job_output(run_dir)
    # Slurm holds exactly the values given (no accounting: it keeps any account, drops the QOS).
    shown = show_job(slurm_env, job_id)
    assert f"JobName={values['job_name']}\n" in shown, shown
    assert f"Account={values['account']} QOS=" in shown, shown
    assert re.search(re.escape(f"Comment={values['comment']}") + r" *\n", shown), shown
    assert f"WorkDir={cwd}\n" in shown, shown
    # The run dir holds the job's outputs, the config the values verbatim, the script the template's name.
    finish = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()][-1]
    assert finish["event"] == "finish" and finish["step"] == 2, job_output(run_dir)
    assert (run_dir / "model.pt").is_file() and (run_dir / f"slurm-{job_id}.out").is_file()
    assert f"run dir {run_dir}\n" in job_output(run_dir)
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.slurm.job_name == values["job_name"] and saved.slurm.qos == values["qos"]
    assert "# Rendered by hpctrain" in (run_dir / "job.sbatch").read_text()
    assert "site $(id) `id`; ' \" x.sbatch.j2" in (run_dir / "job.sbatch").read_text().splitlines()[1]
    # Nothing ran but the user's own setup line; submitted under umask 000, nothing is world-writable.
    assert markers(marks) == ["setup-ran"]
    assert world_writable(run_dir) == []

    for field, done, where, name in refusals:
        if field == "partition":  # its syntax checked by hpctrain: a user's mistake, exit 2, no sbatch
            assert_refused(done, 2, f"slurm.partition: {hostile(field, marks)!r} {REFUSED[field]}")
        else:
            assert_refused(done, 1, REFUSED[field], "nothing was queued and no run dir was kept")
        assert "Submitted batch job" not in done.stdout
        assert not where.exists(), f"{field}: run dir left behind"
        assert squeue_named(slurm_env, name) == "", f"{field}: a job was queued"
    assert not (tmp_path / "refusals").exists() or not list((tmp_path / "refusals").iterdir())
    assert markers(marks) == ["setup-ran"]


@pytest.mark.slurm
def test_hostile_sweep_values_arrive_verbatim_and_nothing_runs(slurm_env: dict[str, str], tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    names = [hostile("one", marks), hostile("two", marks)]

    done = run_cli(
        "submit",
        "-m",
        "cluster=devcluster",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"slurm.job_name={hq(names[0])},{hq(names[1])}",
        "slurm.extra=[--hold]",
        cwd=tmp_path,
        env=slurm_env,
    )

    assert done.returncode == 0, describe(done)
    job_ids = queued_ids(done.stdout)
    try:
        assert len(job_ids) == 2
        for job_id, name in zip(job_ids, names):
            assert f"JobName={name}\n" in show_job(slurm_env, job_id)
    finally:
        subprocess.run(["scancel", *job_ids], env=slurm_env, capture_output=True)
    assert markers(marks) == []


@pytest.mark.slurm
def test_a_sweep_value_cannot_reach_a_setup_line(slurm_env: dict[str, str], tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    name = f"hpctrain-setup-{uuid.uuid4().hex[:8]}"

    done = run_cli(
        "submit",
        "-m",
        "cluster=devcluster",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "slurm.setup=['echo ${slurm.job_name}']",
        f"slurm.job_name={name},{hq(hostile('x', marks))}",
        cwd=tmp_path,
        env=slurm_env,
    )

    assert_refused(done, 2, "error: slurm.setup[0]: ${slurm.job_name} brings")
    assert not (tmp_path / "sweep").exists()
    assert squeue_named(slurm_env, name) == "" and markers(marks) == []


@pytest.mark.slurm
def test_an_unknown_partition_is_refused_in_sbatchs_words(slurm_env: dict[str, str], tmp_path: Path) -> None:
    name = f"hpctrain-nope-{uuid.uuid4().hex[:8]}"
    done = submit(
        slurm_env, tmp_path, f"hydra.run.dir={tmp_path / 'run'}", "slurm.partition=nope", f"slurm.job_name={name}"
    )
    assert_refused(done, 1, "sbatch: error: Batch job submission failed: Invalid partition name specified")
    assert not (tmp_path / "run").exists() and squeue_named(slurm_env, name) == ""


@pytest.mark.slurm
def test_a_sweep_with_an_unknown_partition_leaves_no_job_and_no_run_dir(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    name = f"hpctrain-nope-{uuid.uuid4().hex[:8]}"
    done = run_cli(
        "submit",
        "-m",
        "cluster=devcluster",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "slurm.partition=batch,nope,batch",
        f"slurm.job_name={name}",
        "slurm.extra=[--hold]",
        cwd=tmp_path,
        env=slurm_env,
    )

    assert_refused(done, 1, "Invalid partition name specified", "nothing was queued and no run dir was kept")
    assert not (tmp_path / "sweep").exists()
    cancelled = re.search(r"cancelled the \d+ job\(s\) this submission had queued: ([\d ]+)", done.stdout + done.stderr)
    assert cancelled, describe(done)  # the first point is queued alone, before the refused one
    for job_id in cancelled.group(1).split():
        assert job_field(slurm_env, job_id, "JobState") == "CANCELLED"
    assert squeue_named(slurm_env, name) == ""
