"""rocm_sd.parallel on CPUs: how work is dealt, images independent of the process count, CFG-parallel
matching one process, and a failing or dying rank ending the job with a clear error (gloo backend).

The end-to-end tests launch `torchrun --standalone -m rocm_sd generate` on the tiny architecture, every
process with one CPU thread (a different thread count changes CPU reduction order, hence rounding): the same
arithmetic in every process, so data-parallel images must be identical bit for bit. Each job takes seconds of
imports per process on two cores: the default run launches one job of each kind (data, cfg, a failed setup, a
rank raising mid-job); the others (four processes, other fault places, a killed rank) are marked slow.
"""
from __future__ import annotations

import datetime
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rocm_sd.parallel.lookout import Lookout
from rocm_sd.parallel.mesh import Mesh, init
from rocm_sd.parallel.rounds import JobFailed, RankError, batches, run_rounds, schedule

PROMPTS = ["a red fox in the snow", "a lighthouse at dawn", "snowy mountains", "a bowl of fruit", "a city at night"]
REPO = Path(__file__).resolve().parents[1]


def _fail(how: str) -> None:
    """The injected failure: 'raise' an error, or 'die' without a word, as a crashed driver would."""
    if how == "raise":
        raise RuntimeError("out of memory on purpose")
    os.kill(os.getpid(), signal.SIGKILL)


# ---- how work is dealt ------------------------------------------------------------------------------

@pytest.mark.parametrize("n,size", [(5, 2), (32, 4), (1, 1), (7, 3), (0, 2)])
def test_batches_cover_every_item_once_in_order(n, size):
    got = batches(n, size)
    assert [i for r in got for i in r] == list(range(n))
    assert all(len(r) == size for r in got[:-1]) and all(1 <= len(r) <= size for r in got)


def test_batches_reject_nonpositive_size():
    with pytest.raises(ValueError, match="batch size"):
        batches(4, 0)


@pytest.mark.parametrize("n_items,dp", [(8, 4), (9, 4), (3, 4), (5, 1), (11, 3)])
def test_schedule_deals_each_item_once_in_order(n_items, dp):
    table = schedule(n_items, dp)
    assert all(len(row) == dp for row in table)
    flat = [i for row in table for i in row]
    assert [i for i in flat if i is not None] == list(range(n_items))
    assert all(i is not None for i in flat[:n_items])  # only the last round has idle ranks


def test_cfg_mode_needs_pairs(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="even number of processes"):
        init("cfg")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="--nproc-per-node 2"):
        init("cfg")
    with pytest.raises(ValueError, match="mode must be"):
        init("tensor")


# ---- the rounds protocol: results in order; a rank that raises or dies --------------------------------------------------

