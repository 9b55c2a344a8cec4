"""hpctrain's Slurm host list parser against what `scontrol show hostnames` prints (22.05)."""

from __future__ import annotations

import subprocess

import pytest
from slurmtools import start_cluster

from hpctrain.slurm.hostlist import HostlistError, expand

# Each row's answer is scontrol's own on Slurm 22.05.
EXPANDS = [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("gpu-[001-003,010]", ["gpu-001", "gpu-002", "gpu-003", "gpu-010"]),
    ("node[1-3],login1", ["node1", "node2", "node3", "login1"]),
    ("login1,gpu-[001-002]", ["login1", "gpu-001", "gpu-002"]),
    ("rack1-n[9-10]", ["rack1-n9", "rack1-n10"]),
    ("n[09-11]", ["n09", "n10", "n11"]),  # the lower bound's width pads
    ("n[8-12]", ["n8", "n9", "n10", "n11", "n12"]),
    ("n[0001-2]", ["n0001", "n0002"]),
    ("a[07,3-4]", ["a07", "a3", "a4"]),  # Slurm keeps the order given
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ("n[1-1]", ["n1"]),
    ("n[1-2],n[2-3]", ["n1", "n2", "n2", "n3"]),  # duplicates kept, as Slurm does
    ("x[1,2],,y", ["x1", "x2", "y"]),
    ("", []),
]


@pytest.mark.parametrize("hostlist, hosts", EXPANDS)
def test_expand(hostlist: str, hosts: list[str]) -> None:
    assert expand(hostlist) == hosts


# scontrol calls the first four invalid; the others it misreads (`n[1-3` gives "n]"), so they are
# refused rather than guessed at.
MALFORMED = [
    ("n[3-1]", "runs backwards"),
    ("n[]", "not a number or a range"),
    ("n[a-b]", "not a number or a range"),
    ("n[-2]", "not a number or a range"),
    ("n[1-]", "not a number or a range"),
    ("n[1-3", "not closed"),
    ("n1-3]", "do not pair up"),
    ("n[[1]]", "do not pair up"),
    ("n[1-2] m3", "not part of a host name"),
]


@pytest.mark.parametrize("hostlist, says", MALFORMED)
def test_malformed_host_list_is_refused_by_name(hostlist: str, says: str) -> None:
    with pytest.raises(HostlistError, match=f"SLURM_JOB_NODELIST=.*{says}"):
        expand(hostlist, "SLURM_JOB_NODELIST")


@pytest.mark.slurm
def test_table_agrees_with_scontrol() -> None:
    """The table above, asked of the installed Slurm in one call per row."""
    env = start_cluster()
    for hostlist, hosts in EXPANDS:
        done = subprocess.run(["scontrol", "show", "hostnames", hostlist], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == hosts, hostlist
