"""optimize(pipe) / revert(pipe) on the diffusion transformers (SD3 / SD3.5 MMDiT, Flux): tiny random-weight pipelines
from dit_models.py on the CPU, and on a GPU strictly (every new op on its kernel)."""
import copy

import pytest
import torch
from torch import nn

import rocm_sd
from rocm_sd import config, models
from rocm_sd.modules.joint_attention import RocmFluxAttnProcessor, RocmJointAttnProcessor
from rocm_sd.modules.mmdit import RocmGELU, linear_gelu_tanh
from rocm_sd.modules.rms_norm import RocmRMSNorm

ARCHS = ["tiny-sd3", "tiny-flux"]
EXPECTED = {  # what optimize() reports per tiny architecture (2 double / joint blocks; Flux: 2 single blocks too)
    "tiny-sd3": {"MMDiT block fused": 2, "attention processor": 3, "linear+gelu(tanh)": 3},
    "tiny-flux": {"Flux double block fused": 2, "Flux single block fused": 2, "attention processor": 4,
                  "linear+gelu(tanh)": 4},
}


def generate(pipe, steps=2, seed=0, output_type="latent"):
    device = pipe._execution_device
    with torch.no_grad():
        return pipe(**models.prompt_kwargs(pipe, "a lighthouse at dawn"), num_inference_steps=steps, height=64,
                    width=64, generator=torch.Generator(device).manual_seed(seed), output_type=output_type).images


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request):
    return request.param, models.build_sd_pipeline(request.param, "cpu", torch.float32)


def test_builders_make_the_pipelines_the_issue_names():
    for arch in ("sd3", "sd35m", "sd35", "sd35-turbo", "flux", "flux-schnell", "tiny-sd3", "tiny-flux"):
        assert models.is_transformer(arch) and arch in models.ARCHITECTURES
        assert models.gpu_dtype(arch) is torch.bfloat16
    assert models.default_steps("flux-schnell") == 4 and models.default_steps("sd15") == 50
    assert not models.is_transformer("sdxl")


def test_optimize_patches_reports_and_reverts_exactly(tiny):
    arch, pipe = tiny
    reference = generate(pipe)
    keys = list(pipe.transformer.state_dict())
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe)
        report = rocm_sd.report(pipe)
        for what, n in EXPECTED[arch].items():
            assert report["transformer"][what] == n, (what, report["transformer"])
        assert report["transformer"]["graphed: forward"] == 1
        t5 = pipe.text_encoder_3 if arch == "tiny-sd3" else pipe.text_encoder_2
        assert sum(type(m) is RocmRMSNorm for m in t5.modules()) == t5.config.num_layers * 2 + 1
        assert list(pipe.transformer.state_dict()) == keys
        optimized = generate(pipe)
    # On the CPU the ops take their PyTorch paths; the fused gated residuals round once (addcmul): float32 rounding
    assert torch.allclose(optimized, reference, rtol=1e-4, atol=1e-4), (optimized - reference).abs().max()
    rocm_sd.revert(pipe)
    assert rocm_sd.report(pipe)["transformer"] == {}
    assert not any(isinstance(m, (RocmGELU, RocmRMSNorm)) for m in pipe.transformer.modules())
    assert "forward" not in vars(pipe.transformer)
    assert torch.equal(generate(pipe), reference)


def test_each_flag_alone_keeps_the_image(tiny):
    # every fusion on its own (the others off) agrees with the untouched pipeline: a wrong chunk order, stream, or
    # modulation would not
    arch, pipe = tiny
    reference = generate(pipe)
    flags = ("fuse_transformer", "attention", "linear_gelu", "layer_norm")
    for flag in flags:
        with config.override(log_fallbacks=False):
            rocm_sd.optimize(pipe, cuda_graph=False, **{f: f == flag for f in flags if f != "layer_norm"},
                             layer_norm=flag in ("layer_norm", "fuse_transformer"))
            out = generate(pipe)
        rocm_sd.revert(pipe)
        assert torch.allclose(out, reference, rtol=1e-4, atol=1e-4), (flag, (out - reference).abs().max())


def test_processors_and_blocks_hand_uncovered_calls_to_diffusers(tiny):
    arch, pipe = tiny
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cuda_graph=False)
    try:
        processors = {type(p) for p in pipe.transformer.attn_processors.values()}
        assert processors == ({RocmJointAttnProcessor} if arch == "tiny-sd3" else {RocmFluxAttnProcessor})
        # an attention module that takes the image stream alone: SD3.5's second attention, a Flux single block's
        blocks = pipe.transformer.transformer_blocks if arch == "tiny-sd3" else pipe.transformer.single_transformer_blocks
        attn = blocks[0].attn2 if arch == "tiny-sd3" else blocks[0].attn
        calls = []
        fallback = attn.processor.fallback
        attn.processor.fallback = lambda *a, **k: calls.append(1) or fallback(*a, **k)
        hidden = torch.randn(1, 8, attn.query_dim)
        mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
        attn.processor(attn, hidden, None, mask)  # a mask: diffusers' own processor
        assert calls == [1]
        attn.processor(attn, hidden)
        assert calls == [1]
    finally:
        rocm_sd.revert(pipe)


