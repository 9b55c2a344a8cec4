"""Every way of installing gives working console scripts: `pip install -e .` (setuptools' default
editable mode), `pip install .` and a built wheel, each into a fresh venv.

torch (1.4 GB) and the other dependencies are not installed again: each venv sees them through
a .pth line naming a folder of links to this interpreter's site-packages, hpctrain's own files
left out. pip then finds every requirement satisfied (`--no-index`: nothing is downloaded), and
hpctrain itself can only come from the install under test, which the test checks by asking the
venv where `hpctrain` and the launcher were imported from. Every command runs from a folder
outside the repository, with no PYTHONPATH, so the checkout is never on sys.path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_TIMEOUT_S = 300
RUN_TIMEOUT_S = 300
# Entries of site-packages that belong to hpctrain's own install (the repository's venv).
_OURS = ("hpctrain", "__editable__", "_hpctrain", "hydra_plugins", "__pycache__")

pytestmark = pytest.mark.slow


def _dependencies(folder: Path) -> Path:
    """A folder of links to this interpreter's site-packages, hpctrain's own entries left out."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    for entry in site.iterdir():
        if entry.name.startswith(_OURS) or entry.suffix == ".pth":
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def _source(folder: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked and new, not ignored ones),
    copied so that builds write build/ and *.egg-info there, never into the checkout."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source, target = ROOT / name, folder / name
        if not os.path.lexists(source):  # deleted but not yet committed
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # hpctrain/conf and hpctrain/sbatch_templates
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return folder


def _venv(folder: Path, dependencies: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=PIP_TIMEOUT_S)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A .pth line appends to sys.path: the venv's own site-packages (the install under test) wins.
    (Path(purelib) / "zz_dependencies.pth").write_text(f"{dependencies}\n")
    return python


def _pip(python: Path, *args: str, cwd: Path) -> None:
    # This interpreter's pip, acting on the new venv (pip --python): no pip inside each venv.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            *args,
            "--no-index",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--quiet",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _install(way: str, python: Path, source: Path, work: Path) -> None:
    if way == "editable":
        _pip(python, "install", "-e", str(source), cwd=work)
    elif way == "directory":
        _pip(python, "install", str(source), cwd=work)
    else:
        wheels = work / "wheels"
        _pip(python, "wheel", "--no-deps", "-w", str(wheels), str(source), cwd=work)
        (wheel,) = wheels.glob("hpctrain-*.whl")
        _pip(python, "install", str(wheel), cwd=work)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, (
        f"{' '.join(command)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


def _imported_from(python: Path, module: str, cwd: Path) -> Path:
    done = _run([str(python), "-c", f"import {module} as m; print(m.__file__)"], cwd)
    return Path(done.stdout.strip()).resolve()


@pytest.mark.parametrize("way", ["editable", "directory", "wheel"])
def test_install_gives_working_console_scripts(way: str, tmp_path: Path) -> None:
    source = _source(tmp_path / "src")
    python = _venv(tmp_path / "venv", _dependencies(tmp_path / "deps"))
    work = tmp_path / "work"
    work.mkdir()
    _install(way, python, source, work)

    # hpctrain and its launcher come from the install under test, never from the checkout.
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work).stdout.strip()
    ).resolve()
    home = source.resolve() if way == "editable" else site
    assert _imported_from(python, "hpctrain", work) == home / "hpctrain" / "__init__.py"
    launcher = _imported_from(python, "hydra_plugins.hpctrain_launcher.launcher", work)
    assert launcher == home / "hydra_plugins" / "hpctrain_launcher" / "launcher.py"

    # What differs between the ways is where hpctrain is imported from (checked above) and
    # whether its package data (templates, configs) and the launcher plugin are found: the two
    # submits below. Training (torch, the worker) runs the same code once it is importable: it
    # runs for the wheel, whose files a directory install lays out alike (about 6 s of CPU less).
    scripts = python.parent
    shown = ["sweep"]
    if way == "wheel":
        trained = _run(
            [str(scripts / "hpctrain-train"), "trainer=smoke", "trainer.max_steps=4", "hydra.run.dir=trained"], work
        )
        assert (work / "trained" / "model.pt").is_file(), trained.stderr[-2000:]
        shown.insert(0, "trained")

    _submits_find_templates_and_the_launcher(python, work, home)

    status = _run([str(scripts / "hpctrain-status"), *shown], work)
    rows = status.stdout.splitlines()[1:]
    assert len(rows) == len(shown) + 1, status.stdout  # a row per sweep point
    if way == "wheel":
        assert "FINISHED" in rows[0] and "4/4" in rows[0], status.stdout
        exported = _run([str(scripts / "hpctrain-export"), "trained", "--out", "weights.pt"], work)
        assert "step 4 of trained" in exported.stdout and (work / "weights.pt").is_file(), exported.stderr

    # The sweep operations: a dry-run sweep has no job to cancel or retry, and says so.
    cancel = _run([str(scripts / "hpctrain-cancel"), "--dry-run", "sweep"], work)
    assert "nothing to cancel" in cancel.stdout and "never submitted" in cancel.stdout, cancel.stdout
    retry = _run([str(scripts / "hpctrain-submit"), "--retry", "--dry-run", "sweep"], work)
    assert "nothing to retry" in retry.stdout, retry.stdout


def _submits_find_templates_and_the_launcher(python: Path, work: Path, home: Path) -> None:
    scripts = python.parent
    _run([str(scripts / "hpctrain-submit"), "dry_run=true", "hydra.run.dir=single"], work)
    script = (work / "single" / "job.sbatch").read_text()
    assert str(python) in script  # slurm.python empty: the tasks run the submitting Python
    # The code snapshot copies hpctrain from where this install put it.
    snapshot = json.loads((work / "single" / "code" / "snapshot.json").read_text())
    assert Path(snapshot["hpctrain"]["installed_at"]).resolve() == home / "hpctrain"
    assert (work / "single" / "code" / "hpctrain" / "conf" / "config.yaml").is_file()
    # torch comes from a folder on a .pth line, outside this venv (as a site's `module load`
    # gives it): its installer's record says it is a library, recorded and never copied.
    assert "torch" in snapshot["libraries"] and not (work / "single" / "code" / "torch").exists(), snapshot

    # A sweep needs Hydra to discover hpctrain's sweeper and launcher through this install.
    _run([str(scripts / "hpctrain-submit"), "-m", "dry_run=true", "optim.lr=1e-3,2e-3", "hydra.sweep.dir=sweep"], work)
    assert sorted(p.name for p in (work / "sweep").iterdir() if (p / "job.sbatch").is_file()) == ["0", "1"]
