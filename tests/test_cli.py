"""`python -m rocm_sd info`, `demo` and `bench` run end to end: `info` in a subprocess (the true entry point, in the
default run), `demo` and `bench` in-process through rocm_sd.cli.main, and again in a subprocess in the slow run."""
import contextlib
import io
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rocm_sd import bench
from tests.conftest import HAVE_GPU


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "rocm_sd", *args], capture_output=True, text=True, timeout=timeout)


def run_cli_in_process(*args):
    """rocm_sd.cli.main(args) as `python -m rocm_sd` would run it: its exit status, stdout and stderr."""
    from rocm_sd import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(args))
        except SystemExit as stop:
            status = stop.code
    return SimpleNamespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.fixture(params=["in-process", pytest.param("subprocess", marks=pytest.mark.slow)])
def rocm_sd_command(request):
    """Runs `python -m rocm_sd ARGS`: in-process (the default run), or in a subprocess (slow: imports anew)."""
    return run_cli_in_process if request.param == "in-process" else run_cli


def test_info_names_the_kernel_library_state():
    result = run_cli("info")
    assert result.returncode == 0, result.stderr
    assert "rocm_sd::group_norm" in result.stdout
    assert "_C" in result.stdout and ("loaded" in result.stdout or "not built" in result.stdout
                                      or "load failed" in result.stdout)


