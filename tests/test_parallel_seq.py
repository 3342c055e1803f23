"""Sequence parallelism (parallel/seq.py) on CPUs with gloo: the tiny SD3 and Flux transformers split over two
processes compute what one process does, with head counts the ranks do not divide too (uneven groups), fewer heads than ranks are refused by name, cfg-seq images equal one
process's, and in seq and cfg-seq mode a rank that raises, is killed or hangs (in setup, a step, an attention)
ends the job on every rank within seconds (a hang: at --timeout-s), named by rank 0 and by torchrun.

The transformer tests spawn one two-process job (module fixture) that checks every case, so the imports are paid
once; the end-to-end tests reuse test_parallel's torchrun harness and fault injection. The default run has one
failure job (a seq rank raising); the others, four-process jobs and hangs, are marked slow.
"""
from __future__ import annotations

import datetime
import re

import pytest
import torch
import torch.distributed as dist

from rocm_sd.parallel.seq import PLANS, head_groups, heads_problem

from tests.test_parallel import (PROMPTS, _assert_hung_rank_named, _failed_job_and_root_cause, _generate, _images,
                                 _two_process_results)

CASES = [(arch, optimized) for arch in ("tiny-sd3", "tiny-flux") for optimized in (False, True)]
# Attentions per step: tiny-sd3 has two blocks, the first with a second (image-only) attention; tiny-flux two double
# and two single blocks.
ATTENTIONS = {"tiny-sd3": 3, "tiny-flux": 4}


def _transformer(arch: str, **config):
    from rocm_sd.dit_models import ARCHITECTURES
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    spec = ARCHITECTURES[arch]
    torch.manual_seed(0)
    cls = SD3Transformer2DModel if spec.family == "sd3" else FluxTransformer2DModel
    return cls(**{**spec.transformer, **config}).eval()


def _inputs(model, batch: int = 2, text: int = 5) -> dict:
    """A step's arguments: random, the same on every rank (seeded)."""
    generator = torch.Generator().manual_seed(1)
    config = model.config

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    if type(model).__name__ == "SD3Transformer2DModel":
        return dict(hidden_states=randn(batch, config.in_channels, 8, 8),
                    encoder_hidden_states=randn(batch, text, config.joint_attention_dim),
                    pooled_projections=randn(batch, config.pooled_projection_dim),
                    timestep=torch.tensor([500.0] * batch))
    side = 4  # 16 image tokens
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(side * 1.0), torch.arange(side * 1.0),
                                         indexing="ij"), -1).reshape(-1, 3)
    return dict(hidden_states=randn(batch, side * side, config.in_channels),
                encoder_hidden_states=randn(batch, text, config.joint_attention_dim),
                pooled_projections=randn(batch, config.pooled_projection_dim), timestep=torch.tensor([0.5] * batch),
                img_ids=img_ids, txt_ids=torch.zeros(text, 3), guidance=torch.tensor([3.5] * batch))


def _seq_job(rank: int, world: int, store: str, results) -> None:
    """Every case on this rank: (max |seq - one process|, max |one process|); then the heads that do not divide."""
    import rocm_sd
    from rocm_sd.parallel.seq import disable_sequence_parallel, enable_sequence_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    out = {}
    with torch.no_grad():
        for arch, optimized in CASES:
            model = _transformer(arch)
            if optimized:
                rocm_sd.optimize(model)
            inputs = _inputs(model)
            one = model(**inputs, return_dict=False)[0]
            enable_sequence_parallel(model, dist.group.WORLD)
            split = model(**inputs, return_dict=False)[0]
            shard = getattr(model, "_rocm_sd_seq_parallel")[0]
            disable_sequence_parallel(model)
            again = model(**inputs, return_dict=False)[0]
            out[arch, optimized] = ((split - one).abs().max().item(), one.abs().max().item(), dict(shard.stats),
                                    torch.equal(again, one))
        for heads in (3, 5):  # uneven head groups (2 + 1, 3 + 2) in both models' orders of image and text rows
            for arch in ("tiny-flux", "tiny-sd3"):
                head_dim = _transformer(arch).config.attention_head_dim
                width = {"caption_projection_dim": heads * head_dim} if arch == "tiny-sd3" else {}
                model = _transformer(arch, num_attention_heads=heads, **width)
                inputs = _inputs(model)
                one = model(**inputs, return_dict=False)[0]
                enable_sequence_parallel(model, dist.group.WORLD)
                split = model(**inputs, return_dict=False)[0]
                out[arch, heads] = ((split - one).abs().max().item(), one.abs().max().item())
        try:
            enable_sequence_parallel(_transformer("tiny-flux", num_attention_heads=1), dist.group.WORLD)
            out["heads"] = "enabled"
        except ValueError as error:
            out["heads"] = str(error)
    results[rank] = out
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def seq_results(tmp_path_factory):
    return _two_process_results(tmp_path_factory, "seq", _seq_job, timeout_s=240)


