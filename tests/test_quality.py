"""`python -m rocm_sd quality` (rocm_sd/quality.py) and the bench's mode engines (rocm_sd/bench.py MODES), on the
tiny architecture on a CPU. The real precision patcher is replaced by test patchers: one that perturbs the UNet's
linear weights a little (a mode that changes images), one that cannot run and says so (the mode equals the
reference). SSIM is checked against a float64 numpy computation written out window by window."""
from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rocm_sd import bench, cli, models, quality
from rocm_sd.patch import pipeline
from tests.test_cli import run_cli_in_process

ROOT = Path(__file__).resolve().parent.parent


# ---- SSIM -------------------------------------------------------------------------------------------------------

def ssim_numpy(a: np.ndarray, b: np.ndarray, data_range: float = 1.0) -> float:
    """Wang et al. 2004 written out: at every position where the 11x11 window fits, the window-weighted means,
    variances and covariance (2-D Gaussian weights, sigma 1.5, summing to 1), the index, then the mean over
    positions and channels. float64 numpy, no convolution."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim == 2:
        a, b = a[..., None], b[..., None]
    r = np.arange(11) - 5.0
    w = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * 1.5 ** 2))
    w /= w.sum()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    values = []
    for c in range(a.shape[2]):
        x = np.lib.stride_tricks.sliding_window_view(a[..., c], (11, 11))
        y = np.lib.stride_tricks.sliding_window_view(b[..., c], (11, 11))
        mx, my = (x * w).sum(axis=(-2, -1)), (y * w).sum(axis=(-2, -1))
        vx = (w * (x - mx[..., None, None]) ** 2).sum(axis=(-2, -1))
        vy = (w * (y - my[..., None, None]) ** 2).sum(axis=(-2, -1))
        cxy = (w * (x - mx[..., None, None]) * (y - my[..., None, None])).sum(axis=(-2, -1))
        values.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    return float(np.mean(values))


def _pairs():
    rng = np.random.default_rng(25)
    smooth = np.cumsum(np.cumsum(rng.random((40, 36, 3)), 0), 1)
    smooth /= smooth.max()
    yield "noise vs noise", rng.random((32, 27, 3)), rng.random((32, 27, 3))
    yield "image vs slightly noisy", smooth, np.clip(smooth + rng.normal(0, 0.02, smooth.shape), 0, 1)
    yield "image vs brighter, blurred", smooth, np.clip(0.8 * smooth + 0.15, 0, 1)[::-1].copy()
    gray = rng.random((12, 19))
    yield "grayscale, one window tall", gray, gray ** 2


@pytest.mark.parametrize("name, a, b", list(_pairs()), ids=[p[0] for p in _pairs()])
def test_ssim_matches_a_float64_computation_window_by_window(name, a, b):
    assert quality.ssim(a, b) == pytest.approx(ssim_numpy(a, b), rel=1e-9, abs=1e-12)
    assert quality.ssim(torch.from_numpy(a).float(), torch.from_numpy(b).float()) == pytest.approx(
        ssim_numpy(a.astype(np.float32), b.astype(np.float32)), rel=1e-9, abs=1e-12)


def test_ssim_of_identical_and_of_constant_images():
    rng = np.random.default_rng(0)
    image = rng.random((24, 24, 3))
    assert quality.ssim(image, image) == 1.0
    # Two flat images: no variance, so SSIM is the luminance term alone, (2 m n + C1) / (m^2 + n^2 + C1).
    m, n, c1 = 0.3, 0.7, 0.01 ** 2
    assert quality.ssim(np.full((16, 16), m), np.full((16, 16), n)) == pytest.approx(
        (2 * m * n + c1) / (m * m + n * n + c1), rel=1e-12)
    assert math.isnan(quality.ssim(np.where(image > 0.5, np.nan, image), image))


def test_ssim_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="one shape"):
        quality.ssim(np.zeros((16, 16, 3)), np.zeros((16, 16)))
    with pytest.raises(ValueError, match="at least 11x11"):
        quality.ssim(np.zeros((10, 40)), np.zeros((10, 40)))


# ---- test patchers in optimize()'s precision option ----------------------------------------------------------------

def _restore_weight(module: nn.Linear, weight: torch.Tensor) -> None:
    module.weight.data.copy_(weight)


def perturb_linears(model, record, options) -> None:
    """A mode that changes the images a little: every nn.Linear's weight plus 1% of its spread in noise."""
    if options["precision"] == "fp16":
        return
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            weight = module.weight.data
            record.on_revert(_restore_weight, module, weight.clone())
            weight.add_(torch.randn(weight.shape, generator=generator).to(weight) * 0.01 * weight.std())
            record.counts[f"test: linear -> perturbed {options['precision']}"] += 1


