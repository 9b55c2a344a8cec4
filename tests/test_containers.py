"""Training in a container: slurm.srun_args, slurm.task_prefix and slurm.control_python.

Rendering first (golden files, hostile words passed verbatim as one argument each, newlines and
misplaced words refused with the key named), then the controller without Slurm's commands (as in
an image that lacks them), then the dev cluster: `sbatch --test-only` takes the script, and a real
job trains through a prefix that records every process it wraps, is sent its time-limit signal
through that prefix, requeues and trains to the end.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from slurmtools import (
    events,
    job_output,
    job_restarts,
    lift_requeue_hold,
    signal_batch,
    start_cluster,
    submit,
    wait_finished,
    wait_for_step,
)
from test_render import HOSTILE, check_golden, make_config, rendered

from hpctrain.config.schema import SlurmConfig
from hpctrain.recovery.control import Controller
from hpctrain.submit.render import render

APPTAINER = ["apptainer", "exec", "--nv", "--bind", "/scratch:/scratch", "/images/train.sif"]
PYXIS = ["--container-image=nvcr.io#nvidia/pytorch:24.05-py3", "--container-mounts=/data:/data"]


def hq(value: str) -> str:
    """Hydra's quoting for one override value (the values here hold no backslash)."""
    return "'" + value.replace("'", "\\'") + "'"


def hydra_list(words: list[str]) -> str:
    return "[" + ",".join(hq(word) for word in words) + "]"


# ---- rendering ----------------------------------------------------------------------------------


def test_golden_apptainer_site() -> None:
    """The control steps go through the prefix too (no control_python) and keep its last line."""
    text = rendered("slurm.gpus_per_node=4", f"slurm.task_prefix={hydra_list(APPTAINER)}")
    check_golden("ddp_apptainer.sbatch", text)
    words = "apptainer exec --nv --bind /scratch:/scratch /images/train.sif /opt/venv/bin/python"
    assert f'    {words} -m hpctrain.worker "${{HPCTRAIN_RUN_DIR}}" &\n' in text
    assert f'control() {{ {words} -m hpctrain.recovery.control "$@" | tail -n 1; }}\n' in text


def test_golden_pyxis_site() -> None:
    """srun's container flags after hpctrain's own; the control steps on the node's Python."""
    text = rendered(
        "slurm.nodes=2",
        "slurm.gpus_per_node=8",
        "slurm.python=python",
        "slurm.control_python=/opt/hpctrain/bin/python",
        f"slurm.srun_args={hydra_list(PYXIS)}",
    )
    check_golden("ddp_pyxis.sbatch", text)
    assert "    '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' --container-mounts=/data:/data \\\n" in text
    assert 'control() { /opt/hpctrain/bin/python -m hpctrain.recovery.control "$@"; }\n' in text


def test_no_container_keys_render_the_script_as_before() -> None:
    assert rendered() == (Path(__file__).parent / "golden" / "ddp_default.sbatch").read_text()


@pytest.mark.parametrize("profile", ["example_apptainer", "example_pyxis"])
def test_example_profiles_render(profile: str) -> None:
    config = make_config(f"cluster={profile}")
    text = render(config, Path("/scratch/me/runs/exp1"), Path("/scratch/me/project")).script
    slurm = config.slurm
    assert (slurm.task_prefix or slurm.srun_args) and slurm.python
    assert shlex.join([*slurm.task_prefix, slurm.python, "-m", "hpctrain.worker"]) in text
    assert all(shlex.quote(word) in text for word in slurm.srun_args)


def srun_words(script: str) -> list[str]:
    """The training srun's arguments as bash reads them (the line ends with `&`)."""
    start = script.index("  srun ")
    command = script[start : script.index("&\n", start)].replace("\\\n", " ")
    return shlex.split(command.replace('${excluded:+--exclude="${excluded}"}', ""))


