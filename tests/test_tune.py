"""python -m rocm_sd.tune: harvesting a model's op calls, measuring candidates, and dispatch following
the database. CPU tests cover the harvest and listing; GPU tests tune for real."""
from __future__ import annotations

import json

import pytest
import torch

import rocm_sd
from rocm_sd import config, dispatch, models, platform
from rocm_sd.tune import active, problems
from rocm_sd.tune.cli import main as tune_main
from rocm_sd.tune.db import TuningDB
from rocm_sd.tune.device_keys import device_key, validators
from rocm_sd.tune.harvest import OpCall, TensorSpec, harvest

from .conftest import HAVE_GPU


def _listed(out: str) -> set[str]:
    """The problem keys a `--list` printed."""
    return {line.split()[0] for line in out.splitlines() if line.startswith("  ") and "|" in line}


def test_harvest_records_every_distinct_op_call_of_a_pipeline(capsys, monkeypatch):
    pipe = rocm_sd.optimize(models.build_sd_pipeline("tiny"))
    kw = models.prompt_kwargs(pipe, "a fox")
    calls = harvest(lambda: pipe(**kw, num_inference_steps=2, output_type="np"))
    ops = {call.op for call in calls}
    assert ops == {"group_norm", "geglu", "layer_norm", "add_layer_norm", "bias_residual", "attention", "parity_shuffle"}
    gn = next(c for c in calls if c.op == "group_norm")
    x = gn.args[0]
    assert isinstance(x, TensorSpec) and x.dtype == torch.float32 and x.stride[1] == 1  # channels_last, as run
    assert all(n >= 1 for n in calls.values())
    # Without a GPU, --list runs the same pipeline on the meta device (tune/on_meta.py): the same problems as this
    # real run, layouts included (meta's convolutions answer contiguous outputs unless told the GPU's layout)
    monkeypatch.setattr(platform, "gpu_available", lambda: False)
    assert tune_main(["--model", "tiny", "--list", "--dtype", "float32"]) == 0
    assert _listed(capsys.readouterr().out) == {problems.key_of(call) for call in calls}


def test_builds_with_ck_instances_tune_the_ops_that_host_them(monkeypatch):
    """Where CK GEMM / convolution instances are built (ROCm with CK headers), GEGLU projections and resnet tails
    are harvested as linear_geglu / conv_bias_residual problems whose candidates are PyTorch, the composed
    default and every instance that takes the call (stand-in names here: no CK build on this machine)."""
    import importlib

    geglu_module = importlib.import_module("rocm_sd.ops.linear_geglu")
    conv_module = importlib.import_module("rocm_sd.ops.conv_bias_residual")
    monkeypatch.setattr(geglu_module, "ck_instances", lambda device=None: ("ck_linear_geglu_f16_stand_in",))
    monkeypatch.setattr(conv_module, "ck_instances", lambda device=None: ("ck_conv_bias_residual_f16_stand_in",))
    pipe = rocm_sd.optimize(models.build_sd_pipeline("tiny"), cuda_graph=False)
    kw = models.prompt_kwargs(pipe, "a fox")
    with config.override(log_fallbacks=False):
        calls = harvest(lambda: pipe(**kw, num_inference_steps=2, output_type="latent"))
    rocm_sd.revert(pipe)
    ops = {call.op for call in calls}
    assert {"linear_geglu", "conv_bias_residual"} <= ops and "bias_residual" not in ops
    geglu_call = next(c for c in calls if c.op == "linear_geglu")
    assert problems.key_of(geglu_call).startswith("linear_geglu|float32|nchw|rows=")
    conv_call = next(c for c in calls if c.op == "conv_bias_residual")
    assert ",R=3,S=3,pad=1x1" in problems.key_of(conv_call)

    fp16 = [a.make("cpu").half() if isinstance(a, TensorSpec) else a for a in geglu_call.args]
    assert list(problems.OPS["linear_geglu"].candidates(*fp16)) == ["torch", "rocm_sd",
                                                                    "ck:ck_linear_geglu_f16_stand_in"]
    fp32 = [a.make("cpu") if isinstance(a, TensorSpec) else a for a in conv_call.args]
    assert list(problems.OPS["conv_bias_residual"].candidates(*fp32)) == ["torch", "rocm_sd"]  # CK takes fp16 only


