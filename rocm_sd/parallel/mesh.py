"""Which device and which share of the work this process has: one process per GPU, launched by torchrun.

Two ways to use N processes (shared/reference/integrations.md section 4):
  data  every rank runs its own pipeline on different prompts (throughput);
  cfg   ranks work in pairs: both run the same images, and each UNet step's batch, the unconditional
        and the conditional half of classifier-free guidance, is split over the pair (latency).
        With 4 or more ranks the pairs are data parallel among themselves.
Without torchrun (no WORLD_SIZE in the environment) it is one process and no process group.
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .. import platform
from .arguments import DEFAULT_TIMEOUT_S, MODES

if TYPE_CHECKING:
    from .lookout import Lookout


@dataclass(frozen=True)
class Mesh:
    rank: int
    world: int
    local_rank: int
    cfg: int                      # ranks per image: 2 in cfg mode, else 1
    device: torch.device
    cfg_group: object = None      # the process group of this rank's CFG pair (cfg mode only)
    lookout: Lookout | None = None  # this rank's watch on the others, where the caller started one
    timeout_s: float = DEFAULT_TIMEOUT_S  # every group's and collective's longest wait for another rank

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def dp(self) -> int:
        """How many images (batches) are made at once: one per rank, or one per CFG pair."""
        return self.world // self.cfg

    @property
    def dp_index(self) -> int:
        return self.rank // self.cfg

    @property
    def is_leader(self) -> bool:
        """The rank that hands in its pair's images (both ranks of a pair make the same ones)."""
        return self.rank % self.cfg == 0


def init(mode: str = "data", timeout_s: float = DEFAULT_TIMEOUT_S) -> Mesh:
    """Join the torchrun job (NCCL on GPUs, which is RCCL on ROCm; gloo on CPUs) and pick this rank's GPU."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cfg = 2 if mode == "cfg" else 1
    if world % cfg:
        raise ValueError(f"cfg mode splits each step over a pair of GPUs: it needs an even number of processes, "
                         f"got {world} (torchrun --nproc-per-node 2)")
    if platform.gpu_available():
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible: "
                               "use --nproc-per-node <= the GPU count")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout,
                                device_id=device if device.type == "cuda" else None)
    cfg_group = None
    if cfg == 2:
        if world == 1:
            raise ValueError("cfg mode needs 2 processes, one per GPU: launch with torchrun --nproc-per-node 2")
        for first in range(0, world, 2):  # every rank creates every group, in the same order
            # A new group does not inherit the default group's timeout: without one, gloo waits 30 minutes.
            group = dist.new_group([first, first + 1], timeout=timeout)
            if rank in (first, first + 1):
                cfg_group = group
    return Mesh(rank=rank, world=world, local_rank=local_rank, cfg=cfg, device=device, cfg_group=cfg_group,
                timeout_s=timeout_s)


def shutdown(wait_s: float = 60.0) -> None:
    """Leave the job cleanly: every rank is done with the groups before any rank tears them down, and no rank
    exits before every rank has torn them down. A gloo rank still tearing down when a peer's process exits
    (its sockets close) aborts with SIGABRT: seen in CI on 2026-11-21 and again, with the barrier alone, on
    2026-11-22 (4 processes, cfg mode). The second wait goes through the job's store, which outlives the groups."""
    if not dist.is_initialized():
        return
    store, world = dist.distributed_c10d._get_default_store(), dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()
    try:
        store.add(_LEFT, 1)
        deadline = time.monotonic() + wait_s
        while store.add(_LEFT, 0) < world and time.monotonic() < deadline:
            time.sleep(0.01)
    except Exception:  # noqa: BLE001 - the store's host (rank 0 outside torchrun) has left: so may we
        pass


_LEFT = "rocm_sd/ranks_left"  # counted in the job's store by shutdown()
