"""The code a job was submitted with is the code every life of it imports (slurm.code_snapshot).

Pure parts as tables (which `_target_`s, which folders are installed libraries, what git says),
the rendered PYTHONPATH line with a hostile path, and one dev-cluster test: two jobs of a user
model, one with the snapshot and one without; the model's code changes after submitting, both
are preempted and requeued; the snapshot job resumes with the old code and ends bit-identical
to an uninterrupted run, the other imports the new code.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
from slurmtools import (
    events,
    job_output,
    lift_requeue_hold,
    preempt_everything,
    start_cluster,
    wait_finished,
    wait_for_step,
)
from test_render import make_config

from hpctrain.submit import git_state
from hpctrain.submit.code_snapshot import MANIFEST, CodeSnapshot, installed_beside, is_installed_library, targets_in
from hpctrain.submit.render import render

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        ({"model": {"_target_": "a.b.Net", "width": 3}}, ["a.b.Net"]),
        ({"model": {"_target_": "a.Net"}, "data": {"_target_": "a.Net"}}, ["a.Net"]),
        ({"optim": {"_target_": "torch.optim.AdamW", "inner": [{"_target_": "x.Y"}]}}, ["torch.optim.AdamW", "x.Y"]),
        ({"model": {"_target_": ""}, "slurm": {"nodes": 1}}, []),
        ({"_target_": 3}, []),
    ],
)
def test_targets_in(tree: dict, expected: list[str]) -> None:
    assert targets_in(tree) == expected


@pytest.mark.parametrize(
    ("path", "installed"),
    [
        ("/lib/py/site-packages/torch", True),
        ("/lib/py/site-packages", True),
        ("/home/me/proj/net.py", False),
        ("/lib/py/site-packages-old/x", False),
        ("/lib/py/os.py", False),
    ],
)
def test_is_installed_library(path: str, installed: bool) -> None:
    assert is_installed_library(Path(path), [Path("/lib/py/site-packages")]) is installed


def make_project(root: Path, source: str) -> Path:
    root.mkdir(parents=True)
    (root / "usernet.py").write_text(source)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", "first"], check=True)
    return root


def test_git_state_records_commit_diff_and_untracked(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj", "A = 1\n")
    commit = subprocess.run(["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert git_state.describe(project)["dirty"] is False
    (project / "usernet.py").write_text("A = 2\n")
    (project / "notes.txt").write_text("x")
    (project / "runs" / "r1").mkdir(parents=True)
    (project / "runs" / "r1" / "config.yaml").write_text("x")
    state = git_state.describe(project / "runs", leave_out=project / "runs" / "r1")
    assert state["commit"] == commit.strip() and state["root"] == str(project.resolve())
    assert state["dirty"] and "-A = 1\n+A = 2" in state["diff"]
    assert state["untracked"] == ["notes.txt"]  # the run dir being written is left out
    assert git_state.describe(tmp_path / "elsewhere") is None
    empty = tmp_path / "empty"
    subprocess.run(["git", "init", "-q", str(empty)], check=True)
    assert "rev-parse --verify HEAD failed" in git_state.describe(empty)["error"]


def test_snapshot_copies_user_code_and_records_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = make_project(tmp_path / "proj", "A = 1\n")
    (project / "userpkg").mkdir()
    (project / "userpkg" / "__init__.py").write_text("B = 1\n")
    monkeypatch.syspath_prepend(str(project))
    snapshot = CodeSnapshot(project / "run" / "code")
    snapshot.include(
        ["usernet.Net", "torch.optim.AdamW", "hpctrain.models.convnet.ConvNet", "builtins.dict", "dict"], project
    )
    snapshot.include(["userpkg.Thing", "usernet.Net"], project)  # a sweep's next point
    code = project / "run" / "code"
    assert (code / "usernet.py").read_text() == "A = 1\n" and (code / "userpkg" / "__init__.py").is_file()
    assert (code / "hpctrain" / "sbatch_templates" / "ddp.sbatch.j2").is_file()  # links followed
    manifest = json.loads((code / MANIFEST).read_text())
    assert set(manifest["modules"]) == {"usernet", "userpkg"}
    torch_dir = str(Path(torch.__file__).parent)
    assert manifest["libraries"] == {"torch": torch_dir, "builtins": "built-in", "dict": "built-in"}
    assert manifest["git"][0]["root"] == str(project.resolve()) and manifest["bytes"] > 0


def _site_folder(folder: Path, *names: str) -> Path:
    """A folder on PYTHONPATH as `module load pytorch` gives one: links to what pip installed
    here (the packages and their real *.dist-info records), outside this Python's own folders."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    for pattern in names:
        for entry in site.glob(pattern):
            (folder / entry.name).symlink_to(entry)
    return folder