def _job(rank: int, world: int, store: str, how: str, results) -> None:
    """Seven items over `world` ranks; with how='raise' or 'die', rank 1 fails on item 3."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    mesh = Mesh(rank=rank, world=world, local_rank=rank, cfg=1, device=torch.device("cpu"))

    def work(item: int):
        if how != "ok" and rank == 1 and item == 3:
            _fail(how)
        return item * 10

    seen = []
    start = time.monotonic()
    try:
        run_rounds(mesh, 7, work, lambda items, res: seen.extend(zip(items, res)))
        results[rank] = ("finished", seen, time.monotonic() - start)
    except JobFailed as exc:
        results[rank] = ("JobFailed", str(exc), time.monotonic() - start)


def _launch(world: int, tmp_path, how: str, timeout_s: float = 120) -> dict:
    """Run _job on `world` spawned processes; a process may die without stopping the others (unlike mp.spawn)."""
    ctx = mp.get_context("spawn")
    results = ctx.Manager().dict()
    procs = [ctx.Process(target=_job, args=(rank, world, str(tmp_path / "store"), how, results)) for rank in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        p.kill()
    assert not hung, f"ranks {hung} hung"
    return dict(results)


def test_rounds_hand_rank0_every_result_in_order(tmp_path):
    results = _launch(3, tmp_path, "ok")
    assert results[0][0] == "finished" and results[0][1] == [(i, i * 10) for i in range(7)]
    assert results[1][:2] == ("finished", []) and results[2][:2] == ("finished", [])  # only rank 0 collects


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_ends_the_job_on_every_rank(tmp_path, how):
    results = _launch(2, tmp_path, how)
    assert results[0][0] == "JobFailed"
    if how == "raise":
        assert results[1][0] == "JobFailed"
        assert "rank 1 failed during round 1 (item 3): RuntimeError: out of memory on purpose" in results[0][1]
        assert "traceback" in results[0][1]
    else:
        assert 1 not in results and "lost contact" in results[0][1]
    assert results[0][2] < 60


# ---- the lookout: what ended a job that no collective could report ------------------------------------

def test_lookout_explains_a_broken_job_by_the_published_errors_else_by_the_lost_ranks():
    store = dist.HashStore()
    rank0, rank1, rank2 = (Lookout(rank, 3, store, report=print) for rank in range(3))
    starting = threading.Thread(target=rank1.start)  # off the main thread: pytest's SIGTERM stays as it is
    starting.start()
    starting.join()
    rank2._beat()  # once, then no more: killed
    assert rank0.explain("round 4") == ("rank 2 was lost during round 4: its process ended without reporting an "
                                        "error (killed, or a crash in native code; torchrun's log has its exit code)")
    rank1.stop()  # before the error below is published: its lookout would end this process
    rank2.publish(RankError(2, "round 4", "RuntimeError: out of memory on purpose", "Traceback ..."))
    assert rank0.explain("round 4") == ("rank 2 failed during round 4: RuntimeError: out of memory on purpose\n\n"
                                        "rank 2's traceback:\nTraceback ...")


# ---- end to end: torchrun -m rocm_sd generate -------------------------------------------------------

_FAULT = "TEST_PARALLEL_FAULT"  # "<rank> <warm-up|round> <raise|die>": read by this module's main, run by torchrun
_FAULT_AT = "fault injected at unix time "


def _generate(tmp_path, name: str, nproc: int, *args: str, fault: str = "",
              timeout_s: int = 60) -> tuple[subprocess.CompletedProcess, str]:
    """torchrun -m rocm_sd generate, or with a `fault` this module's main, which injects it (_inject_fault)."""
    out = tmp_path / name
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "tests.test_parallel" if fault else "rocm_sd", "generate", "--model", "tiny",
           "--prompts", str(prompts), "--out", str(out), "--steps", "3", "--batch", "2",
           "--timeout-s", str(timeout_s), *args]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", _FAULT: fault}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    return proc, str(out)


def _inject_fault(rank: str, phase: str, how: str) -> None:
    """Make `rank` fail in the second UNet step of its first pipeline call of `phase`: its CFG partner has
    been through one all-gather with it and waits in the next."""
    from rocm_sd.parallel import generate

    if os.environ["RANK"] != rank:
        return
    call_pipeline = generate.call_pipeline

    def failing_call(pipe, job, indices, steps=None):
        if (steps is not None) == (phase == "warm-up"):  # warm-up calls are the short ones
            unet_step, count = pipe.unet.forward, itertools.count(1)

            def failing_step(*args, **kwargs):
                if next(count) == 2:
                    print(f"{_FAULT_AT}{time.time()}", file=sys.stderr, flush=True)
                    _fail(how)
                return unet_step(*args, **kwargs)

            pipe.unet.forward = failing_step
        return call_pipeline(pipe, job, indices, steps)

    generate.call_pipeline = failing_call


def _images(folder: str) -> list[np.ndarray]:
    from PIL import Image

    with open(os.path.join(folder, "run.json")) as f:
        files = json.load(f)["images"]
    return [np.asarray(Image.open(os.path.join(folder, name))).astype(np.int16) for name in files]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    proc, out = _generate(tmp_path_factory.mktemp("gen"), "one", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _images(out)


def test_data_parallel_images_do_not_depend_on_the_process_count(tmp_path, one_process):
    proc, out = _generate(tmp_path, "two", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "run.json")) as f:
        run = json.load(f)
    assert run["gpus"] == 2 and run["mode"] == "data" and run["job"]["prompts"] == PROMPTS
    images = _images(out)
    assert len(images) == len(PROMPTS)
    assert all(img.std() > 5 for img in images)  # real pictures, not blanks
    for i, (a, b) in enumerate(zip(one_process, images)):
        assert np.array_equal(a, b), f"image {i} differs between 1 and 2 processes"
    assert not np.array_equal(images[0], images[1])  # per-prompt seeds and prompts: different pictures


