"""torch.compile over an optimized UNet (the `rocm_sd+compile` engine): fullgraph tracing must not meet anything
Dynamo cannot trace inside the patched forwards."""
import importlib
import os

import torch

import rocm_sd
from rocm_sd import models


def test_optimized_unet_compiles_fullgraph_when_the_ck_listing_is_opaque(monkeypatch, tmp_path):
    # The fused resnet and GEGLU forwards ask hosts_ck() whether to route through the CK-hosting ops. In a GPU build
    # that asks _C, a pybind function Dynamo cannot trace: `rocm_sd+compile` failed with fullgraph=True at 27e85f1
    # (H200). On the CPU _C is absent, so stand in a listing Dynamo cannot trace either (os.listdir, a C builtin).
    empty = tmp_path / "no_instances"
    empty.mkdir()
    hosting = [importlib.import_module(f"rocm_sd.ops.{name}") for name in ("conv_bias_residual", "linear_geglu")]
    for module in hosting:
        monkeypatch.setattr(module, "ck_listing", lambda function, device=None: os.listdir(empty))
        module.ck_instances.cache_clear()
    try:
        pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
        rocm_sd.optimize(pipe, cuda_graph=False)
        unet = pipe.unet
        sample = torch.randn(2, unet.config.in_channels, 8, 8)
        states = torch.randn(2, 77, unet.config.cross_attention_dim)
        timestep = torch.tensor([10.0, 10.0])
        torch._dynamo.reset()
        compiled = torch.compile(unet, backend="eager", fullgraph=True)
        with torch.no_grad():
            expected = unet(sample, timestep, states).sample
            got = compiled(sample, timestep, states).sample
        torch.testing.assert_close(got, expected)
    finally:
        torch._dynamo.reset()
        for module in hosting:
            module.ck_instances.cache_clear()
