"""The VAE decode split over an image's ranks (parallel/vae_split.py) on CPUs with gloo: how a batch is dealt in
bands, the split image equal to one process's decode of the same bands and no further from the whole decode than
diffusers' tiled decode, on 2 and 3 ranks (uneven dealings, an empty slot), a latent too small to split left whole;
`generate --vae-split` end to end; a rank failing in the split decode named, every rank ending within seconds.

The split tests spawn one three-process job (module fixture) that checks every case, on the three ranks and on
a group of two, so the imports are paid once; its ranks decode with a stand-in for AutoencoderKL in torch alone
(diffusers' import would cost each rank seconds), and the tiny AutoencoderKL's bands are checked in this process. The end-to-end jobs reuse test_parallel's torchrun harness and fault
injection, marked slow (a torchrun job each), as is the bench's split-decode job.
"""
from __future__ import annotations

import datetime
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rocm_sd.modules.vae_tiles import MIN_OVERLAP, Tiles, axis_bands
from rocm_sd.parallel.vae_split import plan

from tests.test_parallel import PROMPTS, _failed_job_and_root_cause, _generate, _images, _launch


# ---- the dealing -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length,count", [(32, 2), (23, 3), (128, 2), (128, 4), (61, 3), (17, 2), (40, 1)])
def test_bands_cover_an_axis_with_the_overlap_and_the_least_rows(length, count):
    side, starts = axis_bands(length, count, MIN_OVERLAP)
    assert len(starts) == count and starts[0] == 0 and starts[-1] + side == length
    assert all(a + side - b >= min(MIN_OVERLAP, side) for a, b in zip(starts, starts[1:]))  # the overlap, or more
    if count > 1 and side < length:  # one row fewer and the overlaps could not all be MIN_OVERLAP
        assert (side - 1 - MIN_OVERLAP) * count < length - MIN_OVERLAP


@pytest.mark.parametrize("batch,height,ranks,bands,slots", [
    (1, 128, 2, 2, 1),   # one image over a pair: two bands of 72 rows
    (1, 128, 4, 4, 1),   # four bands of 44 rows
    (2, 128, 2, 1, 1),   # two images over a pair: whole images, as the CFG pair's batch split, without seams
    (3, 128, 2, 2, 3),   # 6 bands of 72 rows, 3 per rank (216 rows) rather than 2 whole images on one (256)
    (2, 40, 3, 1, 1),    # two whole images over three ranks: rank 2 decodes none
    (5, 128, 4, 2, 3),   # 10 bands of 72 rows over 4 ranks, 3, 3, 2, 2 (15 of 54 rows tie: 216 rows, more seams)
])
def test_a_batch_is_dealt_so_that_the_busiest_rank_decodes_the_fewest_rows(batch, height, ranks, bands, slots):
    pieces = plan(batch, height, 96, ranks)
    assert len(pieces.tiles.rows) == bands and pieces.slots == slots
    assert sorted(p for r in range(ranks) for p in pieces.of(r)) == list(range(batch * bands))
    assert pieces.busiest_rows < batch * height
    for other in range(1, ranks + 1):  # no band count does better
        dealt = math.ceil(batch * other / ranks) * Tiles.bands(height, 96, other).side_y
        assert dealt >= pieces.busiest_rows


@pytest.mark.parametrize("batch,height", [(1, 16), (1, 17), (1, 12)])
def test_a_latent_no_taller_than_the_overlap_is_not_split(batch, height):
    assert plan(batch, height, 64, 2) is None and plan(batch, height, 64, 3) is None


# ---- the split decode on 2 and 3 ranks ---------------------------------------------------------------------------

# (batch, latent height, width, ranks[, latent channels]): one image in 2 and 3 bands, uneven band starts (23 rows),
# whole images with an empty slot (2 over 3), three images over two (2 and 1), 3 bands of a 16-channel latent without
# post_quant_conv (SD3 / Flux), and a latent too small to split (16 rows: the overlap).
CASES = [(1, 40, 24, 2), (1, 40, 24, 3), (1, 23, 20, 3), (2, 40, 24, 3), (3, 40, 24, 2), (1, 36, 20, 3, 16),
         (1, 16, 24, 2)]