def test_tensor_specs_rebuild_the_exact_layout():
    spec = TensorSpec((2, 8, 4, 4), (128, 1, 32, 8), torch.float16)
    t = spec.make("cpu")
    assert t.shape == spec.shape and t.stride() == spec.stride and t.dtype == spec.dtype and t.abs().sum() > 0
    call = OpCall("group_norm", (spec, 4, None, None, 1e-5, True))
    assert problems.key_of(call) == "group_norm|float16|nhwc|N=2,C=8,HW=16,G=4,act=silu,input_bias=0,params=none"


def test_dry_run_lists_problems_and_candidates(capsys):
    assert tune_main(["--model", "tiny", "--dry-run", "--ops", "group_norm,geglu"]) == 0
    out = capsys.readouterr().out
    assert "group_norm|" in out and "geglu|" in out and "layer_norm|" not in out
    assert "candidates: torch, rocm_sd:resident, rocm_sd:split" in out


def test_bad_requests_are_clear_errors(capsys):
    assert tune_main(["--model", "tiny", "--dry-run", "--ops", "attention_v9"]) == 2
    assert "unknown ops ['attention_v9']" in capsys.readouterr().err
    if not HAVE_GPU:
        assert tune_main(["--model", "tiny"]) == 2
        assert "measures on a GPU" in capsys.readouterr().err


def test_linear_8bit_problems_need_an_8bit_precision(capsys):
    assert tune_main(["--model", "tiny", "--dry-run", "--ops", "linear_8bit"]) == 2
    assert "linear_8bit needs --precision fp8 or int8" in capsys.readouterr().err


def test_dispatch_ignores_the_database_on_a_cpu():
    assert active.tuned_choice(torch.device("cpu"), lambda: pytest.fail("no lookup on a CPU")) is None