def cannot_run(model, record, options) -> None:
    """A mode this device cannot run: the model stays as it is, report() and the log say why."""
    if options["precision"] == "fp16":
        return
    record.skip_option("precision", f"skipped: precision={options['precision']}: not supported on cpu; the linear "
                                    "layers stay in float32")
    logging.getLogger("rocm_sd").warning("precision=%s: not supported on cpu; the linear layers stay in float32",
                                         options["precision"])


def _with_precision_patcher(monkeypatch, patcher) -> None:
    from rocm_sd.patch import precision

    monkeypatch.setattr(precision, "quantize_linears", patcher)  # the precision option's patcher (patch/flags.py)


@pytest.fixture
def perturbing(monkeypatch):
    _with_precision_patcher(monkeypatch, perturb_linears)


@pytest.fixture
def unsupported(monkeypatch):
    _with_precision_patcher(monkeypatch, cannot_run)


# ---- the quality command ----------------------------------------------------------------------------------------

QUALITY = ["quality", "--model", "tiny", "--precision", "fp8", "--steps", "2", "--prompts", "2", "--device", "cpu"]


def _result(tmp_path) -> dict:
    [path] = tmp_path.glob("tiny-fp8.json")
    return json.loads(path.read_text())


def test_quality_measures_a_mode_that_changes_the_images(tmp_path, perturbing):
    result = run_cli_in_process(*QUALITY, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    data = _result(tmp_path)
    assert data["applied"] and data["not_applied"] is None and data["options"] == {"precision": "fp8"}
    assert [r["seed"] for r in data["images"]] == [0, 1]
    assert [r["prompt"] for r in data["images"]] == list(quality.PROMPTS[:2])
    for r in data["images"]:
        assert 10 < r["psnr_db"] < 90 and 0 < r["ssim"] < 1, r
        assert r["reference_s"] > 0 and r["mode_s"] > 0
        assert r["reference_finite"] == r["mode_finite"] == "ok"
    assert data["worst"]["psnr_db"] == min(r["psnr_db"] for r in data["images"])
    assert data["mean"]["ssim"] == pytest.approx(sum(r["ssim"] for r in data["images"]) / 2)
    assert data["worst"]["finite"] == "0 / 0 with NaN/Inf"
    assert "test: linear -> perturbed fp8" in data["report"]["unet"]
    # The table and its footer, printed and saved.
    out = result.stdout
    assert "| # | prompt | seed | PSNR dB | SSIM | reference s | fp8 s |" in out
    assert f"| 0 | {quality.PROMPTS[0]} | 0 | {data['images'][0]['psnr_db']:.2f} |" in out
    assert "| worst |" in out and "Random weights: tiny is the architecture built from its config" in out
    assert "not applied" not in out
    assert out.split("\n\n")[1].strip() in (tmp_path / "tiny-fp8.md").read_text()
    from PIL import Image

    with Image.open(tmp_path / "tiny-fp8.png") as grid:
        assert grid.width >= 3 * 64 and grid.height >= 2 * 64
        cells = np.asarray(grid.convert("RGB"))
    assert cells.std() > 0


def test_quality_mode_images_are_the_patched_pipelines(tmp_path, perturbing):
    """The mode column is what optimize(precision=...) makes and the reference what optimize() makes: the same
    images as calling the pipeline by hand."""
    quality.run(model="tiny", precision="fp8", steps=2, prompts=1, device="cpu", out_dir=str(tmp_path))
    data = _result(tmp_path)
    pipe = models.build_sd_pipeline("tiny")
    from rocm_sd import patch

    images = {}
    for name, options in (("reference", {}), ("mode", {"precision": "fp8"})):
        patch.optimize(pipe, **options)
        images[name] = quality._generate(pipe, quality.PROMPTS[0], 0, 2, 64, torch.device("cpu"))[1]
        patch.revert(pipe)
    assert data["images"][0]["psnr_db"] == pytest.approx(bench.psnr(images["reference"], images["mode"]), rel=1e-6)


def test_quality_says_when_the_mode_did_not_run_and_shows_the_reference_again(tmp_path, unsupported):
    result = run_cli_in_process(*QUALITY, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    data = _result(tmp_path)
    assert not data["applied"] and data["mode_column"] == "fp8 (not applied)"
    assert "skipped: precision=fp8: not supported on cpu" in data["not_applied"]
    assert "the linear layers stay in float32" in data["not_applied"]
    for r in data["images"]:
        assert r["psnr_db"] == math.inf and r["ssim"] == 1.0
    out = result.stdout
    assert "note: precision=fp8: not applied on cpu (unet: skipped: precision=fp8: not supported on cpu" in out
    assert "| fp8 (not applied) s |" in out and "| inf | 1 |" in out


class ModelBuilt(BaseException):
    """Raised where a model would be built: no error handler of the CLI reports it."""


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise ModelBuilt

    monkeypatch.setattr(models, "build_sd_pipeline", refuse)
    monkeypatch.setattr(models, "load_pipeline", refuse)


ARGUMENT_ERRORS = [  # (arguments after `quality`, exit status, what the last line of stderr says)
    ([], 2, "python -m rocm_sd quality: error: nothing to compare with the reference (fp16, no cache): give "
            "--precision, --attention-precision and/or --cache"),
    (["--precision", "fp4"], 2, "argument --precision: invalid choice: 'fp4' (choose from "),
    (["--precision", "fp16"], 2, "argument --precision: invalid choice: 'fp16'"),
    (["--cache", "always"], 2, "argument --cache: invalid choice: 'always' (choose from "),
    (["--precision", "int8", "--cache-interval", "2"], 2,
     "argument --cache-interval: applies to --cache deepcache only"),
    (["--cache", "deepcache", "--cache-threshold", "0.1"], 2,
     "argument --cache-threshold: applies to --cache adaptive, fbcache, teacache only"),
    (["--cache", "fbcache", "--model", "tiny"], 2,
     "argument --cache: cache='fbcache' is for the diffusion transformers (SD3 / SD3.5, Flux); UNets take "
     "'deepcache' or 'adaptive', and tiny is a UNet model"),
    (["--cache", "deepcache", "--model", "tiny-flux"], 2,
     "argument --cache: cache='deepcache' is for UNets; the diffusion transformers take 'fbcache' or 'teacache', and "
     "tiny-flux is a diffusion transformer"),
    (["--cache", "teacache", "--cache-branch", "1", "--model", "tiny-sd3"], 2,
     "argument --cache-branch: applies with --cache deepcache or adaptive only"),
    (["--cache", "deepcache", "--cache-interval", "0"], 2, "argument --cache-interval: 0 is not a positive integer"),
    (["--cache", "adaptive", "--cache-threshold", "-0.5"], 2,
     "argument --cache-threshold: -0.5 is not a non-negative number"),
    (["--cache", "adaptive", "--cache-threshold", "nan"], 2, "argument --cache-threshold: nan is not a finite number"),
    (["--precision", "fp8", "--cache-branch", "1"], 2,
     "argument --cache-branch: applies with --cache deepcache or adaptive only"),
    (["--cache", "deepcache", "--precision-layers", "all"], 2,
     "argument --precision-layers: applies with --precision only"),
    (["--precision", "fp8", "--precision-layers", "some"], 2, "argument --precision-layers: invalid choice: 'some'"),
    (["--precision", "int8", "--precision-convs", "off"], 2, "argument --precision-convs: applies with --precision fp8 only"),
    (["--precision", "fp8", "--precision-convs", "no"], 2, "argument --precision-convs: invalid choice: 'no'"),
    (["--attention-precision", "fp16"], 2, "argument --attention-precision: invalid choice: 'fp16'"),
    (["--attention-precision", "int8"], 2, "argument --attention-precision: invalid choice: 'int8'"),
    (["--cache", "deepcache", "--cache-branch", "-1"], 2, "argument --cache-branch: -1 is not a non-negative integer"),
    (["--precision", "fp8", "--prompts", "0"], 2, "argument --prompts: 0 is not a positive integer"),
    (["--precision", "fp8", "--steps", "-1"], 2, "argument --steps: -1 is not a positive integer"),
    (["--precision", "fp8", "--size", "36"], 2, "argument --size: 36 is not a positive multiple of 8"),
    (["--precision", "fp8", "--seed", "one"], 2, "argument --seed: invalid int value: 'one'"),
    (["--precision", "fp8", "--device", "tpu"], 2, "argument --device: tpu is not a device; accepted: cpu, cuda or "
                                                   "cuda:N"),
    (["--precision", "fp8", "--device", "cuda:99"], 2, "argument --device: cuda:99: "),
    (["--precision", "fp8", "--model", "{tmp}/no-such-model"], 2,
     "argument --model: '{tmp}/no-such-model' is neither an architecture nor an existing file or folder"),
    (["--precision", "fp8", "--model", "{tmp}/model.safetensors"], 2,
     "argument --model: '{tmp}/model.safetensors' is a single-file checkpoint; accepted: an architecture"),
    (["--precision", "fp8", "--out", "{tmp}/model.safetensors/out"], 2,
     "argument --out: {tmp}/model.safetensors/out: {tmp}/model.safetensors is a file, not a folder"),
]


@pytest.mark.parametrize("argv, status, message", ARGUMENT_ERRORS, ids=[" ".join(c[0]) for c in ARGUMENT_ERRORS])
def test_a_bad_quality_argument_is_one_line_and_builds_nothing(argv, status, message, tmp_path, no_model, capsys):
    (tmp_path / "model.safetensors").write_bytes(b"not really")
    assert cli.main(["quality", *(a.format(tmp=tmp_path) for a in argv), "--out", str(tmp_path / "out")]
                    if "--out" not in argv else ["quality", *(a.format(tmp=tmp_path) for a in argv)]) == status
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err.strip().splitlines()[-1], err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, options", [
    (["--precision", "int8"], {"precision": "int8"}),
    (["--precision", "fp8", "--precision-layers", "measured"], {"precision": "fp8"}),
    (["--precision", "fp8", "--precision-layers", "all"], {"precision": "fp8", "precision_layers": "all"}),
    (["--cache", "deepcache"], {"cache": "deepcache", "cache_interval": 3}),
    (["--cache", "deepcache", "--cache-interval", "5", "--precision", "fp8"],
     {"precision": "fp8", "cache": "deepcache", "cache_interval": 5}),
    (["--cache", "adaptive", "--cache-threshold", "0"], {"cache": "adaptive", "cache_threshold": 0.0}),
    (["--cache", "deepcache", "--cache-branch", "1"], {"cache": "deepcache", "cache_interval": 3, "cache_branch": 1}),
    (["--cache", "adaptive", "--cache-branch", "0"], {"cache": "adaptive", "cache_threshold": 0.15}),
    (["--cache", "fbcache", "--model", "tiny-flux"], {"cache": "fbcache"}),
    (["--cache", "teacache", "--cache-threshold", "0.2", "--model", "tiny-sd3"],
     {"cache": "teacache", "cache_threshold": 0.2}),
    (["--precision", "fp8", "--precision-convs", "off"], {"precision": "fp8", "precision_convs": False}),
    (["--precision", "fp8", "--precision-convs", "on"], {"precision": "fp8"}),
    (["--attention-precision", "fp8"], {"attention_precision": "fp8"}),
    (["--attention-precision", "fp8", "--precision", "fp8"], {"precision": "fp8", "attention_precision": "fp8"}),
])
def test_valid_quality_arguments_reach_the_model(argv, options, tmp_path, no_model):
    args = cli.build_parser().parse_args(["quality", *argv])
    convs = None if args.precision_convs is None else args.precision_convs == "on"
    assert quality.mode_options(args.precision, args.cache, args.cache_interval, args.cache_threshold,
                                args.cache_branch, args.precision_layers, args.attention_precision, convs) == options
    with pytest.raises(ModelBuilt):
        cli.main(["quality", *argv, "--out", str(tmp_path)])