class _StandInVae(torch.nn.Module):
    """What the split reads of an AutoencoderKL, in torch alone (importing diffusers costs each spawned rank seconds):
    post_quant_conv (or none), a decoder with a receptive field and per-call GroupNorm statistics, its config."""

    def __init__(self, latent_channels: int = 4):
        super().__init__()
        from types import SimpleNamespace

        torch.manual_seed(0)
        nn = torch.nn
        self.config = SimpleNamespace(latent_channels=latent_channels, out_channels=3, block_out_channels=(8, 16))
        self.post_quant_conv = nn.Conv2d(latent_channels, latent_channels, 1) if latent_channels == 4 else None
        self.decoder = nn.Sequential(nn.Conv2d(latent_channels, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU(),
                                     nn.Upsample(scale_factor=2), nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8),
                                     nn.SiLU(), nn.Conv2d(8, 3, 3, padding=1))

    def decode(self, z, return_dict=False):
        return (self.decoder(z if self.post_quant_conv is None else self.post_quant_conv(z)),)


def _same_bands(vae, z: torch.Tensor, pieces) -> torch.Tensor:
    """One process's decode of the split's bands, each blended as the split blends them."""
    from rocm_sd.modules.vae_tiles import decode_tile

    return torch.stack([pieces.tiles.blend(decode_tile(vae, latent[:, :, rows, cols])[0]
                                           for rows, cols in pieces.tiles.crops()) for latent in z.split(1)])


def _latent(case) -> torch.Tensor:
    batch, height, width, _, *channels = case
    return torch.randn(batch, *channels or [4], height, width, generator=torch.Generator().manual_seed(1))


def _split_job(rank: int, world: int, store: str, results) -> None:
    """Every case on this rank: what the split made of it, against this process's decodes of the same latent."""
    from rocm_sd.parallel.vae_split import VaeSplit

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    pair = dist.new_group([0, 1])  # every rank creates it
    groups = {3: dist.group.WORLD, 2: pair}
    out = {}
    with torch.no_grad():
        for case in CASES:
            batch, height, width, ranks, *channels = case
            if rank >= ranks:
                continue
            vae, z = _StandInVae(*channels), _latent(case)
            split = VaeSplit(vae, vae.decode, groups[ranks], mode="on")
            image = split(z, return_dict=False)[0]
            pieces = plan(batch, height, width, ranks)
            whole = torch.cat([vae.decode(latent)[0] for latent in z.split(1)])  # each image alone
            everyone = [torch.empty_like(image) for _ in range(ranks)]
            dist.all_gather(everyone, image, group=groups[ranks])
            out[case] = dict(stats=dict(split.stats), shape=tuple(image.shape), whole_shape=tuple(whole.shape),
                             same_bands=None if pieces is None else torch.equal(image, _same_bands(vae, z, pieces)),
                             equal_whole=torch.equal(image, whole),
                             ranks_agree=all(torch.equal(e, image) for e in everyone))
    results[rank] = out
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def split_results(tmp_path_factory):
    results = _launch(3, tmp_path_factory.mktemp("vae-split"), timeout_s=240, target=_split_job)
    assert sorted(results) == [0, 1, 2], "a rank failed (its traceback is above)"
    return results


@pytest.mark.parametrize("case", CASES[:-1], ids=lambda case: "x".join(map(str, case)))
def test_the_split_decode_is_one_process_decode_of_the_same_bands(split_results, case):
    batch, height, width, ranks, *_ = case
    bands = len(plan(batch, height, width, ranks).tiles.rows)
    for rank in range(ranks):
        got = split_results[rank][case]
        assert got["stats"] == {f"split: {bands} band(s) per image": 1}, got["stats"]
        assert got["shape"] == got["whole_shape"]
        assert got["same_bands"], f"rank {rank}: the gathered bands differ from one process's"
        assert got["ranks_agree"]
        assert got["equal_whole"] == (bands == 1)  # whole images dealt are decoded as they are; bands are not


def test_a_latent_too_small_to_split_is_decoded_whole_on_every_rank(split_results):
    case = CASES[-1]
    for rank in range(case[3]):
        got = split_results[rank][case]
        assert got["stats"] == {"whole (too small to split)": 1} and got["equal_whole"] and got["ranks_agree"]