@pytest.mark.skipif(HAVE_GPU, reason="the GPU demo runs the full SD1.5 architecture; see bench/")
def test_demo_on_cpu_writes_two_images_and_a_table(tmp_path, rocm_sd_command):
    result = rocm_sd_command("demo", "--out", str(tmp_path), "--steps", "2", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    assert "| rocm_sd   |" in result.stdout and "PSNR" in result.stdout
    for name in ("reference.png", "rocm_sd.png"):
        assert os.path.getsize(tmp_path / name) > 0
    # a CPU's times are noise: no speed-up, and the sentence that says why
    assert "|        - |" in result.stdout.split("| rocm_sd   |")[1].splitlines()[0]
    assert bench.CPU_TIMES in result.stdout


@pytest.mark.parametrize("logged", [True, False])
def test_demo_names_each_fallback_reason_once(monkeypatch, capsys, logged):
    """The dispatcher logs each op's fallback reason: the demo's summary then names the ops only; without the log
    (ROCM_SD_LOG=0) one line per reason, naming its ops."""
    from rocm_sd import config, demo

    monkeypatch.setattr(config, "current", config.Config(**{**config.current.__dict__, "log_fallbacks": logged}))
    demo._print_fallbacks({"geglu": ["not built"], "layer_norm": ["not built"], "attention": ["head_dim 999"]})
    out = capsys.readouterr().out
    if logged:
        assert "not built" not in out and "head_dim" not in out and "geglu, layer_norm, attention" in out
    else:
        assert out.count("not built") == 1 and "geglu, layer_norm fell back to PyTorch because: not built" in out
        assert out.count("head_dim 999") == 1


def test_bench_writes_rows_for_each_engine_and_ablation(tmp_path, rocm_sd_command):
    result = rocm_sd_command("bench", "--model", "tiny", "--engines", "eager,rocm_sd", "--steps", "2", "--repeats",
                             "1", "--warmup", "0", "--ablation", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [data_path] = tmp_path.glob("data/tiny-*.jsonl")
    import json

    [data] = [json.loads(line) for line in data_path.read_text().splitlines()]
    assert {"run", "bench", "date", "device", "torch", "commit", "command", "results"} <= data.keys()
    labels = [row["label"] for row in data["results"]]
    assert labels[:2] == ["eager", "rocm_sd"] and "rocm_sd cuda_graph=off" in labels
    for row in data["results"]:
        assert row["median_s"] > 0 and row["psnr_db"] > 40, row
    assert "| rocm_sd |" in result.stdout
    assert (bench.CPU_TIMES in result.stdout) != HAVE_GPU
    from PIL import Image

    with Image.open(tmp_path / (data_path.stem + ".png")) as chart:
        assert chart.size[0] > 300 and chart.size[1] > 100


def test_bench_rejects_unknown_engines(rocm_sd_command):
    result = rocm_sd_command("bench", "--model", "tiny", "--engines", "eager,tensorrt", "--out", "")
    assert result.returncode != 0 and "unknown engines" in result.stderr


def test_info_reports_the_build_and_its_ck_instances(monkeypatch, capsys):
    """The loaded-_C branch of `info`, on a CPU machine: a build that lists CK instances, and one that has none."""
    from rocm_sd import _ext, info
    from rocm_sd.ops import REGISTRY

    group_norm = REGISTRY["group_norm"]

    monkeypatch.setattr(_ext, "built_info", lambda: {"platform": "hip", "targets": "gfx942", "runtime_version": 60400,
                                                     "source_hash": "abc"})
    monkeypatch.setattr(group_norm, "ck_instances", lambda: [("ck_group_norm_swish_f16_b64_c1x64_s1x1_v1", True)])
    assert info.run() == 0
    out = capsys.readouterr().out
    assert "built for hip targets gfx942 (runtime 60400, kernel sources abc)" in out and "1 group_norm" in out
    monkeypatch.setattr(group_norm, "ck_instances", lambda: [])
    info.run()
    assert "none (built on ROCm when Composable Kernel headers are found)" in capsys.readouterr().out


def test_bench_writes_to_a_user_folder_unless_told(tmp_path, monkeypatch):
    """Run inside a clone, the default --out must not add files to the repository's bench/results (its tests reject
    runs that are not rendered): the run goes to the user's cache folder; --out bench/results writes there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    common = ["bench", "--model", "tiny", "--engines", "eager", "--steps", "1", "--repeats", "1", "--warmup", "0"]
    result = run_cli_in_process(*common)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "bench").exists()
    assert list((tmp_path / "cache" / "rocm_sd" / "bench" / "data").glob("tiny-*.jsonl"))
    result = run_cli_in_process(*common, "--out", "bench/results")
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "bench" / "results" / "data").glob("tiny-*.jsonl"))


@pytest.mark.parametrize("hip, cuda, files, vendor", [
    (None, "12.8", {"/dev/kfd"}, "AMD"),        # pip's default CUDA torch on an AMD machine
    (None, None, {"/dev/nvidiactl"}, "NVIDIA"),  # a CPU torch on an NVIDIA machine
    ("6.4", None, {"/dev/kfd"}, None),           # the ROCm torch where it belongs
    (None, None, set(), None),                   # no GPU: a CPU torch is right
])
def test_info_warns_when_torch_cannot_use_the_gpu_present(monkeypatch, hip, cuda, files, vendor):
    import torch

    from rocm_sd import platform

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    why = platform.torch_mismatch(exists=files.__contains__)
    assert (why is None) == (vendor is None)
    if vendor:
        assert f"{vendor} GPU" in why and "install the" in why


@pytest.mark.skipif(HAVE_GPU, reason="what a listing on a CPU says")
def test_tune_list_on_a_cpu_lists_the_gpus_problems_and_names_no_database(capsys):
    """Without a GPU the listing runs the model on the meta device in the GPU's dtype (--dtype, default float16 for
    the UNets): the GPU's problems, not float32 ones, and no database, which nothing here would write."""
    from rocm_sd.tune.cli import main as tune_main

    assert tune_main(["--model", "tiny", "--list", "--ops", "geglu"]) == 0
    out = capsys.readouterr().out
    assert "geglu|float16|" in out and "float32" not in out and "float16 on the meta device: no GPU here" in out
    assert "database" not in out and ".json" not in out
    assert tune_main(["--model", "tiny", "--list", "--ops", "geglu", "--dtype", "bfloat16"]) == 0
    assert "geglu|bfloat16|" in capsys.readouterr().out


def test_prepare_on_a_cpu_runs_each_size_and_says_there_is_no_search(rocm_sd_command):
    result = rocm_sd_command("prepare", "--model", "tiny", "--sizes", "32x32,48x32", "--vae-tiles", "on")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("rocm_sd prepare: tiny, float32, batch 1") and "VAE decode in fixed-shape tiles" in line
               for line in lines), result.stdout
    assert [line.split(":")[0].strip() for line in lines if "new convolution" in line] == ["32x32", "48x32"]
    assert "on a CPU: no convolution or GEMM search to fill" in lines[-1] and lines[-1].startswith("prepared 2 sizes")


@pytest.mark.gpu
def test_prepare_on_a_gpu_searches_each_size_and_restores_the_benchmark_setting():
    import torch

    from rocm_sd import prepare

    before = torch.backends.cudnn.benchmark
    result = prepare.run("tiny", [(128, 128), (192, 128)], vae_tiles=True, progress=False)
    assert torch.backends.cudnn.benchmark is before
    assert list(result.sizes) == [(128, 128), (192, 128)] and result.count("convolution") > 0
    assert ("MIOpen find" if torch.version.hip else "cuDNN benchmark mode") in result.searched
