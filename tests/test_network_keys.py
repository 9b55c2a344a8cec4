"""slurm.network: socket interfaces and rank 0's address on a site's fast network."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from clitools import run_cli
from slurmtools import events, job_output, start_cluster, submit, wait_finished
from test_render import check_golden, rendered

from hpctrain.config.network import NetworkConfig
from hpctrain.dist import context as hdist
from hpctrain.dist.rendezvous import interface_ipv4, rank0_address

NETWORK = ("slurm.network.socket_ifname='ib0,ib1'", "slurm.network.master_addr_suffix=-ib")


def test_golden_site_profile_with_network_keys() -> None:
    check_golden("ddp_network.sbatch", rendered("cluster=example_site", *NETWORK))


@pytest.mark.parametrize(
    "values, error",
    [
        ({"socket_ifname": "ib0"}, None),
        ({"socket_ifname": "ib0,eth0.100,bond0:1"}, None),
        ({"master_addr_suffix": "i"}, None),
        ({"master_addr_suffix": ".ib.cluster"}, None),
        ({"master_addr_ifname": "ib0"}, None),
        ({"socket_ifname": "^docker,lo"}, "socket_ifname: '^docker' is not an interface name"),
        ({"socket_ifname": "ib0,"}, "socket_ifname: '' is not an interface name"),
        ({"socket_ifname": "a-very-long-name0"}, "socket_ifname: 'a-very-long-name0'"),
        ({"master_addr_suffix": "_ib"}, "master_addr_suffix: '_ib' may hold only"),
        ({"master_addr_ifname": "ib0 ib1"}, "master_addr_ifname: 'ib0 ib1' is not an interface name"),
        ({"master_addr_suffix": "i", "master_addr_ifname": "ib0"}, "not both"),
    ],
)
def test_network_values(values: dict[str, str], error: str | None) -> None:
    if error is None:
        NetworkConfig(**values)
    else:
        with pytest.raises(ValueError, match="slurm.network") as refused:
            NetworkConfig(**values)
        assert error in str(refused.value)


def test_socket_env_names_both_libraries() -> None:
    assert NetworkConfig().socket_env() == {}
    assert NetworkConfig(socket_ifname="ib0").socket_env() == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0"}


def test_a_process_group_opens_its_sockets_on_the_named_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variables are set before gloo starts (a user's own export wins); gloo then binds `lo`."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # recorded, so the test's value is undone after it
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "mine0")
    ctx = hdist.DistContext.for_spawn(0, 1, str(tmp_path / "store"), cuda_devices=0)
    hdist.init_process_group(ctx, "gloo", 30, tmp_path, NetworkConfig(socket_ifname="lo"))
    try:
        assert hdist.dist.get_world_size() == 1
    finally:
        hdist.destroy_process_group()
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("lo", "mine0")


@pytest.mark.parametrize(
    "node, suffix, ifname, address",
    [
        ("node1", "i", "", "node1i"),  # the site's naming on the fast network, resolvable or not
        ("node1", "", "lo", "127.0.0.1"),  # the interface's own address
        ("localhost", "", "", "localhost"),  # a node name that resolves is used as is
        ("no-such-node-x9", "", "", socket.gethostname()),  # one that does not: the host name
    ],
)
def test_rank0_address(node: str, suffix: str, ifname: str, address: str) -> None:
    assert rank0_address(node, suffix, ifname) == address


def test_a_missing_interface_is_said_by_key() -> None:
    with pytest.raises(OSError, match="slurm.network.master_addr_ifname: .* no IPv4 address on interface 'nosuch9'"):
        interface_ipv4("nosuch9")


def test_dry_run_shows_the_network_lines(tmp_path: Path) -> None:
    done = run_cli("submit", "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}", *NETWORK, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for line in (
        "export NCCL_SOCKET_IFNAME=ib0,ib1",
        "export GLOO_SOCKET_IFNAME=ib0,ib1",
        "# slurm.network: rank 0 publishes MASTER_ADDR = its node name + -ib",
    ):
        assert line in done.stdout


@pytest.mark.slurm
def test_a_job_meets_on_the_named_interface(tmp_path: Path) -> None:
    """On the dev cluster every node is this host: `lo` is the fast network. Rank 0 publishes its
    address on it, and gloo opens its sockets there."""
    env = start_cluster()
    run_dir = tmp_path / "run"
    (job_id,), _ = submit(
        env,
        run_dir,
        "model=mlp",
        "trainer.max_steps=4",
        "trainer.eval_every=0",
        "slurm.nodes=2",
        "slurm.network.socket_ifname=lo",
        "slurm.network.master_addr_ifname=lo",
    )
    assert wait_finished(env, job_id) == "COMPLETED", job_output(run_dir)
    (record,) = (run_dir / ".rendezvous").glob(f"{job_id}.r0.s*.port")
    assert json.loads(record.read_text())["addr"] == "127.0.0.1"
    assert [e["world_size"] for e in events(run_dir) if e["event"] == "start"] == [2]
