"""A submitted job of several nodes whose run dir is under a folder each node has its own of
(/tmp) is refused at the submit, naming slurm.node_local_dirs, and writes nothing; a site whose
folder is shared says so with slurm.node_local_dirs=[]."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import assert_refused, describe, run_cli

from hpctrain.submit.shared_dirs import node_local_dir, node_local_refusal

LOCAL = ["/tmp", "/var/tmp", "/dev/shm"]


@pytest.mark.parametrize(
    ("run_dir", "nodes", "refused_for"),
    [
        ("/tmp/runs/a", 2, "/tmp"),
        ("/tmp", 2, "/tmp"),
        ("/var/tmp/x/y", 4, "/var/tmp"),
        ("/dev/shm/r", 3, "/dev/shm"),
        ("/tmp/runs/a", 1, None),  # one node: the job sees the folder it writes
        ("/tmpfiles/a", 2, None),  # a folder whose name only starts so
        ("/home/u/runs/a", 2, None),
        ("/scratch/u/a", 8, None),
    ],
)
def test_which_run_dirs_each_node_would_have_its_own_of(run_dir: str, nodes: int, refused_for: str | None) -> None:
    refusal = node_local_refusal(Path(run_dir), nodes, LOCAL, "hydra.run.dir")
    if refused_for is None:
        assert refusal is None
    else:
        assert refusal is not None and refusal.startswith(f"hydra.run.dir: {run_dir} is under {refused_for}, ")
        assert f"the job spans {nodes} nodes" in refusal and "slurm.node_local_dirs=[]" in refusal
    assert node_local_refusal(Path(run_dir), nodes, [], "hydra.run.dir") is None  # a site that shares them


def test_a_link_into_a_node_local_folder_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "local"
    target.mkdir()
    link = tmp_path / "shared-looking"
    link.symlink_to(target)
    assert node_local_dir(link / "run", [str(target)]) == str(target)


def test_a_multi_node_job_under_tmp_is_refused_at_submit_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"  # pytest's tmp_path is under /tmp
    for nodes in (["slurm.nodes=2"], ["slurm.nodes=1", "slurm.spare_nodes=1"]):
        done = run_cli("submit", f"hydra.run.dir={run_dir}", *nodes, "dry_run=true", cwd=tmp_path)
        assert_refused(done, 2, f"error: hydra.run.dir: {run_dir} is under /tmp", "the job spans 2 nodes")
        assert not run_dir.exists()
    # One node, or a site that says its /tmp is shared: accepted.
    single = run_cli("submit", f"hydra.run.dir={run_dir}", "dry_run=true", cwd=tmp_path)
    assert single.returncode == 0, describe(single)
    shared = run_cli(
        "submit",
        f"hydra.run.dir={tmp_path / 'two'}",
        "slurm.nodes=2",
        "slurm.node_local_dirs=[]",
        "dry_run=true",
        cwd=tmp_path,
    )
    assert shared.returncode == 0, describe(shared)