def test_hostile_words_are_single_arguments() -> None:
    prefix = ["/opt/tools dir/wrap", *HOSTILE]
    args = ["--comment=x", *HOSTILE]
    config = make_config(
        "slurm.python=/opt/venv/bin/python",
        f"slurm.task_prefix={hydra_list(prefix)}",
        f"slurm.srun_args={hydra_list(args)}",
    )
    assert config.slurm.task_prefix == prefix and config.slurm.srun_args == args
    words = srun_words(render(config, Path("/r"), Path("/s")).script)
    tail = [*args, *prefix, "/opt/venv/bin/python", "-m", "hpctrain.worker", "${HPCTRAIN_RUN_DIR}"]
    assert words[-len(tail) :] == tail


def test_hostile_words_never_run_in_bash(tmp_path: Path) -> None:
    """The script's shell part with stand-ins for srun, the prefix and python: every word
    arrives verbatim as one argument, in the tasks and in the control steps, and nothing runs."""
    bin_dir = tmp_path / "bin $(touch pwned)"
    bin_dir.mkdir()
    stand_ins = {
        # Records its arguments, then runs the command after its own flags (a task, once).
        "srun": 'printf "%s\\n" "$@" > "$HPCTRAIN_RUN_DIR/srun-args"\n'
        'while [ "${1##*/}" != wrap ]; do shift; done\nexec "$@"\n',
        # The prefix: records its arguments, drops the hostile words, becomes the command.
        "wrap": f'printf "%s\\n" "$@" >> "$HPCTRAIN_RUN_DIR/wrap-args"\nshift {len(HOSTILE)}\nexec "$@"\n',
        # The controller says the step finished; the worker does nothing.
        "python": '[ "$3" = after-step ] && echo finish\nexit 0\n',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run `touch pwned`; x"
    run_dir.mkdir()
    config = make_config()
    slurm = replace(
        config.slurm,
        python=str(bin_dir / "python"),
        task_prefix=[str(bin_dir / "wrap"), *HOSTILE],
        srun_args=["--comment=x", *HOSTILE],
    )
    (tmp_path / "job.sbatch").write_text(render(replace(config, slurm=slurm), run_dir, tmp_path).script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}

    done = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    assert "step ended with 0: finish" in done.stdout, done.stdout
    assert not list(tmp_path.rglob("pwned")), "a hostile word ran as a command"
    srun_args = (run_dir / "srun-args").read_text().splitlines()
    assert srun_args[-(len(HOSTILE) * 2 + 6) :] == [
        "--comment=x",
        *HOSTILE,
        str(bin_dir / "wrap"),
        *HOSTILE,
        str(bin_dir / "python"),
        "-m",
        "hpctrain.worker",
        str(run_dir),
    ]
    # The prefix wrapped the control steps (begin, after-step) and the task, each word intact.
    wrapped = (run_dir / "wrap-args").read_text().splitlines()
    assert wrapped.count(HOSTILE[0]) == 3 and wrapped.count("hpctrain.recovery.control") == 2
    assert wrapped[: len(HOSTILE) + 3] == [*HOSTILE, str(bin_dir / "python"), "-m", "hpctrain.recovery.control"]


@pytest.mark.parametrize("key", ["srun_args", "task_prefix"])
@pytest.mark.parametrize("bad, why", [("a\nb", "single line"), ("a\rb", "single line"), ("a\0b", "NUL")])
def test_a_newline_or_nul_in_a_word_is_refused_naming_it(key: str, bad: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"slurm\.{key}\[1\]: .*{why}"):
        SlurmConfig(**{key: ["--ok", bad] if key == "srun_args" else ["ok", bad]})


def test_a_newline_in_control_python_is_refused() -> None:
    with pytest.raises(ValueError, match=r"slurm\.control_python: must be a single line"):
        SlurmConfig(control_python="/usr/bin/python\nrm -rf ~")


def test_flags_that_only_start_like_hpctrains_own_are_taken() -> None:
    # --exclusive is not --exclude; --no-kill and --nodelist are srun's own, not abbreviations.
    words = ["--exclusive", "--no-kill", "--nodelist=node1", "--mpi=pmix", "--container-image=x"]
    assert SlurmConfig(srun_args=words).srun_args == words


@pytest.mark.parametrize(
    "values, key, words",
    [
        ({"task_prefix": ["--nv", "apptainer"]}, "slurm.task_prefix[0]", "srun's own flags go in slurm.srun_args"),
        ({"srun_args": ["apptainer"]}, "slurm.srun_args[0]", "must be an srun flag"),
        ({"srun_args": ["--mpi=pmix", "--nodes=3"]}, "slurm.srun_args[1]", "--nodes is set by hpctrain"),
        ({"srun_args": ["-N2"]}, "slurm.srun_args[0]", "-N2 is set by hpctrain"),
        ({"srun_args": ["--exclude=node1"]}, "slurm.srun_args[0]", "--exclude is set by hpctrain"),
        ({"srun_args": ["--kill-on-bad-exit=0"]}, "slurm.srun_args[0]", "is set by hpctrain"),
        ({"srun_args": ["--kill-on=0"]}, "slurm.srun_args[0]", "--kill-on is set by hpctrain"),
        ({"srun_args": ["--ntasks-per-n=2"]}, "slurm.srun_args[0]", "--ntasks-per-n is set by hpctrain"),
        ({"task_prefix": ["env", ""]}, "slurm.task_prefix[1]", "must not be empty"),
    ],
)
def test_words_that_would_break_the_launch_are_refused(values: dict, key: str, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        SlurmConfig(**values)
    assert str(refused.value).startswith(f"{key}: ") and words in str(refused.value)


# ---- the controller in an image without Slurm's commands ---------------------------------------


def test_control_decides_without_slurm_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.yaml").write_text("slurm:\n  nodes: 1\n  restart_budget: {crash: 1}\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no scontrol, no sinfo
    controller = Controller(tmp_path, env={"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]"})

    assert controller.after_step(1, terminated=False, excluded=[]) == "requeue"

    assert "set slurm.control_python" in capsys.readouterr().err
    assert [e["cause"] for e in events(tmp_path) if e["event"] == "requeue"] == ["crash"]


# ---- on the dev cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def marker_value(tag: str, marks: Path) -> str:
    """A word that, run by a shell anywhere, leaves a file in `marks`."""
    return f"{tag} $(touch {marks}/{tag}-dollar) `touch {marks}/{tag}-tick`; touch {marks}/{tag}-semi ' \" q"


@pytest.mark.slurm
def test_test_only_accepts_a_container_script(slurm_env: dict[str, str], tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    run_dir = tmp_path / "dry"
    prefix = ["env", "HPCTRAIN_CONTAINER_MARK=inside", marker_value("prefix", marks)]
    args = ["--export=ALL,HPCTRAIN_SRUN_MARK=1", f"--comment={marker_value('args', marks)}"]
    job_ids, out = submit(
        slurm_env,
        run_dir,
        "dry_run=true",
        "slurm.nodes=2",
        f"slurm.task_prefix={hydra_list(prefix)}",
        f"slurm.srun_args={hydra_list(args)}",
        f"slurm.control_python={sys.executable}",
    )
    assert job_ids == [] and shlex.join(args) in out
    done = subprocess.run(
        ["sbatch", "--test-only", str(run_dir / "job.sbatch")], env=slurm_env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr
    assert list(marks.iterdir()) == []


WRAPPER = """#!/bin/sh
# A container runtime's stand-in: notes what it wraps (the module, its first argument, the
# restart, the rank, whether srun's --export reached it), then becomes that command: srun's
# signals then reach the Python itself.
word="$1"; shift
printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' "$3" "$4" "${SLURM_RESTART_COUNT:-0}" "${SLURM_PROCID:--}" \\
  "${HPCTRAIN_SRUN_MARK:-unset}" "$word" >> LOG
exec "$@"
"""


def wrapped_commands(log: Path) -> list[dict[str, str]]:
    fields = ("module", "arg", "restart", "rank", "srun_mark", "word")
    return [dict(zip(fields, line.split("\t"))) for line in log.read_text().splitlines()]


@pytest.mark.slurm
def test_a_job_trains_and_requeues_through_the_prefix(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """Two nodes, one task each, every Python behind a wrapper; the batch shell is sent its
    time-limit signal mid-run: the tasks save (the signal reached the Python through the
    wrapper), the control steps, also through the wrapper, requeue, and the job trains to the end."""
    marks = tmp_path / "marks"
    marks.mkdir()
    tools = tmp_path / f"images {marker_value('tools', marks)}"
    tools.mkdir(parents=True)
    log = tmp_path / "wrapped.tsv"
    wrapper = tools / "enter container"
    wrapper.write_text(WRAPPER.replace(">> LOG", f">> {shlex.quote(str(log))}"))
    wrapper.chmod(0o755)
    word = marker_value("word", marks)
    run_dir = tmp_path / "run"
    config = [
        "trainer.max_steps=1500",
        "trainer.log_every=10",
        "trainer.eval_every=0",
        "trainer.ckpt_every=0",
        "slurm.nodes=2",
        "slurm.ntasks_per_node=1",
        f"slurm.job_name=hpctrain-container-{uuid.uuid4().hex[:8]}",
        f"slurm.task_prefix={hydra_list([str(wrapper), word])}",
        f"slurm.srun_args={hydra_list(['--export=ALL,HPCTRAIN_SRUN_MARK=1', '--comment=' + word])}",
    ]
    (job_id,), _ = submit(slurm_env, run_dir, *config)
    wait_for_step(run_dir, 20)
    signal_batch(slurm_env, job_id)
    lift_requeue_hold(slurm_env, job_id)
    assert wait_finished(slurm_env, job_id, timeout_s=300) == "COMPLETED", job_output(run_dir)

    journal = events(run_dir)
    saved = [e for e in journal if e["event"] == "checkpoint" and e["reason"] == "timelimit"]
    assert len(saved) == 1, journal
    assert [e["cause"] for e in journal if e["event"] == "requeue"] == ["timelimit"]
    starts = [e for e in journal if e["event"] == "start"]
    assert [s["restart"] for s in starts] == [0, 1] and starts[1]["resumed_from_step"] == saved[0]["step"]
    assert [e["step"] for e in journal if e["event"] == "finish"] == [1500]
    assert job_restarts(slurm_env, job_id) == 1
    # Every training process of both lives ran behind the wrapper, with srun's --export, and so
    # did every control step of the batch shell (outside srun: no --export).
    wrapped = wrapped_commands(log)
    tasks = sorted((w["restart"], w["rank"]) for w in wrapped if w["module"] == "hpctrain.worker")
    assert tasks == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], wrapped
    assert {w["srun_mark"] for w in wrapped if w["module"] == "hpctrain.worker"} == {"1"}
    control = [(w["restart"], w["arg"]) for w in wrapped if w["module"] == "hpctrain.recovery.control"]
    assert control == [("0", "begin"), ("0", "after-step"), ("0", "requeue"), ("1", "begin"), ("1", "after-step")], (
        wrapped
    )
    assert {w["srun_mark"] for w in wrapped if w["module"] == "hpctrain.recovery.control"} == {"unset"}
    # The hostile word arrived whole in the prefix, and nothing in it ran.
    assert {w["word"] for w in wrapped} == {word}
    assert list(marks.iterdir()) == []
    assert json.loads((run_dir / "submission.json").read_text())["job_id"] == job_id
    assert os.path.getsize(run_dir / "model.pt") > 0