def _vae(latent_channels: int = 4):
    """The tiny AutoencoderKL of SD (4 latent channels) or of SD3 / Flux (16), as tests/test_vae_tiles.py's."""
    from diffusers import AutoencoderKL

    from rocm_sd import models
    from rocm_sd.dit_models import FLUX_VAE, TINY_VAE16

    torch.manual_seed(0)
    config = {**TINY_VAE16, **FLUX_VAE} if latent_channels == 16 else models.TINY_VAE
    return AutoencoderKL(**{**config, "block_out_channels": (8, 16), "norm_num_groups": 4}).eval()


def _psnr(image, reference) -> float:
    mse = ((image.float() - reference.float()) / 2).pow(2).mean().item()  # images in [-1, 1]
    return 10 * math.log10(1 / mse) if mse else float("inf")


@pytest.mark.parametrize("case", [c for c in CASES if plan(*c[:4]) and len(plan(*c[:4]).tiles.rows) > 1],
                         ids=lambda case: "x".join(map(str, case)))
def test_the_split_bands_of_an_autoencoder_are_no_further_from_its_whole_decode_than_diffusers_tiles(case):
    """What every rank of the split blends (the job above: the same bands' one-process decode), on the tiny VAE,
    against its whole decode; diffusers' tiled decode of the same latent in tiles of 8 latents (25% overlap) is
    the bar, as in tests/test_vae_tiles.py."""
    vae, z = _vae(*case[4:]), _latent(case)
    with torch.no_grad():
        whole = torch.cat([vae.decode(latent).sample for latent in z.split(1)])
        bands = _same_bands(vae, z, plan(*case[:4]))
        vae.tile_latent_min_size, vae.tile_sample_min_size = 8, 16
        theirs = vae.tiled_decode(z).sample
    assert bands.shape == whole.shape and not torch.equal(bands, whole)
    assert _psnr(bands, whole) >= _psnr(theirs, whole), (_psnr(bands, whole), _psnr(theirs, whole))


def test_auto_splits_only_from_its_threshold_and_off_changes_nothing(monkeypatch):
    from rocm_sd.parallel import vae_split

    monkeypatch.setattr(vae_split.dist, "get_world_size", lambda group: 2)
    monkeypatch.setattr(vae_split.dist, "get_rank", lambda group: 0)
    vae = _vae()
    pipe = type("Pipe", (), {"vae": vae})()
    assert vae_split.enable_vae_split(pipe, None, mode="off") is pipe and "decode" not in vae.__dict__
    vae_split.enable_vae_split(pipe, None, mode="auto", min_area=40 * 24)
    split = vae.decode
    with torch.no_grad():
        below = vae.decode(torch.randn(1, 4, 40, 23)).sample
    assert dict(split.stats) == {"whole (below the auto threshold)": 1} and below.shape == (1, 3, 80, 46)
    monkeypatch.setattr(split, "_decode", lambda z, pieces: torch.zeros(1))  # no partner to gather with here
    assert vae.decode(torch.randn(1, 4, 40, 24), return_dict=False) == (torch.zeros(1),)
    assert split.stats["split: 2 band(s) per image"] == 1
    with pytest.raises(ValueError, match="vae split mode must be one of"):
        vae_split.enable_vae_split(pipe, None, mode="yes")


def test_on_refuses_a_vae_it_cannot_split():
    from rocm_sd.parallel.vae_split import enable_vae_split

    pipe = type("Pipe", (), {"vae": torch.nn.Identity()})()
    assert enable_vae_split(pipe, None, mode="auto") is pipe
    with pytest.raises(ValueError, match="decodes an AutoencoderKL in bands; this pipeline's VAE is Identity"):
        enable_vae_split(pipe, None, mode="on")


# ---- end to end: torchrun -m rocm_sd generate --vae-split ------------------------------------------------------

def _one_process(model: str, size: int | None = None) -> list[np.ndarray]:
    """The job's images made in this process (5 prompts, batches of 2, 3 steps: test_parallel's _generate job)."""
    from rocm_sd import models, optimize
    from rocm_sd.parallel.generate import Job, call_pipeline

    pipe = optimize(models.load_pipeline(model, torch.device("cpu"), torch.float32))
    job = Job(prompts=PROMPTS, batch=2, steps=3, height=size, width=size)
    return [image.astype("int16") for batch in (range(0, 2), range(2, 4), range(4, 5))
            for image in call_pipeline(pipe, job, batch)]