def test_a_lora_layer_on_a_single_blocks_projection_takes_diffusers_forward():
    # the split proj_out reads the base weight: a LoRA-wrapped proj_out must run diffusers' own forward
    pipe = models.build_sd_pipeline("tiny-flux", "cpu", torch.float32)
    block = pipe.transformer.single_transformer_blocks[0]
    reference = generate(pipe)

    class Doubled(nn.Module):  # stands for a peft LoRA layer: another class around the Linear
        def __init__(self, base):
            super().__init__()
            self.base = base

        def forward(self, x):
            return 2 * self.base(x)

    block.proj_out = Doubled(block.proj_out)
    changed = generate(pipe)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cuda_graph=False)
        assert torch.allclose(generate(pipe), changed, rtol=1e-4, atol=1e-4)
    rocm_sd.revert(pipe)
    assert not torch.allclose(changed, reference)


def test_copies_of_an_optimized_transformer_are_independent():
    pipe = models.build_sd_pipeline("tiny-flux", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cuda_graph=False)
        twin = copy.deepcopy(pipe.transformer)
        rocm_sd.revert(pipe)
        assert sum(type(p) is RocmFluxAttnProcessor for p in twin.attn_processors.values()) == 4
        assert not any(type(p) is RocmFluxAttnProcessor for p in pipe.transformer.attn_processors.values())


def test_gradients_flow_through_the_fused_blocks():
    pipe = models.build_sd_pipeline("tiny-sd3", "cpu", torch.float32)
    transformer = pipe.transformer
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(transformer, cuda_graph=False)
    x = torch.randn(1, 16, 8, 8, requires_grad=True)
    out = transformer(hidden_states=x, encoder_hidden_states=torch.randn(1, 5, 32),
                      pooled_projections=torch.randn(1, 64), timestep=torch.tensor([500.0]), return_dict=False)[0]
    out.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    rocm_sd.revert(transformer)


def test_linear_gelu_tanh_is_gelu_of_the_projection():
    linear = nn.Linear(16, 24)
    x = torch.randn(3, 5, 16)
    assert torch.allclose(linear_gelu_tanh(linear, x), nn.functional.gelu(linear(x), approximate="tanh"), atol=1e-6)


@pytest.mark.parametrize("gpu_platform, arch, epilogue", [
    ("cuda", "sm_90", True), ("cuda", "sm_86", True), ("hip", "gfx942", True), ("hip", "gfx90a", True),
    ("hip", "gfx950", True), ("hip", "gfx1100", False), ("hip", "gfx1151", False), ("hip", "gfx1201", False),
    ("hip", "gfx1030", False)])
def test_the_gelu_epilogue_is_the_vendors_only_where_pytorch_runs_it_in_the_gemm(monkeypatch, gpu_platform, arch,
                                                                                 epilogue):
    from rocm_sd import platform
    from rocm_sd.modules import mmdit

    monkeypatch.setattr(platform, "torch_gpu_platform", lambda: gpu_platform)
    monkeypatch.setattr(platform, "device_arch", lambda device=None: arch)
    mmdit.vendor_gelu_epilogue.cache_clear()  # the answer is kept per device
    try:
        assert mmdit.vendor_gelu_epilogue(torch.device("cuda", 0)) is epilogue
    finally:
        mmdit.vendor_gelu_epilogue.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", [True, False])