def test_libraries_on_a_site_folder_are_recorded_not_copied(tmp_path: Path) -> None:
    modules = _site_folder(tmp_path / "modules", "torch", "torch-*.dist-info", "typing_extensions*")
    # torch's record has a top_level.txt; typing_extensions (built by flit) only a RECORD naming
    # its one file. A folder of links resolves into site-packages, also looked at.
    assert installed_beside(modules / "torch", "torch")
    assert installed_beside(modules / "typing_extensions.py", "typing_extensions")
    # Linked without its record: the link resolves into site-packages, whose record names it.
    assert installed_beside(_site_folder(tmp_path / "links", "torch") / "torch", "torch")
    # The user's checkout: setuptools left an egg-info there when it built the editable install.
    project = tmp_path / "proj"
    (project / "userpkg.egg-info").mkdir(parents=True)
    (project / "userpkg.egg-info" / "top_level.txt").write_text("userpkg\n")
    (project / "userpkg").mkdir()
    assert not installed_beside(project / "userpkg", "userpkg")
    # torch's record does not claim a user's package that happens to sit beside it.
    (modules / "mymodel.py").write_text("A = 1\n")
    assert not installed_beside(modules / "mymodel.py", "mymodel")

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(modules))
        patch.delitem(sys.modules, "typing_extensions", raising=False)
        snapshot = CodeSnapshot(tmp_path / "run" / "code")
        snapshot.include(["typing_extensions.Literal", "mymodel.Net"], tmp_path)
    manifest = json.loads((tmp_path / "run" / "code" / MANIFEST).read_text())
    assert manifest["libraries"] == {"typing_extensions": str(modules / "typing_extensions.py")}
    assert set(manifest["modules"]) == {"mymodel"} and (tmp_path / "run" / "code" / "mymodel.py").is_file()


def test_rendered_script_imports_the_snapshot_first(tmp_path: Path) -> None:
    code_dir = tmp_path / "a'; touch pwned; echo '" / "code"
    script = render(make_config(), tmp_path / "run", tmp_path / "sub mit", code_dir).script
    lines = [line for line in script.splitlines() if line.startswith("export PYTHON")]
    shell = "PYTHONPATH=/site/lib\n" + "\n".join(lines) + '\nprintf "%s\\n" "$PYTHONPATH" "$PYTHONSAFEPATH"'
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert done.stdout.splitlines() == [f"{code_dir}:/site/lib:{tmp_path / 'sub mit'}", "1"]
    assert not (tmp_path / "pwned").exists()
    site_template = tmp_path / "site.sbatch.j2"
    site_template.write_text("#!/bin/bash\n{{ task_command | words }} -m hpctrain.worker {{ run_dir | q }}\n")
    config = make_config(f"slurm.template={site_template}")
    with pytest.raises(ValueError, match="slurm.template: site.sbatch.j2 does not put the code snapshot"):
        render(config, tmp_path / "run", tmp_path, code_dir)
    assert shlex.quote(str(code_dir)) not in render(config, tmp_path / "run", tmp_path).script


# ---- on the dev cluster -------------------------------------------------------------------

USERNET = """
import os, time
import hpctrain
from hpctrain.models.convnet import ConvNet

VERSION, SCALE = {version!r}, {scale}
with open(os.environ["USERNET_IMPORT_LOG"], "a") as log:  # one line per importing process
    log.write(f"{{VERSION}} {{hpctrain.__file__}} {{os.environ.get('SLURM_JOB_ID', '-')}}\\n")


class UserNet(ConvNet):
    def forward(self, x):
        if self.training:  # slow enough to be preempted mid-run; the pause changes no weight
            time.sleep(float(os.environ.get("USERNET_PAUSE_S", "0")))
        return super().forward(x) * SCALE
"""
CONFIG = [
    "model._target_=usernet.UserNet",
    "trainer.max_steps=300",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.ckpt_every=20",
    "slurm.nodes=1",
    "slurm.ntasks_per_node=1",
]


