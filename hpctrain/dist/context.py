"""The distributed context: who this process is in the job, built once and passed around.

Sources, first match wins:
  - torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
  - a task of an srun step (SLURM_STEP_ID, SLURM_STEP_NUM_TASKS, ...: see hpctrain.slurm.env;
    a batch or salloc shell alone is no rank), meeting through a port and address rank 0
    publishes in the run dir (hpctrain.dist.rendezvous), or MASTER_PORT when set;
  - a local spawn by `hpctrain-train` (`DistContext.for_spawn`, a file:// rendezvous, no port);
  - otherwise a single process.
Whichever the source, the context carries the life stamp (hpctrain.run.life: which Slurm job and
restart this is) made from the same environment: every record the process writes names its life
from there.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.dist import rendezvous
from hpctrain.config.network import NetworkConfig
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir
from hpctrain.slurm import env as slurm_env

# init_method of an srun task without MASTER_PORT: rank 0 publishes a free port in the run dir.
PORT_FILE = "port-file"


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    # "env://" (MASTER_ADDR / MASTER_PORT), "file://<path>" (local spawn) or PORT_FILE (Slurm).
    init_method: str
    device: torch.device
    # Where the numbers came from: torchrun, slurm, spawn or single.
    source: str
    master_addr: str | None = None
    master_port: int | None = None
    # The node this process runs on as the scheduler names it (SLURMD_NODENAME under Slurm).
    node: str = ""
    # The srun step this task belongs to: with the life, names the rendezvous file of this launch.
    step_id: str = ""
    # The physical GPU this rank drives as the node names it (CUDA_VISIBLE_DEVICES entry), if any.
    gpu: str | None = None
    # Which Slurm job (`36`, `36_7` in an array) and restart this process lives in.
    life: LifeStamp = LifeStamp(job_id=None, restart=0)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.source != "single"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, cuda_devices: int | None = None) -> DistContext:
        env = os.environ if env is None else env
        cuda_devices = torch.cuda.device_count() if cuda_devices is None else cuda_devices
        life = LifeStamp.from_env(env)
        if "RANK" in env and "WORLD_SIZE" in env:
            return cls._from_torchrun(env, cuda_devices, life)
        if slurm_env.in_slurm_step(env):
            return cls._from_slurm(env, cuda_devices, life)
        return cls.single(cuda_devices, life)

    @classmethod
    def _from_slurm(cls, env: Mapping[str, str], cuda_devices: int, life: LifeStamp) -> DistContext:
        place = slurm_env.place(env)
        port = env.get("MASTER_PORT")
        return cls(
            rank=place.rank,
            local_rank=place.local_rank,
            world_size=place.world_size,
            local_world_size=place.local_world_size,
            init_method="env://" if port else PORT_FILE,
            device=select_device(place.local_rank, place.local_world_size, cuda_devices),
            source="slurm",
            master_addr=env.get("MASTER_ADDR") or place.master_addr,
            master_port=int(port) if port else None,
            node=env.get("SLURMD_NODENAME", ""),
            step_id=place.step_id,
            gpu=visible_gpu(env.get("CUDA_VISIBLE_DEVICES"), place.local_rank),
            life=life,
        )

    @classmethod
    def _from_torchrun(cls, env: Mapping[str, str], cuda_devices: int, life: LifeStamp) -> DistContext:
        world_size = _int(env, "WORLD_SIZE")
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", str(world_size)))
        return cls(
            rank=_int(env, "RANK"),
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            init_method="env://",
            device=select_device(local_rank, local_world_size, cuda_devices),
            source="torchrun",
            master_addr=env.get("MASTER_ADDR"),
            master_port=int(env["MASTER_PORT"]) if "MASTER_PORT" in env else None,
            life=life,
        )

    @classmethod
    def for_spawn(
        cls,
        local_rank: int,
        nprocs: int,
        store_path: str,
        cuda_devices: int | None = None,
        life: LifeStamp | None = None,
    ) -> DistContext:
        """A rank hpctrain-train spawned on this machine (inside a Slurm job too: `srun --pty`)."""
        cuda_devices = torch.cuda.device_count() if cuda_devices is None else cuda_devices
        return cls(
            rank=local_rank,
            local_rank=local_rank,
            world_size=nprocs,
            local_world_size=nprocs,
            init_method=f"file://{store_path}",
            device=select_device(local_rank, nprocs, cuda_devices),
            source="spawn",
            life=LifeStamp.from_env() if life is None else life,
        )

    @classmethod
    def single(cls, cuda_devices: int | None = None, life: LifeStamp | None = None) -> DistContext:
        cuda_devices = torch.cuda.device_count() if cuda_devices is None else cuda_devices
        life = LifeStamp.from_env() if life is None else life
        return cls(0, 0, 1, 1, "", select_device(0, 1, cuda_devices), "single", life=life)


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"environment variable {key}={env[key]!r} is not an integer") from None


def visible_gpu(visible: str | None, local_rank: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES entry this rank binds: its only one, or the LOCAL_RANK-th."""
    if not visible:
        return None
    ids = [v for v in visible.split(",") if v]
    if len(ids) == 1:
        return ids[0]
    return ids[local_rank] if local_rank < len(ids) else None


