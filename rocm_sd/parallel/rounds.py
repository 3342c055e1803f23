"""Work split into rounds, and the one protocol every rank follows for each step of a job.

The prompts are cut into batches of consecutive prompts first, then the batches are dealt to the
ranks: what each pipeline call sees does not depend on the number of GPUs, so neither do the images.
In round k, data-parallel index j makes batch k * dp + j.

After each step (building the pipeline, each round) every rank says whether it worked, through one
small all-gather; if any rank failed, every rank raises JobFailed naming the rank and its error, so the
job ends at once instead of leaving the others waiting. A rank that dies without a word (killed, a
crash in a driver) breaks the collective: that is reported as JobFailed as well, and the process
group's timeout bounds the wait where the backend cannot tell (a hung GPU). Where a rank cannot reach
the agreement (its CFG partner failed and it waits in the pair's all-gather) or cannot tell which rank
died, the mesh's lookout (lookout.py) takes over.
"""
from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass
from typing import Callable

import torch.distributed as dist

from .mesh import Mesh


class JobFailed(RuntimeError):
    """Raised on every rank when one rank failed a step of the job."""


class LostContact(JobFailed):
    """A collective with other ranks broke (one died, or its connection did): no error of this rank's own."""


@dataclass(frozen=True)
class RankError:
    rank: int
    step: str
    error: str
    trace: str
    stalled: bool = False  # published by another rank: this one stopped answering (lookout.py)


def batches(n: int, size: int) -> list[range]:
    """Consecutive batches of `size` items (the last may be shorter)."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def schedule(n_items: int, dp: int) -> list[list[int | None]]:
    """rounds x dp table of item indices; None where a rank idles in the last round."""
    n_rounds = -(-n_items // dp)
    return [[k * dp + j if k * dp + j < n_items else None for j in range(dp)] for k in range(n_rounds)]


def describe(failures: list[RankError], trace: bool) -> str:
    """One line per failed rank, then (with `trace`) the first one's traceback."""
    lines = "\n".join(f"rank {f.rank} failed during {f.step}: {f.error}" for f in failures)
    return lines + (f"\n\nrank {failures[0].rank}'s traceback:\n{failures[0].trace}" if trace and failures[0].trace
                    else "")


@contextlib.contextmanager
def waiting(lookout):
    """Marks this rank as waiting in a collective while the block runs, for the lookout's account of who
    stopped answering. A collective that fails leaves the mark: this rank waited, it did not stall."""
    if lookout is None:
        yield
        return
    lookout.waiting = True
    yield
    lookout.waiting = False


def _lost_contact(mesh: Mesh, step: str, error: Exception) -> LostContact:
    """What broke the collective: the lookout names the failed, lost or stalled ranks where it can."""
    known = mesh.lookout.explain(step, name_stalled=True) if mesh.lookout is not None else ""
    return LostContact(known or f"lost contact with another rank during {step} ({type(error).__name__}: {error}); "
                       "the rank that died is named in torchrun's log")


def checked(mesh: Mesh, step: str, fn: Callable):
    """fn() on this rank, then agree with every rank that `step` worked; JobFailed on all ranks if not."""
    if mesh.lookout is not None:
        mesh.lookout.step = step
    try:
        result, error = fn(), None
    except LostContact as exc:  # a collective inside fn (the CFG pair's all-gather) broke
        raise _lost_contact(mesh, step, exc.__cause__ or exc) from exc
    except Exception as exc:  # noqa: BLE001 -- any failure must reach the other ranks, not strand them
        if not mesh.distributed:
            raise
        result, error = None, RankError(mesh.rank, step, f"{type(exc).__name__}: {exc}", traceback.format_exc())
        if mesh.lookout is not None:  # for a CFG partner that waits in the pair's all-gather, not the agreement
            mesh.lookout.publish(error)
    if mesh.distributed:
        failed = [s for s in all_gather(mesh, step, error) if s is not None]
        if failed:
            raise JobFailed(describe(failed, trace=mesh.rank == 0))
    return result


def all_gather(mesh: Mesh, step: str, obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if not mesh.distributed:
        return [obj]
    out = [None] * mesh.world
    try:
        with waiting(mesh.lookout):
            dist.all_gather_object(out, obj)
    except Exception as exc:  # noqa: BLE001 -- the backends' error types differ (gloo, NCCL, RCCL)
        raise _lost_contact(mesh, step, exc) from exc
    return out


def gather_to_root(mesh: Mesh, step: str, obj) -> list | None:
    """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
    if not mesh.distributed:
        return [obj]
    out = [None] * mesh.world if mesh.rank == 0 else None
    try:
        with waiting(mesh.lookout):
            dist.gather_object(obj, out, dst=0)
    except Exception as exc:  # noqa: BLE001
        raise _lost_contact(mesh, step, exc) from exc
    return out


def run_rounds(mesh: Mesh, n_items: int, work: Callable[[int], object],
               on_round: Callable[[list[int], list], None] | None = None) -> None:
    """work(item) for this rank's items, round by round; rank 0 gets on_round(items, results) in item order."""
    for k, row in enumerate(schedule(n_items, mesh.dp)):
        item = row[mesh.dp_index]
        result = checked(mesh, f"round {k} (item {item})", lambda: None if item is None else work(item))
        gathered = gather_to_root(mesh, f"round {k}", result if mesh.is_leader else None)
        if gathered is not None and on_round is not None:
            done = [i for i in row if i is not None]
            on_round(done, [gathered[j * mesh.per_image] for j in range(len(done))])
