"""slurm.nodes as a range (`2-4`, Slurm's min-max, with trainer.elastic): its checks, the job
script it renders, and the batch shell that relaunches on the survivors, run for real in bash
with stand-ins for srun and the control step (no Slurm needed; the dev-cluster run is
tests/test_slurm_elastic.py)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from test_render import make_config

from hpctrain.config.schema import SlurmConfig, node_range
from hpctrain.submit.render import render

RANGES = {
    4: (4, 4),
    "4": (4, 4),
    "2-4": (2, 4),
    " 2 - 4 ": (2, 4),
    "3-3": (3, 3),
}
REFUSED = [0, -1, "4-2", "0-2", "2-", "-2", "two", "2-4-6", True, 2.5, None]


@pytest.mark.parametrize("nodes", list(RANGES))
def test_a_count_or_a_range_is_read(nodes: object) -> None:
    assert node_range(nodes) == RANGES[nodes]


@pytest.mark.parametrize("nodes", REFUSED)
def test_anything_else_is_refused_by_key(nodes: object) -> None:
    with pytest.raises(ValueError, match=r"^slurm\.nodes: must be a count of nodes >= 1 \(4\) or a range min-max"):
        node_range(nodes)


def test_the_config_keeps_a_count_a_count_and_writes_a_range_as_slurm_does() -> None:
    assert SlurmConfig(nodes="3").nodes == 3 and not SlurmConfig(nodes="3").elastic_nodes
    assert SlurmConfig(nodes="2-2").nodes == 2
    ranged = SlurmConfig(nodes=" 2 - 4")
    assert (ranged.nodes, ranged.min_nodes, ranged.max_nodes, ranged.elastic_nodes) == ("2-4", 2, 4, True)


def test_a_range_needs_trainer_elastic_and_no_spares() -> None:
    with pytest.raises(ValueError, match=r"slurm\.nodes: a range \(2-3\) needs trainer\.elastic=true"):
        make_config("slurm.nodes=2-3")
    with pytest.raises(ValueError, match=r"slurm\.spare_nodes: must be 0 with a range of nodes"):
        make_config("slurm.nodes=2-3", "trainer.elastic=true", "slurm.spare_nodes=1")
    assert make_config("slurm.nodes=2-3", "trainer.elastic=true").slurm.nodes == "2-3"


def test_the_job_asks_for_the_range_and_each_step_for_the_nodes_it_has(tmp_path: Path) -> None:
    config = make_config("slurm.nodes=2-3", "trainer.elastic=true", "slurm.ntasks_per_node=2", "trainer.threads=2")
    script = render(config, tmp_path, tmp_path).script
    # Not --ntasks-per-node: Slurm would count the tasks from the low end and give the fewest
    # nodes even with more free (seen on the dev cluster); each node gets its CPUs by --mincpus.
    assert "#SBATCH --nodes=2-3\n#SBATCH --mincpus=4\n" in script and "#SBATCH --ntasks-per-node" not in script
    assert 'srun --nodes="${step_nodes}" --ntasks="$(( step_nodes * 2 ))" --ntasks-per-node=2' in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    fixed = render(make_config("slurm.nodes=3"), tmp_path, tmp_path).script
    assert "#SBATCH --nodes=3\n" in fixed and "srun --nodes=3 --ntasks=3 --ntasks-per-node=1" in fixed
    assert "step_nodes" not in fixed


RELAUNCHES = {
    # A 3-node life lost node2: the next srun runs on 2 nodes, 2 tasks, node2 left out.
    "node lost": ("slurm.nodes=2-3", "relaunch node2 2", "--nodes=2 --ntasks=2 ", "--overlap --exclude=node2"),
    # A rank hung on nodes that all live: the same 3 nodes again, none left out (`-`).
    "hang, a range": ("slurm.nodes=2-3", "relaunch - 3", "--nodes=3 --ntasks=3 ", "--overlap "),
    "hang, a count": ("slurm.nodes=3", "relaunch -", "--nodes=3 --ntasks=3 ", "--overlap "),
}


@pytest.mark.parametrize("case", list(RELAUNCHES))
def test_the_batch_shell_relaunches_on_as_many_nodes_as_the_control_step_says(case: str, tmp_path: Path) -> None:
    """The control step says `relaunch ...` once, then `finish`: the relaunched srun as the line says."""
    nodes, line, shape, overlap = RELAUNCHES[case]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in python: the control step says relaunch once, then finish; the rest does nothing.
    (bin_dir / "python").write_text(
        "#!/bin/bash\n"
        'if [ "$3" = after-step ]; then\n'
        '  if [ -e "$HPCTRAIN_RUN_DIR/relaunched" ]; then echo finish; else touch "$HPCTRAIN_RUN_DIR/relaunched"; '
        f"echo '{line}'; fi\n"
        "fi\nexit 0\n"
    )
    (bin_dir / "srun").write_text('#!/bin/bash\necho "$*" >> "$HPCTRAIN_RUN_DIR/sruns"\n')
    for stand_in in ("python", "srun"):
        (bin_dir / stand_in).chmod(0o755)
    config = make_config(nodes, "trainer.elastic=true", "slurm.silent_node_timeout_s=0")
    config = replace(config, slurm=replace(config.slurm, python=str(bin_dir / "python"), warm_standby=False))
    (tmp_path / "job.sbatch").write_text(render(config, run_dir, tmp_path).script)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "5",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "node[1-3]",
    }
    done = subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    first, relaunched = (run_dir / "sruns").read_text().splitlines()
    assert first.startswith("--nodes=3 --ntasks=3 --ntasks-per-node=1") and "--exclude" not in first
    assert relaunched.startswith(f"{shape}--ntasks-per-node=1")
    assert overlap in relaunched and ("--exclude" in relaunched) is ("node2" in line), relaunched
