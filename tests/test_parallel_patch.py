"""Patch parallelism (parallel/patch.py) on CPUs with gloo: the tiny UNet's image split over two processes by bands
of rows equals one process's while every step is a warm-up step, stays close to it (a measured PSNR bound, and not
equal: the stale exchanges ran) once the steps are displaced, with and without rocm_sd.optimize; bad inputs are
refused by name; and in patch mode a rank that raises, is killed or hangs (in a step, in a halo exchange) ends the
job on every rank within seconds (a hang: at --timeout-s), named by rank 0 and by torchrun.

The arithmetic runs in one two-process job (module fixture), so the imports are paid once; the end-to-end tests
reuse test_parallel's torchrun harness and fault injection. The default run has one generate job (the warm-up-only
images against one process's) and one failure job (a rank raising in a step); four processes, kills and hangs
are marked slow.
"""
from __future__ import annotations

import datetime
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rocm_sd.parallel.patch import rows_problem

from tests.test_parallel import (PROMPTS, _assert_hung_rank_named, _failed_job_and_root_cause, _generate, _images,
                                 _two_process_results)

STEPS = 10
# The SD1.5-like tiny UNet with and without optimize, and the SDXL-like one (linear projections, added time ids).
CASES = [("tiny", False), ("tiny", True), ("tiny-xl", True)]
# PSNR (dB) of the displaced image (one warm-up step of 10) against one process's, at 64x64 on CPU, measured
# 2026-12-02 (with and without optimize alike): tiny 45.70 on 2 processes, 41.17 on 4; tiny-xl 43.75 on 2 (39.26
# on 4; with 2 warm-up steps tiny is 49.98 on 2, 46.10 on 4: docs/multi-gpu.md). The
# bounds leave 5 dB of margin: a halo, GroupNorm or attention exchange that went wrong (a band's rows swapped, a
# stale value used in warm-up, the fresh part left out) costs far more.
PSNR_BOUND = {("tiny", 2): 40.0, ("tiny", 4): 36.0, ("tiny-xl", 2): 38.0}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255 ** 2 / mse)


def _patch_job(rank: int, world: int, store: str, results) -> None:
    """Per case (architecture, optimize): one process's image, then split over the group with every step a warm-up
    step, then displaced after one; whether disable_patch_parallel restored the pipeline; the exchange counts; then
    a latent height the bands cannot take."""
    import rocm_sd
    from rocm_sd import models
    from rocm_sd.parallel.generate import Job, call_pipeline
    from rocm_sd.parallel.patch import disable_patch_parallel, enable_patch_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    out = {}
    job = Job(prompts=["a red fox in the snow"], steps=STEPS)
    for arch, optimized in CASES:
        pipe = models.load_pipeline(arch, torch.device("cpu"), torch.float32)
        if optimized:
            rocm_sd.optimize(pipe, cuda_graph=False)
        one = call_pipeline(pipe, job, range(1))
        enable_patch_parallel(pipe, dist.group.WORLD, warmup=STEPS)
        warm = call_pipeline(pipe, job, range(1))
        warm_stats = dict(getattr(pipe.unet, "_rocm_sd_patch_parallel")[0].stats)
        disable_patch_parallel(pipe)
        enable_patch_parallel(pipe, dist.group.WORLD)
        displaced = call_pipeline(pipe, job, range(1))
        again = call_pipeline(pipe, job, range(1))  # a second image: warm-up again, not the first image's stale rows
        stats = dict(getattr(pipe.unet, "_rocm_sd_patch_parallel")[0].stats)
        disable_patch_parallel(pipe)
        reverted = call_pipeline(pipe, job, range(1))
        out[arch, optimized] = dict(one=one, warm=warm, displaced=displaced, again=again, reverted=reverted,
                              warm_stats=warm_stats, stats=stats)
    pipe = models.load_pipeline("tiny", torch.device("cpu"), torch.float32)
    out["rows"] = _refusal(enable_patch_parallel(pipe, dist.group.WORLD).unet)
    results[rank] = out
    dist.destroy_process_group()


