"""The onnxruntime bench engine (rocm_sd/onnx_engine.py) on CPU: export, session, fallbacks, the skipped row."""
import pytest
import torch

from rocm_sd import bench, models, onnx_engine

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def generate(pipe, steps=2):
    kwargs = models.prompt_kwargs(pipe, "a lighthouse", "", 1)
    return pipe(**kwargs, num_inference_steps=steps, height=64, width=64, output_type="np",
                generator=torch.Generator().manual_seed(0)).images


@pytest.mark.parametrize("arch", ["tiny", "tiny-xl"])
def test_ort_unet_gives_the_pytorch_picture(arch):
    pipe = models.build_sd_pipeline(arch, "cpu", torch.float32)
    expected = generate(pipe)
    unet = pipe.unet
    pipe.unet = onnx_engine.OrtUNet(unet, onnx_engine.providers_for(torch.device("cpu"))[0])
    try:
        images = generate(pipe)
        assert pipe.unet.calls == {"onnxruntime": 2, "pytorch": 0}  # one batched CFG call per step
    finally:
        pipe.unet.close()
        pipe.unet = unet
    assert bench.psnr(expected, images) > 60


def test_calls_the_graph_cannot_express_run_the_original_unet():
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    ort_unet = onnx_engine.OrtUNet(pipe.unet, ["CPUExecutionProvider"])
    sample = torch.randn(2, 4, 8, 8)
    hidden = torch.randn(2, 77, pipe.unet.config.cross_attention_dim)
    try:
        out = ort_unet(sample, 10, hidden, cross_attention_kwargs={"scale": 1.0}).sample  # a LoRA scale
        assert ort_unet.calls == {"onnxruntime": 0, "pytorch": 1}
        assert torch.equal(out, pipe.unet(sample, 10, hidden, cross_attention_kwargs={"scale": 1.0}).sample)
        # New shapes export a new graph; the config and dtype come from the original module.
        for size in (8, 16):
            got = ort_unet(torch.randn(2, 4, size, size), 10, hidden, return_dict=False)[0]
            assert got.shape == (2, 4, size, size)
        assert len(ort_unet._sessions) == 2 and ort_unet.config is pipe.unet.config and ort_unet.dtype == torch.float32
    finally:
        ort_unet.close()


def test_a_gpu_without_gpu_provider_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    providers, why = onnx_engine.providers_for(torch.device("cuda", 0))
    assert providers is None and "no GPU execution provider" in why and "CPUExecutionProvider" in why
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["ROCMExecutionProvider", "CPUExecutionProvider"])
    assert onnx_engine.providers_for(torch.device("cuda", 0)) == (["ROCMExecutionProvider", "CPUExecutionProvider"], None)


def test_bench_reports_an_engine_that_cannot_run(monkeypatch, tmp_path, capsys):
    import json

    monkeypatch.setattr(onnx_engine, "providers_for", lambda device: (None, "onnxruntime is not installed"))
    rows = bench.run(model="tiny", steps=1, repeats=1, warmup=0, engines=("eager", "onnxruntime"), out_dir=str(tmp_path))
    assert rows[1] == {"engine": "onnxruntime", "label": "onnxruntime", "model": "tiny",
                       "skipped": "onnxruntime is not installed"}
    assert "| onnxruntime | not run: onnxruntime is not installed |" in capsys.readouterr().out
    [run] = [json.loads(line) for line in next(tmp_path.glob("data/tiny-*.jsonl")).read_text().splitlines()]
    assert {"engine": "onnxruntime", "label": "onnxruntime", "model": "tiny",
            "skipped": "onnxruntime is not installed"} in run["results"]
    assert next(tmp_path.glob("*.png")).stat().st_size > 0