def test_cfg_parallel_matches_one_process(tmp_path, one_process):
    proc, out = _generate(tmp_path, "cfg", 2, "--mode", "cfg")
    assert proc.returncode == 0, proc.stderr[-3000:]
    images = _images(out)
    for i, (a, b) in enumerate(zip(one_process, images)):
        # The half batch runs other GEMM shapes: rounding differs, the picture does not.
        assert np.abs(a - b).max() <= 2, f"image {i}: max difference {np.abs(a - b).max()}"


def test_generate_fails_cleanly_on_every_rank(tmp_path):
    # A model folder that passes the up-front --model check (it has a model_index.json) and fails to load.
    (tmp_path / "broken-model").mkdir()
    (tmp_path / "broken-model" / "model_index.json").write_text("{not json")
    proc, _ = _generate(tmp_path, "bad", 2, "--model", str(tmp_path / "broken-model"))
    assert proc.returncode != 0
    assert "rocm_sd generate failed on 2 ranks" in proc.stderr
    assert "rank 0 failed during pipeline setup" in proc.stderr and "model_index.json" in proc.stderr


@pytest.mark.slow  # four processes
def test_two_cfg_pairs_are_data_parallel_among_themselves(tmp_path, one_process):
    """4 processes in cfg mode: two pairs, each pair splitting guidance, the pairs splitting the prompts."""
    proc, out = _generate(tmp_path, "cfg4", 4, "--mode", "cfg")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "run.json")) as f:
        assert json.load(f)["gpus"] == 4
    images = _images(out)
    assert len(images) == len(PROMPTS)
    for i, (a, b) in enumerate(zip(one_process, images)):
        assert np.abs(a - b).max() <= 2, f"image {i}: max difference {np.abs(a - b).max()}"


# ---- a rank that fails in the middle of a job: every rank stops within seconds, rank 0 says why -------------

def _failed_job(tmp_path, nproc: int, mode: str, fault: str) -> tuple[str, float]:
    """Rank 0's report of the job that `fault` broke, and the seconds from the fault to the job's end. The
    process group's timeout is 120 s: a rank that waited for it would end the job far later than asserted."""
    proc, _ = _generate(tmp_path, "failed", nproc, "--mode", mode, fault=fault, timeout_s=120)
    ended = time.time()
    assert proc.returncode != 0
    assert _FAULT_AT in proc.stderr, proc.stderr[-3000:]
    failed = float(proc.stderr.split(_FAULT_AT)[1].split()[0])
    start = proc.stderr.find("rocm_sd generate failed on")  # only rank 0 says this; torchrun names ranks too
    assert start >= 0, proc.stderr[-3000:]
    return proc.stderr[start:], ended - failed


@pytest.mark.parametrize("nproc,fault,step", [
    pytest.param(2, "1 warm-up raise", "warm-up", marks=pytest.mark.slow),
    (2, "1 round raise", "round 0 (item 0)"),
    pytest.param(2, "0 round raise", "round 0 (item 0)", marks=pytest.mark.slow),
    # ranks 0 and 1 wait in the agreement, rank 2 in the pair's gather
    pytest.param(4, "3 round raise", "round 0 (item 1)", marks=pytest.mark.slow),
])
def test_a_cfg_rank_that_raises_ends_the_job_within_seconds(tmp_path, nproc, fault, step):
    report, seconds = _failed_job(tmp_path, nproc, "cfg", fault)
    rank = fault.split()[0]
    assert report.splitlines()[1] == f"rank {rank} failed during {step}: RuntimeError: out of memory on purpose"
    assert f"rank {rank}'s traceback" in report
    assert seconds < 30, f"the job ended {seconds:.0f} s after the failure"


@pytest.mark.slow  # a dying rank in the default run: test_a_failing_rank_ends_the_job_on_every_rank[die]
@pytest.mark.parametrize("mode", ["data", "cfg"])
def test_rank0_names_a_rank_that_was_killed(tmp_path, mode):
    report, seconds = _failed_job(tmp_path, 2, mode, "1 round die")
    assert report.splitlines()[1].startswith("rank 1 was lost during round 0 (item 0): its process ended")
    assert seconds < 30, f"the job ended {seconds:.0f} s after the kill"


if __name__ == "__main__":  # a process of _generate's torchrun job with a fault: rocm_sd's command, one rank failing
    if os.environ.get(_FAULT):
        _inject_fault(*os.environ[_FAULT].split())
    from rocm_sd.cli import main

    raise SystemExit(main())