def submit_from(project: Path, env: dict[str, str], run_dir: Path, *overrides: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.cli.submit",
            f"hydra.run.dir={run_dir}",
            "cluster=devcluster",
            *CONFIG,
            *overrides,
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"hpctrain-submit failed:\n{done.stdout}\n{done.stderr}"
    (job_id,) = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("Submitted batch job ")]
    return job_id


def imports(log: Path) -> list[list[str]]:
    """(version, hpctrain's file) of each import by a process of a Slurm job: the submit's own
    config check may import the model too (unless the target cache knew its signature), and
    a job may import it before that submit process has ended."""
    lines = [line.rsplit(" ", 1) for line in log.read_text().splitlines()]
    return [head.split(" ", 1) for head, job in lines if job != "-"]


@pytest.mark.slurm
def test_requeued_job_runs_the_code_it_was_submitted_with(tmp_path: Path) -> None:
    env = {**start_cluster(), "USERNET_PAUSE_S": "0.05"}
    env.pop("PYTHONPATH", None)
    project = make_project(tmp_path / "proj", textwrap.dedent(USERNET.format(version="old", scale=1.0)))
    frozen, live = tmp_path / "frozen", tmp_path / "live"
    jobs = {}
    for run_dir, snapshot in ((frozen, "true"), (live, "false")):
        log = tmp_path / f"{run_dir.name}.imports"
        jobs[run_dir] = submit_from(
            project, {**env, "USERNET_IMPORT_LOG": str(log)}, run_dir, f"slurm.code_snapshot={snapshot}"
        )
    # The reference trains the submitted code, uninterrupted, from a copy of it.
    reference_code = tmp_path / "reference-code"
    reference_code.mkdir()
    (reference_code / "usernet.py").write_text((project / "usernet.py").read_text())
    reference = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.cli.train", f"hydra.run.dir={tmp_path / 'reference'}", *CONFIG],
        cwd=tmp_path,
        env={
            **env,
            "PYTHONPATH": str(reference_code),
            "USERNET_PAUSE_S": "0",
            "USERNET_IMPORT_LOG": str(tmp_path / "reference.imports"),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for run_dir in jobs:
        wait_for_step(run_dir, 40)
    # The user edits the model (and commits) while the jobs run; then a high-priority job needing
    # every node preempts both, and they are requeued.
    (project / "usernet.py").write_text(textwrap.dedent(USERNET.format(version="new", scale=2.0)))
    subprocess.run([*GIT, "-C", str(project), "commit", "-qam", "new model"], check=True)
    urgent = preempt_everything(env)
    for job_id in jobs.values():
        lift_requeue_hold(env, job_id)
    assert wait_finished(env, urgent) == "COMPLETED"
    for run_dir, job_id in jobs.items():
        assert wait_finished(env, job_id, timeout_s=600) == "COMPLETED", job_output(run_dir)
        starts = [e for e in events(run_dir) if e["event"] == "start"]
        assert [s["restart"] for s in starts] == [0, 1], events(run_dir)
        assert starts[1]["resumed_from_step"] > 0
    output, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, output[-3000:]

    # With the snapshot: both lives imported the old model and hpctrain from the run dir's code/.
    snapshot_hpctrain = str(frozen / "code" / "hpctrain" / "__init__.py")
    assert imports(tmp_path / "frozen.imports") == [["old", snapshot_hpctrain]] * 2
    assert same_weights(frozen / "model.pt", tmp_path / "reference" / "model.pt")
    manifest = json.loads((frozen / "code" / MANIFEST).read_text())
    assert manifest["modules"] == {"usernet": str(project / "usernet.py")}
    assert json.loads((frozen / "submission.json").read_text())["code_snapshot"]["dir"] == str(frozen / "code")
    # Without it: the resumed life imported the edited model, and the weights show it.
    assert [version for version, _ in imports(tmp_path / "live.imports")] == ["old", "new"]
    assert not (live / "code").exists()
    assert not same_weights(live / "model.pt", tmp_path / "reference" / "model.pt")


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