def test_addmm_gelu_tanh_on_the_gpu_takes_the_epilogue_or_the_kernel(monkeypatch, epilogue):
    """Either way (the vendor's epilogue, or the GEMM then rocm_sd::gelu_tanh adding the bias, as on RDNA) the
    projection's GELU(tanh) within bf16 of F.gelu(F.linear(...))."""
    from rocm_sd.modules import mmdit

    monkeypatch.setattr(mmdit, "vendor_gelu_epilogue", lambda device: epilogue)
    linear = nn.Linear(256, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    rocm_sd.reset_stats()
    with config.override(strict=True), torch.no_grad():
        got = mmdit.addmm_gelu_tanh(x, linear.weight, linear.bias)
        want = nn.functional.gelu(linear(x).float(), approximate="tanh")
    assert ("gelu_tanh" in rocm_sd.stats()) is not epilogue
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_optimized_transformers_on_gpu_run_their_kernels_and_agree(arch, dtype, monkeypatch):
    monkeypatch.setenv("ROCM_SD_STRICT", "1")
    pipe = models.build_sd_pipeline(arch, "cuda", dtype)
    reference = generate(pipe).float()
    rocm_sd.reset_stats()
    rocm_sd.optimize(pipe)
    out = generate(pipe).float()
    stats = rocm_sd.stats()
    for op in ("ada_layer_norm", "add_ada_layer_norm", "rms_norm"):
        assert stats[op]["rocm_sd"] > 0 and stats[op].get("torch", 0) == 0, (op, stats[op])
    report = rocm_sd.report(pipe)["transformer"]
    assert report["forward: graph replays"] >= 1
    scale = reference.abs().max()
    assert (out - reference).abs().max() <= 0.05 * scale, ((out - reference).abs().max(), scale)
    rocm_sd.revert(pipe)
    assert torch.equal(generate(pipe).float(), reference)


def test_bench_times_a_transformer_and_keeps_the_rows_of_an_engine_that_fails(monkeypatch, tmp_path):
    from rocm_sd import bench

    def broken_compile(pipe):
        raise RuntimeError("dynamo could not trace this\nsecond line")

    monkeypatch.setattr(bench, "_compile_transformer", broken_compile)
    rows = bench.run(model="tiny-flux", steps=1, repeats=1, warmup=0, engines=("eager", "compile", "rocm_sd"),
                     out_dir=str(tmp_path))
    by_label = {r["label"]: r for r in rows}
    assert by_label["compile"]["skipped"] == "failed: RuntimeError: dynamo could not trace this"
    assert by_label["rocm_sd"]["median_s"] > 0 and by_label["rocm_sd"]["psnr_db"] > 40
    assert (tmp_path / "data" / "tiny-flux-cpu.jsonl").exists()


@pytest.mark.parametrize("arch", ARCHS)
def test_img2img_pipelines_patch_and_revert(arch):
    from diffusers import FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline

    text2img = models.build_sd_pipeline(arch, "cpu", torch.float32)
    cls = StableDiffusion3Img2ImgPipeline if arch == "tiny-sd3" else FluxImg2ImgPipeline
    pipe = cls(**text2img.components)
    pipe.set_progress_bar_config(disable=True)
    kwargs = models.prompt_kwargs(text2img, "a lighthouse at dawn")
    image = torch.rand(1, 3, 64, 64)

    def run():
        with torch.no_grad():
            return pipe(**kwargs, image=image, strength=0.75, num_inference_steps=4, height=64, width=64,
                        generator=torch.Generator().manual_seed(0), output_type="latent").images

    reference = run()
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe)
        assert rocm_sd.report(pipe)["transformer"]["attention processor"] > 0
        assert torch.allclose(run(), reference, rtol=1e-4, atol=1e-4)
    rocm_sd.revert(pipe)
    assert torch.equal(run(), reference)


def test_tune_lists_the_transformers_problems(capsys, monkeypatch):
    """Its ops, and with --precision fp8 (the device check answered for the meta device) its 8-bit layers: to_qkv and
    proj_mlp sharing the single block's one quantization, and the MLP half of its split proj_out."""
    from rocm_sd.patch import precision
    from rocm_sd.tune.cli import main as tune_main

    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    assert tune_main(["--model", "tiny-flux", "--list", "--precision", "fp8",
                      "--ops", "ada_layer_norm,add_ada_layer_norm,rms_norm,linear_8bit"]) == 0
    out = capsys.readouterr().out
    for op in ("ada_layer_norm|bfloat16|", "add_ada_layer_norm|bfloat16|", "rms_norm|bfloat16|"):  # Flux's dtype
        assert op in out, out
    for layer in ("K=32,N=96,shared=2,input=rows", "K=32,N=128,shared=2,input=rows", "K=128,N=32,shared=1,input=rows"):
        assert f"linear_8bit|bfloat16|e4m3fn|{layer}|" in out, out


def test_value_rows_join_as_torch_cat_for_views_and_contiguous_tensors():
    """joint_attention.joined: fuse_qkv's strided V views and plain tensors, batch 1 and 2, gradients included."""
    from rocm_sd.modules.joint_attention import joined

    for batch in (1, 2):
        qkv = torch.randn(batch, 7, 3 * 4 * 8, dtype=torch.float64, requires_grad=True)
        c_qkv = torch.randn(batch, 3, 3 * 4 * 8, dtype=torch.float64, requires_grad=True)
        value = qkv.unflatten(-1, (3, 4, 8))[:, :, 2]
        c_value = c_qkv.unflatten(-1, (3, 4, 8))[:, :, 2]
        assert not value.is_contiguous()
        out = joined(value, c_value)
        assert torch.equal(out, torch.cat([value, c_value], dim=1)) and out.is_contiguous()
        out.square().sum().backward()
        assert torch.equal(qkv.grad.unflatten(-1, (3, 4, 8))[:, :, 2], 2 * value.detach())
        assert torch.equal(joined(value.contiguous(), c_value.contiguous()), out)