def test_mode_file_names():
    assert quality.mode_slug({"precision": "fp8"}) == "fp8"
    assert quality.mode_slug({"precision": "fp8", "precision_layers": "all"}) == "fp8all"
    assert quality.mode_slug({"precision": "fp8", "precision_convs": False}) == "fp8noconv"
    assert quality.mode_slug({"precision": "int8", "cache": "adaptive", "cache_threshold": 0.15}) == "int8-adaptive0.15"
    assert quality.mode_slug({"cache": "deepcache", "cache_interval": 3}) == "deepcache3"
    assert quality.mode_slug({"cache": "deepcache", "cache_interval": 3, "cache_branch": 1}) == "deepcache3-branch1"
    assert quality.mode_slug({"precision": "fp8", "attention_precision": "fp8"}) == "fp8-attentionfp8"
    assert quality.mode_slug({"cache": "fbcache"}) == "fbcache"  # the default threshold: the model's published one
    assert quality.mode_slug({"cache": "teacache", "cache_threshold": 0.2}) == "teacache0.2"


# ---- the bench's mode engines --------------------------------------------------------------------------------------

def _bench(tmp_path, engines: str):
    result = run_cli_in_process("bench", "--model", "tiny", "--engines", engines, "--steps", "2", "--repeats", "1",
                                "--warmup", "0", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [data_path] = tmp_path.glob("data/tiny-*.jsonl")
    [run] = [json.loads(line) for line in data_path.read_text().splitlines()]
    return result, run, {row["label"]: row for row in run["results"]}


def test_bench_mode_rows_compare_with_the_fp16_row(tmp_path, perturbing):
    # rocm_sd is not asked for: a mode adds it, before the mode, to compare against.
    result, run, rows = _bench(tmp_path, "rocm_sd-fp8,eager")
    assert list(rows) == ["eager", "rocm_sd", "rocm_sd-fp8"]
    fp8 = rows["rocm_sd-fp8"]
    assert fp8["options"] == {"precision": "fp8"} and fp8["median_s"] > 0
    assert 10 < fp8["psnr_vs_fp16_db"] < 90 and 10 < fp8["psnr_db"] < 90
    assert "psnr_vs_fp16_db" not in rows["rocm_sd"] and "psnr_vs_fp16_db" not in rows["eager"]
    header = next(line for line in result.stdout.splitlines() if line.startswith("| engine |"))
    assert header == ("| engine | median s | it/s | vs eager | vs rocm_sd | first call s | peak MB | PSNR dB | "
                      "PSNR vs rocm_sd dB | max latent diff |")
    line = next(line for line in result.stdout.splitlines() if line.startswith("| rocm_sd-fp8 |")).split(" | ")
    assert line[4] == f"{rows['rocm_sd']['median_s'] / fp8['median_s']:.2f}x" and line[8] == str(fp8["psnr_vs_fp16_db"])
    # The renderer draws the same table from the data.
    sys.path.insert(0, str(ROOT / "bench"))
    import render_results

    page = render_results.page("tiny-cpu", [run])
    assert header in page and "| rocm_sd-fp8 |" in page


def test_bench_mode_that_did_not_run_is_a_row_that_says_why(tmp_path, unsupported):
    result, run, rows = _bench(tmp_path, "rocm_sd,rocm_sd-int8")
    int8 = rows["rocm_sd-int8"]
    assert "median_s" not in int8 and "psnr_vs_fp16_db" not in int8 and int8["options"] == {"precision": "int8"}
    assert int8["skipped"].startswith("precision=int8 not applied on cpu: unet: skipped: precision=int8: not supported")
    assert f"| rocm_sd-int8 | not run: {int8['skipped']} |" in result.stdout


def test_the_default_engines_have_no_modes():
    assert not set(bench.MODES) & set(bench.ENGINES)
    assert bench._in_order(("rocm_sd-deepcache", "eager", "rocm_sd")) == ["eager", "rocm_sd", "rocm_sd-deepcache"]
    assert bench._in_order(("eager",)) == ["eager"]
    assert set(bench._optimize_flags()) == set(pipeline.FLAG_NAMES)  # the ablation toggles flags, not options


def test_ssim_is_printed_with_the_digits_that_tell_it_from_one():
    assert [quality._ssim_text(v) for v in (1.0, 0.91, 0.999996, math.nan)] == ["1", "0.9100", "0.9999960", "nan"]


def test_bench_fp8_attention_on_a_cpu_is_a_row_that_says_why(tmp_path):
    result, run, rows = _bench(tmp_path, "rocm_sd-attnfp8")
    attention = rows["rocm_sd-attnfp8"]
    assert attention["options"] == {"attention_precision": "fp8"} and "median_s" not in attention
    assert attention["skipped"].startswith("attention_precision=fp8 not applied on cpu: "), attention["skipped"]
    assert "needs a GPU" in attention["skipped"]