@pytest.mark.parametrize("arch,optimized", CASES)
def test_sequence_parallel_transformer_matches_one_process(seq_results, arch, optimized):
    for rank in (0, 1):
        error, scale, stats, reverted = seq_results[rank][arch, optimized]
        assert scale > 0.1  # a real output, not zeros
        assert error <= 1e-5 * max(1.0, scale), f"rank {rank}: max difference {error} (outputs up to {scale})"
        assert stats == {"split": 1, "attention": ATTENTIONS[arch]}, stats
        assert reverted, "disable_sequence_parallel left the model changed"


@pytest.mark.parametrize("arch", ["tiny-flux", "tiny-sd3"])
@pytest.mark.parametrize("heads", [3, 5])
def test_heads_that_do_not_divide_split_unevenly_and_match_one_process(seq_results, arch, heads):
    for rank in (0, 1):
        error, scale = seq_results[rank][arch, heads]
        assert scale > 0.1
        assert error <= 1e-5 * max(1.0, scale), f"rank {rank}: max difference {error} (outputs up to {scale})"


def test_sequence_parallel_refuses_fewer_heads_than_ranks(seq_results):
    for rank in (0, 1):
        message = seq_results[rank]["heads"]
        assert message.startswith("sequence parallelism splits the 1 attention heads of FluxTransformer2DModel"), \
            message
        assert "1 heads cannot give each of 2 ranks one; run at most 1 processes" in message


def test_head_groups_are_consecutive_and_as_even_as_the_count_allows():
    class Config:
        num_attention_heads = 38

    class SD3Transformer2DModel:
        config = Config()

    assert head_groups(38, 4) == [(0, 10), (10, 10), (20, 9), (29, 9)]
    assert head_groups(24, 3) == [(0, 8), (8, 8), (16, 8)]
    assert head_groups(5, 5) == [(i, 1) for i in range(5)]
    assert "SD3Transformer2DModel" in PLANS
    assert heads_problem(SD3Transformer2DModel(), 4) == heads_problem(SD3Transformer2DModel(), 38) == ""
    assert heads_problem(SD3Transformer2DModel(), 39).endswith(
        "38 heads cannot give each of 39 ranks one; run at most 38 processes (ring attention, which would take more, "
        "is not built)")


def test_cfg_parallel_splits_the_transformer_step(monkeypatch):
    """cfg-seq's guidance halves: the CFG pair splits the transformer's batch (the SD3 pipeline passes it as
    hidden_states=...) as it splits a UNet's; once only the VAE decode was split, and each half's group ran both."""
    from types import SimpleNamespace

    from rocm_sd.parallel import cfg

    def all_gather(whole, part, group):  # the partner's half: this rank's again, for the check below
        whole.copy_(torch.cat([part, part]))

    monkeypatch.setattr(cfg.dist, "get_world_size", lambda group: 2)
    monkeypatch.setattr(cfg.dist, "get_rank", lambda group: 0)
    monkeypatch.setattr(cfg, "all_gather_single", all_gather)
    model = _transformer("tiny-sd3")
    inputs = _inputs(model, batch=4)
    with torch.no_grad():
        whole = model(**inputs, return_dict=False)[0]
        pipe = cfg.enable_cfg_parallel(SimpleNamespace(transformer=model), group=None)
        split = model(**inputs, return_dict=False)[0]
    assert dict(model.forward.stats) == {"split": 1}
    assert split.shape == whole.shape
    assert torch.allclose(split[:2], whole[:2], atol=1e-5) and torch.allclose(split[2:], whole[:2], atol=1e-5)
    cfg.disable_cfg_parallel(pipe)
    assert "forward" not in model.__dict__


# ---- end to end: torchrun -m rocm_sd generate --mode seq ------------------------------------------------------