def _refusal(unet) -> str:
    """What a step of 18 latent rows, which 2 bands that the tiny UNet halves cannot take, raises. (Its pipeline
    takes image heights in multiples of 8: 4 rows of the tiny VAE's latent, which 2 bands do take.)"""
    try:
        with torch.no_grad():
            unet(torch.zeros(1, 4, 18, 32), torch.tensor(10.0), encoder_hidden_states=torch.zeros(1, 7, 32))
    except ValueError as error:
        return str(error)
    return "ran the step"


@pytest.fixture(scope="module")
def patch_results(tmp_path_factory):
    return _two_process_results(tmp_path_factory, "patch", _patch_job, timeout_s=300)


@pytest.mark.parametrize("arch,optimized", CASES)
def test_warm_up_steps_make_one_process_image(patch_results, arch, optimized):
    for rank in (0, 1):
        run = patch_results[rank][arch, optimized]
        assert run["one"].std() > 5  # a real picture, not a blank
        # fp32, exact up to reduction order: optimize's own kernels (its fused paths, which patch mode turns back
        # to diffusers' forward) round differently
        assert np.abs(run["warm"].astype(np.int16) - run["one"]).max() <= 2
        assert "stale steps" not in run["warm_stats"] and run["warm_stats"]["fresh steps"] == STEPS


@pytest.mark.parametrize("arch,optimized", CASES)
def test_displaced_steps_stay_close_to_one_process_image(patch_results, arch, optimized):
    for rank in (0, 1):
        run = patch_results[rank][arch, optimized]
        quality = psnr(run["displaced"], run["one"])
        assert PSNR_BOUND[arch, 2] < quality < float("inf"), f"rank {rank}: PSNR {quality:.2f} dB"
        assert np.array_equal(run["again"], run["displaced"]), "the second image did not start with a warm-up"
        stats = run["stats"]
        assert stats["fresh steps"] == 2 and stats["stale steps"] == 2 * (STEPS - 1), stats
        # every kind of exchange ran stale in every step after the warm-up: the first of them takes the warm-up
        # step's values, each later one waits for the previous step's asynchronous all-gather (counted here)
        for what in ("halo exchange", "GroupNorm statistics", "keys and values"):
            fresh, stale = stats[f"{what} (fresh)"], stats[f"{what} (stale)"]
            assert fresh > 0 and stale == fresh * (STEPS - 2), (what, stats)
        assert np.array_equal(run["reverted"], run["one"]), "disable_patch_parallel left the pipeline changed"
    assert np.array_equal(patch_results[0][arch, optimized]["displaced"],
                          patch_results[1][arch, optimized]["displaced"])


def test_a_latent_the_bands_cannot_take_is_refused_by_name(patch_results):
    for rank in (0, 1):
        assert patch_results[rank]["rows"] == rows_problem(18, 1, 2) != ""
    assert rows_problem(18, 1, 2) == ("patch parallelism cuts the latent's 18 rows into 2 bands, which the UNet halves "
                                      "1 time(s): the latent height must divide by 2 x 2**1 = 4")
    assert rows_problem(128, 2, 4) == ""


def test_patch_parallelism_refuses_what_it_cannot_split():
    from rocm_sd.parallel.patch import enable_patch_parallel

    class FluxTransformer2DModel:
        pass

    with pytest.raises(ValueError, match="patch parallelism splits the UNets .* this pipeline's model is "
                                         "FluxTransformer2DModel: use --mode seq"):
        enable_patch_parallel(SimpleNamespace(unet=None, transformer=FluxTransformer2DModel()), group=None)
    unet = _tiny_unet()
    with pytest.raises(ValueError, match="at least one synchronous warm-up step per image"):
        enable_patch_parallel(unet, group=None, warmup=0)