# ---- on a GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_tune_end_to_end_then_resume(tmp_path, capsys):
    assert tune_main(["--model", "tiny", "--dtype", "float16", "--db", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| op | dtype | layout | shape | choice |" in out
    db = TuningDB(device_key(), validators(), location=tmp_path)
    assert len(db) >= 10 and not db.notes
    from rocm_sd.ops.attention import instances

    from rocm_sd.ops.attention import sdpa_backends

    kernel_choices = {"rocm_sd", "rocm_sd:resident", "rocm_sd:split"} | {f"rocm_sd:{n}" for n in instances()} | \
        {f"torch:{b}" for b in sdpa_backends()}
    assert any(key.startswith("attention|") for key in db.results)  # harvested through optimize(attention=True)
    for key, result in db.results.items():
        assert result["choice"] == "torch" or result["choice"] in kernel_choices, (key, result["choice"])
        assert result["ms"] > 0 and result["torch_ms"] > 0 and result["speedup_vs_torch"] > 0
    assert tune_main(["--model", "tiny", "--dtype", "float16", "--db", str(tmp_path), "--resume"]) == 0
    assert f"--resume: {len(db)} problems already tuned" in capsys.readouterr().out


@pytest.mark.gpu
def test_a_wrong_candidate_is_never_chosen(monkeypatch):
    from rocm_sd.tune import measure as measure_module

    import dataclasses

    wrong = dataclasses.replace(problems.OPS["geglu"], candidates=lambda x: {
        "torch": problems.OPS["geglu"].reference, "rocm_sd": lambda x: torch.zeros_like(x[..., : x.shape[-1] // 2])})
    monkeypatch.setitem(problems.OPS, "geglu", wrong)
    call = OpCall("geglu", (TensorSpec((2, 64, 640), (40960, 640, 1), torch.float16),))
    outcome = measure_module.measure(call, torch.device("cuda"), l2_bytes=1 << 20)
    assert outcome.choice == "torch" and "inaccurate" in outcome.rejected["rocm_sd"]


@pytest.mark.gpu
def test_attention_follows_a_tuned_sdpa_backend_and_drops_one_that_cannot_run(tmp_path):
    from rocm_sd.ops.attention import attention_sdpa, kernel_may_run

    q, k, v = (torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    other = torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.float32)  # fp32: flash cannot take it
    db = TuningDB(device_key(), validators(), location=tmp_path)
    with config.override(tune_db=str(tmp_path), strict=True):
        try:
            db.record(problems.OPS["attention"].key(q, k, v, 0.125), {"choice": "torch:efficient"})
            db.record(problems.OPS["attention"].key(other, other, other, 0.125), {"choice": "torch:flash"})
            active.reload()
            assert kernel_may_run(q.device)  # the processor must not bypass the op: a backend was tuned
            y = torch.ops.rocm_sd.attention(q, k, v, 0.125)
            assert torch.equal(y, attention_sdpa(q, k, v, 0.125, "efficient"))
            y32 = torch.ops.rocm_sd.attention(other, other, other, 0.125)  # flash raises: SDPA's own pick
            assert torch.equal(y32, torch.ops.rocm_sd.attention(other, other, other, 0.125))
            assert rocm_sd.stats()["attention"] == {dispatch.TORCH: 3}
        finally:
            active.reload()


@pytest.mark.gpu
def test_attention_follows_a_tuned_instance(tmp_path):
    q, k, v = (torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    key = problems.OPS["attention"].key(q, k, v, 0.125)
    db = TuningDB(device_key(), validators(), location=tmp_path)
    with config.override(tune_db=str(tmp_path), strict=True):
        try:
            torch.ops.rocm_sd.attention(q, k, v, 0.125)  # untuned: SDPA, by policy (no error in strict mode)
            db.record(key, {"choice": "rocm_sd:f16_d80_w4_r2_n32"})
            active.reload()
            y = torch.ops.rocm_sd.attention(q, k, v, 0.125)
            assert rocm_sd.stats()["attention"] == {dispatch.TORCH: 1, dispatch.KERNEL: 1}
            from rocm_sd.ops.attention import attention_kernel

            assert torch.equal(y, attention_kernel(q, k, v, 0.125, instance="f16_d80_w4_r2_n32"))
        finally:
            active.reload()


@pytest.mark.gpu
def test_dispatch_follows_the_tuned_choice(tmp_path):
    x = torch.randn(2, 64, 640, device="cuda", dtype=torch.float16)
    key = problems.OPS["geglu"].key(x)
    db = TuningDB(device_key(), validators(), location=tmp_path)
    with config.override(tune_db=str(tmp_path), strict=True):
        try:
            db.record(key, {"choice": "torch"})
            active.reload()
            rocm_sd.reset_stats()
            torch.ops.rocm_sd.geglu(x)  # a tuned torch is a choice, not a fallback: fine in strict mode
            assert rocm_sd.stats()["geglu"] == {dispatch.TORCH: 1}
            db.record(key, {"choice": "rocm_sd"})
            active.reload()
            torch.ops.rocm_sd.geglu(x)
            assert rocm_sd.stats()["geglu"] == {dispatch.TORCH: 1, dispatch.KERNEL: 1}
        finally:
            active.reload()


@pytest.mark.gpu
def test_group_norm_takes_the_tuned_path_and_ignores_one_it_cannot_run(tmp_path):
    from rocm_sd.ops.group_norm import _plan, group_norm_ref  # rocm_sd.ops.group_norm the name is the op

    x = torch.randn(2, 320, 32, 32, device="cuda", dtype=torch.float16)
    w, b = torch.randn(320, device="cuda", dtype=torch.float16), torch.randn(320, device="cuda", dtype=torch.float16)
    args = (x, 32, w, b, 1e-5, True, None)
    key = problems.OPS["group_norm"].key(*args)
    db = TuningDB(device_key(), validators(), location=tmp_path)
    with config.override(tune_db=str(tmp_path)):
        try:
            for choice, path in (("rocm_sd:split", "split"), ("rocm_sd:no-such-path", "auto"),
                                 ("ck:ck_group_norm_swish_f16_b256_c1x256_s1x8_v8", "auto")):  # CK not in this build
                db.record(key, {"choice": choice})
                active.reload()
                y = torch.ops.rocm_sd.group_norm(*args)
                assert _plan(*args).detail[0] == path
                ref = group_norm_ref(x.float(), 32, w.float(), b.float(), 1e-5, True)
                assert (y.float() - ref).abs().max() < 2e-2
        finally:
            active.reload()


def test_database_file_is_json_people_can_read(tmp_path):
    db = TuningDB(device_key(), validators(), location=tmp_path)
    db.record("geglu|float16|nchw|rows=128,D=640", {"choice": "rocm_sd", "ms": 0.01})
    [table] = json.loads(db.path.read_text())["tables"]
    assert table["results"]["geglu|float16|nchw|rows=128,D=640"]["choice"] == "rocm_sd"
    assert table["device"]["arch"] == device_key().arch and table["validators"]["torch"] == torch.__version__


def test_ranks_with_the_same_gpu_split_the_problems(tmp_path):
    """Under torchrun, ranks of one device key tune disjoint shares (gloo, two CPU processes)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "share.py"
    script.write_text("import os, sys, torch\nfrom rocm_sd.tune.run import _rank_share\n"
                      "share = _rank_share(list(range(7)), torch.device('cpu'))\n"
                      "open(os.path.join(sys.argv[1], 'share' + os.environ['RANK']), 'w').write(repr(share))\n"
                      "torch.distributed.destroy_process_group()\n")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "share0").read_text() == "[0, 2, 4, 6]" and (tmp_path / "share1").read_text() == "[1, 3, 5]"


@pytest.mark.gpu
def test_tune_precision_times_each_8bit_layer_and_optimize_follows(tmp_path, capsys):
    """--precision fp8 --ops linear_8bit: one problem per 8-bit layer shape, each the faster of the fp16 GEMM and
    the 8-bit GEMM with its share of quantizing the input (by whoever quantizes it); optimize(precision="fp8") then
    keeps exactly the layers whose problem chose torch in fp16."""
    from rocm_sd.modules.quantized_linear import INPUT_QUANTIZERS, RocmQuantizedLinear
    from rocm_sd.patch.precision import number_format

    fmt, why = number_format(torch.device("cuda"), "fp8")
    if why:
        pytest.skip(why)
    assert tune_main(["--model", "tiny", "--dtype", "float16", "--height", "64", "--width", "64", "--precision", "fp8",
                      "--ops", "linear_8bit", "--db", str(tmp_path)]) == 0
    assert "| linear_8bit | float16 | " + fmt + " |" in capsys.readouterr().out
    db = TuningDB(device_key(), validators(), location=tmp_path)
    assert db.results and all(key.startswith(f"linear_8bit|float16|{fmt}|K=") for key in db.results)
    for key, result in db.results.items():
        parts = result["parts_ms"]
        assert result["choice"] in ("torch", fmt) and result["torch_ms"] > 0 and parts["gemm"] > 0
        quantizer = key.split("input=")[1].split("|")[0]
        assert quantizer in INPUT_QUANTIZERS and (parts["input"] >= 0 or quantizer.startswith("geglu"))
        eight_bit = parts["gemm"] + parts["input"] / parts["sharers"]
        assert result["ms"] == pytest.approx(min(result["torch_ms"], eight_bit), abs=3e-5)
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    keys = {}
    with config.override(tune_db=str(tmp_path), tune_defaults=False, strict=True):
        try:
            active.reload()
            rocm_sd.optimize(pipe, precision="fp8")
            layers = [m for m in pipe.unet.modules() if isinstance(m, RocmQuantizedLinear)]
            def record(layer, args):
                keys.setdefault(layer, layer.problem_key(args[0]))

            hooks = [m.register_forward_pre_hook(record) for m in layers]
            from .test_optimize import run_pipe

            run_pipe(pipe)
            for hook in hooks:
                hook.remove()
        finally:
            active.reload()
    assert keys.keys() == set(layers)
    assert all((m.fp16_layer is not None) == (db.lookup(keys[m])["choice"] == "torch") for m in layers)
    rocm_sd.revert(pipe)


def test_the_packages_names_are_its_functions_whatever_was_imported_first():
    """rocm_sd.tune's lazy names must not share a submodule's name: importing the submodule (as db.py does) would
    rebind the package's attribute to the module (`python -m rocm_sd info` called a module on a GPU)."""
    import rocm_sd.tune
    import rocm_sd.tune.db  # noqa: F401

    assert all(callable(getattr(rocm_sd.tune, name)) for name in rocm_sd.tune.__all__)


def test_a_listing_on_the_meta_device_runs_in_strict_mode(capsys, monkeypatch):
    """ROCM_SD_STRICT=1 (the GPU suite's setting) fails a GPU call that falls back; a listing without a GPU runs the
    pipeline on the meta device, where no kernel runs by design: it lists, it does not fail."""
    monkeypatch.setattr(platform, "gpu_available", lambda: False)
    with config.override(strict=True):
        assert tune_main(["--model", "tiny", "--list"]) == 0
    assert "rocm_sd::" not in capsys.readouterr().err


@pytest.mark.gpu
def test_a_listing_without_a_gpu_lists_what_the_gpu_tunes(capsys, monkeypatch):
    """The meta run of a listing without a GPU (tune/on_meta.py) gives the problems a GPU's own harvest gives, in
    its dtype and layouts."""
    assert tune_main(["--model", "tiny", "--list"]) == 0
    on_gpu = _listed(capsys.readouterr().out)
    monkeypatch.setattr(platform, "gpu_available", lambda: False)
    assert tune_main(["--model", "tiny", "--list"]) == 0
    out = capsys.readouterr().out
    assert "on the meta device" in out and _listed(out) == on_gpu and any("|float16|" in key for key in on_gpu)