@pytest.mark.slow  # four processes
def test_cfg_seq_mode_images_match_one_process(tmp_path):
    """Four processes, the guidance halves over two pairs and each half's tokens over its pair, make the images one
    process makes (here, in this one). Seq mode alone (tiny-flux, two processes) passed the same test when written;
    it is left out to spare CI a job: the transformer tests above hold its arithmetic, the failure test its mode."""
    from rocm_sd import models, optimize
    from rocm_sd.parallel.generate import Job, call_pipeline

    # 64x64: 16 image tokens (the pipeline's default size has 4096, which take a minute on a CPU)
    proc, out = _generate(tmp_path, "cfg-seq", 4, "--mode", "cfg-seq", "--height", "64", "--width", "64",
                          model="tiny-sd3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    images = _images(out)
    pipe = optimize(models.load_pipeline("tiny-sd3", torch.device("cpu"), torch.float32))
    job = Job(prompts=PROMPTS, batch=2, steps=3, height=64, width=64)
    one = [image.astype("int16") for batch in (range(0, 2), range(2, 4), range(4, 5))
           for image in call_pipeline(pipe, job, batch)]
    assert len(images) == len(one) == len(PROMPTS)
    assert all(image.std() > 5 for image in images)  # real pictures, not blanks
    for i, (a, b) in enumerate(zip(one, images)):
        assert abs(a - b).max() <= 2, f"image {i}: max difference {abs(a - b).max()}"


# ---- a rank that fails: every rank ends within seconds (a hang: at --timeout-s), the failed rank named ---------
#
# test_parallel's faults (_inject_fault) in the second transformer step of the first round ('round'), in that
# step's first attention between its two all-to-alls ('attention'), or in the pipeline's setup. In seq mode the
# other rank waits in the group's all-to-all; in cfg-seq mode (ranks 0, 1 the unconditional half's tokens, 2, 3 the
# conditional half's; rank i pairs with i + 2) the failed rank's sequence partner waits in the all-to-all, its CFG
# partner in the step's all-gather, and the fourth rank in its own all-gather with the partner that waits.
# _failed_job_and_root_cause also checks that every rank's process has ended.

JOBS = {"seq": (2, "tiny-flux"), "cfg-seq": (4, "tiny-sd3")}  # 64x64: 16 image tokens, which 2 ranks divide
ROUND = "round 0 (item 0)"  # seq and cfg-seq make one image at a time: every rank is in round 0's item


def _case(mode: str, fault: str, *rest, slow: bool = True):
    """A test case of `mode` and `fault` named as both, e.g. cfg-seq-1-round-hang; slow unless told."""
    return pytest.param(mode, fault, *rest, id=f"{mode}-{fault.replace(' ', '-')}",
                        marks=[pytest.mark.slow] if slow else [])


def _seq_failed_job(tmp_path, mode: str, fault: str, **kwargs):
    nproc, model = JOBS[mode]
    return _failed_job_and_root_cause(tmp_path, nproc, mode, fault, model=model, size=64, **kwargs)


@pytest.mark.parametrize("mode,fault", [
    _case("seq", "1 round raise", slow=False),  # the default run's one seq failure job
    _case("seq", "0 attention raise"),
    _case("cfg-seq", "3 round raise"),
    _case("cfg-seq", "1 attention raise"),
])
def test_a_seq_rank_that_raises_ends_the_job_within_seconds(tmp_path, mode, fault):
    """Its group waits in the collectives of a step it never joins: the lookouts end the job."""
    report, seconds, root_rank = _seq_failed_job(tmp_path, mode, fault)
    rank = int(fault.split()[0])
    assert report.splitlines()[1] == f"rank {rank} failed during {ROUND}: RuntimeError: out of memory on purpose"
    assert f"rank {rank}'s traceback" in report
    assert root_rank == rank, f"torchrun names rank {root_rank} as the root cause"
    assert seconds < 30, f"the job ended {seconds:.0f} s after the failure"


# slow: a killed rank in the default run is test_parallel's test_a_failing_rank_ends_the_job_on_every_rank[die]
@pytest.mark.parametrize("mode,fault", [_case("seq", "1 round die"), _case("cfg-seq", "2 attention die")])
def test_a_killed_seq_rank_is_named_and_the_job_ends_within_seconds(tmp_path, mode, fault):
    report, seconds, _ = _seq_failed_job(tmp_path, mode, fault)
    rank = int(fault.split()[0])
    assert report.splitlines()[1].startswith(f"rank {rank} was lost during {ROUND}: its process ended"), report
    lost = [line for line in report.splitlines() if re.match(r"rank \d+ was lost", line)]  # rank 0's lines only
    assert lost == report.splitlines()[1:2], f"only rank {rank} was lost:\n{report}"
    assert seconds < 30, f"the job ended {seconds:.0f} s after the kill"


# slow: each waits for --timeout-s
@pytest.mark.parametrize("mode,fault,step,waiting", [
    _case("seq", "1 round hang", ROUND, {0}),  # rank 0 waits in the group's all-to-all
    _case("seq", "0 setup hang", "pipeline setup", {1}),  # rank 1 waits in the agreement
    _case("seq", "1 attention hang", ROUND, {0}),  # rank 0 waits in the all-to-all that brings its rows back
    _case("cfg-seq", "1 round hang", ROUND, {0, 2, 3}),  # whichever of those that wait gives up first names it
    _case("cfg-seq", "0 setup hang", "pipeline setup", {1, 2, 3}),
])
def test_a_hung_seq_rank_ends_the_job_at_the_timeout_and_is_named(tmp_path, mode, fault, step, waiting):
    timeout_s = 20
    report, seconds, root_rank = _seq_failed_job(tmp_path, mode, fault, timeout_s=timeout_s, wall_s=150)
    _assert_hung_rank_named(report, seconds, root_rank, fault, step, waiting, timeout_s)


def test_cfg_seq_mode_needs_two_ranks_per_guidance_half(monkeypatch):
    from rocm_sd.parallel.mesh import init

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="cfg-seq mode splits each guidance half's tokens over two or more processes"):
        init("cfg-seq")