def test_patch_parallelism_refuses_graph_capture():
    import rocm_sd
    from rocm_sd.parallel.patch import enable_patch_parallel

    unet = rocm_sd.optimize(_tiny_unet())  # cuda_graph on by default: its GraphedCall stands in forward
    with pytest.raises(ValueError, match=r"graph capture \(optimize\(cuda_graph=...\)\) would replay one step's "
                                         "exchanges; optimize with cuda_graph=False"):
        enable_patch_parallel(unet, group=None)
    assert "_rocm_sd_patch_parallel" not in vars(unet)


def _tiny_unet():
    from diffusers import UNet2DConditionModel

    from rocm_sd import models

    torch.manual_seed(0)
    return UNet2DConditionModel(**models.ARCHITECTURES["tiny"].unet).eval()


def test_generate_refuses_an_image_height_the_bands_cannot_take(monkeypatch, tmp_path, capsys):
    from rocm_sd import cli

    monkeypatch.setenv("WORLD_SIZE", "4")  # refused before the job is joined
    status = cli.main(["generate", "--prompt", "a fox", "--out", str(tmp_path / "out"), "--mode", "patch",
                       "--height", "72"])  # the default model on a CPU: tiny
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().splitlines()[-1].endswith(
        "argument --height: patch parallelism cuts the latent's 36 rows into 4 bands, which the UNet halves 1 "
        "time(s): the latent height must divide by 4 x 2**1 = 8 (images 16 pixels high, or a multiple)"), err
    assert "Traceback" not in err


# ---- end to end: torchrun -m rocm_sd generate --mode patch ----------------------------------------------------

def _one_process_images(steps: int = 3) -> list[np.ndarray]:
    """test_parallel's job (5 prompts, batches of 2, 3 steps) in this process, optimized as generate does."""
    from rocm_sd import models, optimize
    from rocm_sd.parallel.generate import Job, call_pipeline

    pipe = optimize(models.load_pipeline("tiny", torch.device("cpu"), torch.float32), cuda_graph=False)
    job = Job(prompts=PROMPTS, batch=2, steps=steps)
    return [image.astype(np.int16) for batch in (range(0, 2), range(2, 4), range(4, 5))
            for image in call_pipeline(pipe, job, batch)]


