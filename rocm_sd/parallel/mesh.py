"""Which device and which share of the work this process has: one process per GPU, launched by torchrun.

Six ways to use N processes (shared/reference/integrations.md section 4):
  data  every rank runs its own pipeline on different prompts (throughput);
  cfg   ranks work in pairs: both run the same images, and each UNet step's batch, the unconditional
        and the conditional half of classifier-free guidance, is split over the pair (latency).
        With 4 or more ranks the pairs are data parallel among themselves;
  seq   every rank runs the same images, and each step of a diffusion transformer (SD3 / SD3.5, Flux) is
        split over all of them by image tokens (seq.py; latency);
  cfg-seq  both: the guidance halves over two groups of N/2 ranks, each half's tokens over its group;
  patch every rank runs the same images, and each UNet step (SD1.5 / SDXL) is split over all of them by bands
        of rows, DistriFusion's displaced patch parallelism (patch.py; latency, approximate after its warm-up);
  cfg-patch  both: the guidance halves over two groups of N/2 ranks, each half's rows over its group.
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
    cfg: int                      # ranks splitting an image's guidance batch: 2 in cfg mode, else 1
    device: torch.device
    cfg_group: object = None      # the process group of this rank's CFG pair (cfg mode only)
    seq: int = 1                  # ranks splitting an image's tokens: every rank in seq mode, else 1
    seq_group: object = None      # the process group that splits this rank's images by tokens (seq mode only)
    image_group: object = None    # the ranks that make this rank's images together: the pair, the seq or patch group
    patch: int = 1                # ranks splitting an image's rows: every rank in patch mode, else 1
    patch_group: object = None    # the process group that splits this rank's images by rows (patch mode only)
    lookout: Lookout | None = None  # this rank's watch on the others, where the caller started one
    timeout_s: float = DEFAULT_TIMEOUT_S  # every group's and collective's longest wait for another rank

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def per_image(self) -> int:
        """How many ranks make each image together."""
        return self.cfg * self.seq * self.patch

    @property
    def dp(self) -> int:
        """How many images (batches) are made at once: one per rank, per CFG pair, or one in seq and patch mode."""
        return self.world // self.per_image

    @property
    def dp_index(self) -> int:
        return self.rank // self.per_image

    @property
    def is_leader(self) -> bool:
        """The rank that hands in its group's images (every rank of a pair, seq or patch group makes the same ones)."""
        return self.rank % self.per_image == 0


# Why a mode that splits steps cannot run on the processes it was given, where each image's share is one process.
SPLITS = {
    "seq": "seq mode splits each step over several processes, one per GPU: launch with torchrun --nproc-per-node 2 "
           "(or more)",
    "cfg-seq": "cfg-seq mode splits each guidance half's tokens over two or more processes, one per GPU: launch with "
               "torchrun --nproc-per-node 4 (or another even number above 2)",
    "patch": "patch mode splits each UNet step over several processes, one per GPU: launch with torchrun "
             "--nproc-per-node 2 (or more)",
    "cfg-patch": "cfg-patch mode splits each guidance half's rows over two or more processes, one per GPU: launch "
                 "with torchrun --nproc-per-node 4 (or another even number above 2)",
}


def init(mode: str = "data", timeout_s: float = DEFAULT_TIMEOUT_S) -> Mesh:
    """Join the torchrun job (NCCL on GPUs, which is RCCL on ROCm; gloo on CPUs) and pick this rank's GPU."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cfg = 2 if mode in ("cfg", "cfg-seq", "cfg-patch") else 1
    split = world // cfg  # the ranks one image's (or one guidance half's) tokens or rows are split over
    seq = split if mode in ("seq", "cfg-seq") else 1
    patch = split if mode in ("patch", "cfg-patch") else 1
    if world % cfg:
        raise ValueError(f"{mode} mode splits each step over a pair of GPUs: it needs an even number of processes, "
                         f"got {world} (torchrun --nproc-per-node {4 if mode in ('cfg-seq', 'cfg-patch') else 2})")
    if mode == "cfg" and world == 1:
        raise ValueError("cfg mode needs 2 processes, one per GPU: launch with torchrun --nproc-per-node 2")
    if mode in SPLITS and split == 1:
        raise ValueError(SPLITS[mode])
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
    # cfg: pairs of neighbours. seq: every rank. cfg-seq: ranks [0, N/2) split the unconditional half's tokens,
    # [N/2, N) the conditional half's, and rank i pairs with rank i + N/2.
    # cfg-patch: likewise, by rows.
    pairs = ([[first, first + 1] for first in range(0, world, 2)] if mode == "cfg" else
             [[i, i + seq] for i in range(seq)] if mode == "cfg-seq" else
             [[i, i + patch] for i in range(patch)] if mode == "cfg-patch" else [])
    blocks = [list(range(first, first + seq)) for first in range(0, world, seq)] if seq > 1 else []

    def joined(groups: list[list[int]]):
        """This rank's group of `groups`; every rank creates every group, in the same order."""
        mine = None
        for ranks in groups:
            # A new group does not inherit the default group's timeout: without one, gloo waits 30 minutes.
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                mine = group
        return mine

    cfg_group, seq_group = joined(pairs), joined(blocks)
    # Patch mode's exchanges run on a group of their own, apart from the rounds' agreements on the default group
    # (on NCCL: a communicator of their own).
    patch_group = joined([list(range(first, first + patch)) for first in range(0, world, patch)]) if patch > 1 \
        else None
    # The ranks of one image (vae_split.py splits its decode over them): the pair in cfg mode, the group in seq
    # or patch mode, and in cfg-seq and cfg-patch mode both halves' groups, a group of its own.
    image_group = (cfg_group if mode == "cfg" else seq_group if mode == "seq" else patch_group if mode == "patch" else
                   joined([list(range(first, first + cfg * seq * patch))
                           for first in range(0, world, cfg * seq * patch)])
                   if mode in ("cfg-seq", "cfg-patch") else None)
    return Mesh(rank=rank, world=world, local_rank=local_rank, cfg=cfg, device=device, cfg_group=cfg_group,
                seq=seq, seq_group=seq_group, image_group=image_group, patch=patch, patch_group=patch_group,
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
