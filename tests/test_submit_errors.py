"""hpctrain-submit's failures: said plainly, non-zero, and no run dir or job left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fakeslurm import FakeSlurm, Said, captured


def submit(tmp_path: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.submit", f"hydra.run.dir={tmp_path / 'run'}", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_sbatch_on_path_is_said_plainly(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python, but no Slurm commands
    done = submit(tmp_path, env)
    assert done.returncode == 1
    assert "sbatch: not found on PATH" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_sbatch_refusal_is_shown_in_its_own_words(tmp_path: Path) -> None:
    # A stand-in sbatch that refuses like Slurm does for an unknown partition.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n"
    )
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = submit(tmp_path, env, "slurm.partition=nope")
    assert done.returncode == 1
    assert "Invalid partition name specified" in done.stderr and "Traceback" not in done.stderr
    assert "Submitted batch job" not in done.stdout
    assert not (tmp_path / "run").exists()


def test_bad_value_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    done = submit(tmp_path, dict(os.environ), "slurm.nodes=-1")
    assert done.returncode == 2 and "slurm.nodes" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_node_range_whose_sizes_cannot_go_on_at_each_other_is_refused_at_submit(tmp_path: Path) -> None:
    """Micro-batches of one sample cannot be cut equal in number on 3 nodes of a run that started on
    4 (a global batch of 4 on 3 processes: 2 or 1 each): refused now, not at the first node lost."""
    # (tmp_path is under /tmp, which the submit would refuse for a job of several nodes.)
    ranged = (
        "slurm.nodes=2-4",
        "trainer.elastic=true",
        "data.batch_size=1",
        "dry_run=true",
        "slurm.node_local_dirs=[]",
    )
    done = submit(tmp_path, dict(os.environ), *ranged)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: slurm.nodes: nodes 2-4 with 1 process each and data.batch_size=1")
    assert "started on 4 (a global batch of 4) it cannot go on on 3" in done.stderr
    assert "started on 2 (a global batch of 2) it cannot go on on 3" in done.stderr
    assert not (tmp_path / "run").exists()
    # Two samples a micro-batch: every size shares every global batch of the range (3: 2, 1, 1 of 4).
    fits = submit(tmp_path, dict(os.environ), *ranged[:2], "data.batch_size=2", *ranged[3:])
    assert fits.returncode == 0, fits.stderr


def test_a_run_dir_of_an_older_hpctrain_resumes_and_watch_settings_may_change(tmp_path: Path) -> None:
    """A run dir written before keys were added to the schema (its config.yaml lacks them) is the
    same run when they hold their defaults; switching a metrics sink or the progress bar is not
    another run; a changed learning rate is."""
    import yaml

    first = submit(tmp_path, dict(os.environ), "dry_run=true")
    assert first.returncode == 0, first.stderr
    config_path = tmp_path / "run" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    for key in ("srun_args", "task_prefix", "control_python"):
        del config["slurm"][key]
    del config["slurm"]["restart_budget"]["hang"]
    del config["trainer"]["progress_bar"]
    del config["metrics"]
    config_path.write_text(yaml.safe_dump(config))

    again = submit(tmp_path, dict(os.environ), "dry_run=true", "metrics.tensorboard=true", "trainer.progress_bar=off")
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(config_path.read_text())["metrics"]["tensorboard"] is True

    changed = submit(tmp_path, dict(os.environ), "dry_run=true", "optim.lr=0.5")
    assert changed.returncode == 2 and "optim.lr" in changed.stderr and "Traceback" not in changed.stderr


def test_an_sbatch_without_a_reply_keeps_the_run_dir_its_job_may_train_in(tmp_path: Path) -> None:
    """A stopped slurmctld: sbatch fails with "Socket timed out" and (seen on the dev cluster) its
    job is queued once slurmctld goes on. The run dir stays, and the message says why."""
    fake = FakeSlurm(tmp_path / "fake-slurm").says("sbatch", captured("stopped_sbatch"))
    env = {**os.environ, "PATH": f"{fake.bin}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM": str(fake.folder)}
    done = submit(tmp_path, env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "may have been queued all the same" in done.stderr and "Socket timed out" in done.stderr
    assert len(fake.calls("sbatch")) == 1  # never sent twice: two jobs would train in one run dir
    assert (tmp_path / "run" / "job.sbatch").is_file()


def test_an_sbatch_that_could_not_connect_is_sent_again(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path / "fake-slurm").says("sbatch", captured("down_sbatch"), Said(out="42\n"))
    env = {**os.environ, "PATH": f"{fake.bin}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM": str(fake.folder)}
    done = submit(tmp_path, env)
    assert done.returncode == 0, done.stderr
    # Two tries of the job (the first never reached Slurm), then its guardian.
    training = [c for c in fake.calls("sbatch") if c[-1].endswith("job.sbatch")]
    assert "Submitted batch job 42" in done.stdout and len(training) == 2


def test_a_partition_name_slurm_cannot_take_is_refused_before_anything(tmp_path: Path) -> None:
    done = submit(tmp_path, dict(os.environ), "slurm.partition='gpu a100'", "dry_run=true")
    assert done.returncode == 2, done.stderr
    assert "slurm.partition: 'gpu a100' is not a Slurm partition name" in done.stderr
    assert not (tmp_path / "run").exists()
    several = submit(tmp_path, dict(os.environ), "slurm.partition='gpu,gpu-long'", "dry_run=true")
    assert several.returncode == 0, several.stderr  # sbatch -p takes a list: Slurm picks one


def test_the_time_limit_is_echoed_as_slurm_reads_it(tmp_path: Path) -> None:
    done = submit(tmp_path, dict(os.environ), "slurm.time=25:00", "dry_run=true")
    assert done.returncode == 0, done.stderr
    assert "# time limit 25:00: 25 minutes (Slurm reads one colon as minutes:seconds; hours are HH:MM:SS)" in (
        done.stdout
    )