def test_patch_mode_with_every_step_warm_makes_one_process_images(tmp_path):
    torch.set_num_threads(1)  # the ranks' arithmetic
    proc, out = _generate(tmp_path, "patch", 2, "--mode", "patch", "--patch-warmup", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(f"{out}/run.json") as f:
        run = json.load(f)
    assert (run["mode"], run["gpus"], run["patch_warmup"]) == ("patch", 2, 3)
    images, one = _images(out), _one_process_images()
    assert len(images) == len(one) == len(PROMPTS)
    assert all(image.std() > 5 for image in images)
    for i, (a, b) in enumerate(zip(one, images)):
        assert abs(a - b).max() <= 2, f"image {i}: max difference {abs(a - b).max()}"


@pytest.mark.slow  # four processes
def test_four_process_patch_mode_stays_close_to_one_process(tmp_path):
    torch.set_num_threads(1)
    proc, out = _generate(tmp_path, "patch4", 4, "--mode", "patch", "--steps", str(STEPS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    images, one = _images(out), _one_process_images(STEPS)
    for i, (a, b) in enumerate(zip(one, images)):
        quality = psnr(a, b)
        assert PSNR_BOUND["tiny", 4] < quality < float("inf"), f"image {i}: PSNR {quality:.2f} dB"


@pytest.mark.slow  # four processes
def test_cfg_patch_mode_with_every_step_warm_makes_one_process_images(tmp_path):
    """The guidance halves over two pairs, each half's rows over its pair (ranks 0, 1 the unconditional half's)."""
    torch.set_num_threads(1)
    proc, out = _generate(tmp_path, "cfg-patch", 4, "--mode", "cfg-patch", "--patch-warmup", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    images, one = _images(out), _one_process_images()
    assert len(images) == len(one) == len(PROMPTS)
    for i, (a, b) in enumerate(zip(one, images)):
        assert abs(a - b).max() <= 2, f"image {i}: max difference {abs(a - b).max()}"


def test_cfg_patch_mode_needs_two_ranks_per_guidance_half(monkeypatch):
    from rocm_sd.parallel.mesh import init

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="cfg-patch mode splits each guidance half's rows over two or more processes"):
        init("cfg-patch")


# ---- a rank that fails: every rank ends within seconds (a hang: at --timeout-s), the failed rank named ---------
#
# test_parallel's faults (_inject_fault) in the second UNet step of the first round ('round', after the one warm-up
# step: the group waits in the step's output all-gather) or between that step's first two exchanges ('halo').
# _failed_job_and_root_cause also checks that every rank's process has ended.

ROUND = "round 0 (item 0)"  # patch mode makes one batch at a time: every rank is in round 0's item


def _case(fault: str, *rest, slow: bool = True):
    return pytest.param(fault, *rest, id=fault.replace(" ", "-"), marks=[pytest.mark.slow] if slow else [])


def _patch_failed_job(tmp_path, nproc: int, fault: str, mode: str = "patch", **kwargs):
    return _failed_job_and_root_cause(tmp_path, nproc, mode, fault, **kwargs)


@pytest.mark.parametrize("fault,nproc,mode", [
    _case("1 round raise", 2, "patch", slow=False),
    _case("0 halo raise", 2, "patch"),
    # rank 3 (the conditional half's second band): its band partner 2 waits in an exchange, its CFG partner 1 in the
    # pair's all-gather, rank 0 in its own exchanges with 1
    _case("3 halo raise", 4, "cfg-patch"),
])
def test_a_patch_rank_that_raises_ends_the_job_within_seconds(tmp_path, fault, nproc, mode):
    report, seconds, root_rank = _patch_failed_job(tmp_path, nproc, fault, mode)
    rank = int(fault.split()[0])
    assert report.splitlines()[1] == f"rank {rank} failed during {ROUND}: RuntimeError: out of memory on purpose"
    assert f"rank {rank}'s traceback" in report
    assert root_rank == rank, f"torchrun names rank {root_rank} as the root cause"
    assert seconds < 30, f"the job ended {seconds:.0f} s after the failure"


@pytest.mark.slow
@pytest.mark.parametrize("nproc,fault", [(2, "1 round die"), (4, "2 halo die")])
def test_a_killed_patch_rank_is_named_and_the_job_ends_within_seconds(tmp_path, nproc, fault):
    report, seconds, _ = _patch_failed_job(tmp_path, nproc, fault)
    rank = int(fault.split()[0])
    assert report.splitlines()[1].startswith(f"rank {rank} was lost during {ROUND}: its process ended"), report
    lost = [line for line in report.splitlines() if re.match(r"rank \d+ was lost", line)]
    assert lost == report.splitlines()[1:2], f"only rank {rank} was lost:\n{report}"
    assert seconds < 30, f"the job ended {seconds:.0f} s after the kill"


@pytest.mark.slow  # each waits for --timeout-s
@pytest.mark.parametrize("fault,step,waiting", [
    _case("1 round hang", ROUND, {0}),   # rank 0 waits in the step's output all-gather
    _case("1 halo hang", ROUND, {0}),    # likewise, rank 1 stuck between two exchanges
    _case("0 setup hang", "pipeline setup", {1}),  # rank 1 waits in the agreement
])
def test_a_hung_patch_rank_ends_the_job_at_the_timeout_and_is_named(tmp_path, fault, step, waiting):
    timeout_s = 20
    report, seconds, root_rank = _patch_failed_job(tmp_path, 2, fault, timeout_s=timeout_s, wall_s=150)
    _assert_hung_rank_named(report, seconds, root_rank, fault, step, waiting, timeout_s)