def _psnr_u8(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


@pytest.mark.slow  # a torchrun job each
@pytest.mark.parametrize("mode,model,nproc", [("cfg", "tiny", 2), ("seq", "tiny-flux", 2), ("cfg-seq", "tiny-sd3", 4)])
def test_generate_splits_the_decode_and_the_images_match_one_process(tmp_path, mode, model, nproc):
    """64x64 images: 32x32 latents, in batches of 2, 2 and 1 over the image's `nproc` ranks. A batch dealt in whole
    images equals one process's images up to the step's rounding; one dealt in bands is close (a tiled decode's seam).
    """
    proc, out = _generate(tmp_path, "split", nproc, "--mode", mode, "--vae-split", "on", "--height", "64",
                          "--width", "64", model=model)
    assert proc.returncode == 0, proc.stderr[-3000:]
    images, one = _images(out), _one_process(model, 64)
    assert len(images) == len(one) == len(PROMPTS) and all(image.std() > 5 for image in images)
    banded = 0
    for i, (a, b) in enumerate(zip(one, images)):
        if len(plan(1 if i == 4 else 2, 32, 32, nproc).tiles.rows) == 1:
            assert np.abs(a - b).max() <= 2, f"image {i}: max difference {np.abs(a - b).max()}"
        else:
            banded += 1
            assert 30 < _psnr_u8(a, b) < math.inf, f"image {i}: {_psnr_u8(a, b)} dB"
    assert banded >= 1


# slow: a torchrun job of 13-15 s; the default run has the same lookout ending a cfg pair's waiting rank
# (test_parallel's test_a_cfg_rank_that_raises_ends_the_job_within_seconds)
@pytest.mark.parametrize("mode,nproc,model,fault", [
    pytest.param("cfg", 2, "tiny", "1 decode raise", marks=pytest.mark.slow),
    pytest.param("seq", 2, "tiny-flux", "0 decode raise", marks=pytest.mark.slow),
    pytest.param("cfg", 2, "tiny", "1 decode die", marks=pytest.mark.slow),
])
def test_a_rank_that_fails_in_the_split_decode_ends_the_job_within_seconds(tmp_path, mode, nproc, model, fault):
    """test_parallel's fault in the first round's decode, before the all-gather its partners wait in."""
    report, seconds, root_rank = _failed_job_and_root_cause(tmp_path, nproc, mode, fault, model=model, size=64,
                                                            extra=("--vae-split", "on"))
    rank, how = int(fault.split()[0]), fault.split()[2]
    line = report.splitlines()[1]
    if how == "raise":
        assert line == f"rank {rank} failed during round 0 (item 0): RuntimeError: out of memory on purpose", report
        assert root_rank == rank, f"torchrun names rank {root_rank} as the root cause"
    else:
        assert line.startswith(f"rank {rank} was lost during round 0 (item 0): its process ended"), report
    assert seconds < 30, f"the job ended {seconds:.0f} s after the failure"


# ---- bench/bench_parallel.py's split-decode rows, on CPUs --------------------------------------------------------

@pytest.mark.slow  # a torchrun job
def test_the_benchs_split_decode_rows_run_on_cpus_with_gloo(tmp_path):
    """What the bench runs on GPUs: here the tiny VAE, 64x64 (32 latent rows: two bands of 24) and 32x32 (16: whole)."""
    from bench import bench_parallel

    rows, lines = [], []
    bench_parallel.vae_split_decode(str(tmp_path), "tiny", [64, 32], [2], rows, lines, repeats=1)
    split, whole = rows
    assert split["mode"] == "vae-split decode" and split["gpus"] == 2 and split["dtype"] == "float32"
    assert (split["bands"], split["band_rows"], split["latent_rows"]) == (2, 24, 32)
    assert split["stats"] == {"split: 2 band(s) per image": 2}  # the warm-up and the timed call
    assert 15 < split["psnr_db"] < math.inf and split["whole_ms"] > 0 and split["split_ms"] > 0
    assert whole["stats"] == {"whole (too small to split)": 2} and whole["psnr_db"] == math.inf
    assert lines[0].startswith("| tiny | 64 | 2 | 2 x 24 of 32 |")