def select_device(local_rank: int, local_world_size: int, cuda_devices: int) -> torch.device:
    """The GPU this process drives: its own when each task sees one device
    (`srun --gpus-per-task=1`), device LOCAL_RANK when all of the node's devices are visible."""
    if cuda_devices == 0:
        return torch.device("cpu")
    if cuda_devices == 1:
        return torch.device("cuda", 0)
    if local_rank >= cuda_devices:
        raise ValueError(
            f"local rank {local_rank} of {local_world_size} has no GPU: only {cuda_devices} visible; "
            "run one task per GPU (slurm.ntasks_per_node = slurm.gpus_per_node)"
        )
    return torch.device("cuda", local_rank)


def backend_for(device: torch.device, requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(
    ctx: DistContext, backend: str, timeout_s: int, run_dir: Path, network: NetworkConfig | None = None
) -> None:
    """Join the job's process group (a no-op for a single process). `network` is the run's
    slurm.network: socket interfaces (unless the environment names them) and rank 0's address."""
    if not ctx.distributed:
        return
    network = network or NetworkConfig()
    for name, value in network.socket_env().items():
        os.environ.setdefault(name, value)  # the job script exports them too; a user's own wins
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    how: dict[str, object] = {"init_method": ctx.init_method}
    if ctx.init_method == PORT_FILE:
        path = rendezvous.port_file(RunDir(run_dir).rendezvous, ctx.life.job_id or "", ctx.life.restart, ctx.step_id)
        address = ""
        if ctx.is_main:
            address = rendezvous.rank0_address(ctx.node, network.master_addr_suffix, network.master_addr_ifname)
        how = {"store": rendezvous.open_store(ctx.rank, ctx.world_size, path, timeout_s, address)}
    elif ctx.init_method == "env://" and ctx.master_port:
        address = env_master_addr(ctx, network)
        if address:  # torchrun always sets its own
            os.environ.setdefault("MASTER_ADDR", address)
        os.environ.setdefault("MASTER_PORT", str(ctx.master_port))
    dist.init_process_group(
        backend=backend_for(ctx.device, backend),
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=ctx.device if ctx.device.type == "cuda" else None,
        **how,  # type: ignore[arg-type]
    )


def env_master_addr(ctx: DistContext, network: NetworkConfig) -> str:
    """MASTER_ADDR for an srun task given MASTER_PORT but no MASTER_ADDR: rank 0's node from
    the node list, with the site's suffix. Where only rank 0 knows its address, say so."""
    if ctx.source != "slurm" or "MASTER_ADDR" in os.environ:
        return os.environ.get("MASTER_ADDR", ctx.master_addr or "")
    why = ""
    if ctx.master_addr is None:
        why = "in a heterogeneous job's step (or an arbitrary layout) rank 0 may be on any node"
    elif network.master_addr_ifname:
        why = "slurm.network.master_addr_ifname is an address only rank 0's node can read"
    if why:
        raise slurm_env.SlurmEnvError(
            f"MASTER_PORT is set but MASTER_ADDR is not, and {why}: set MASTER_ADDR, or unset MASTER_PORT "
            "so rank 0 publishes its address in the run dir"
        )
    return f"{ctx.master_addr}{network.master_addr_suffix}"


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
