"""The vendor tuners' results (tune/vendor.py): written so that later runs find them, read by later runs on
ROCm in use-only mode, and a user's own TunableOp / MIOpen settings left alone. CPU tests with a stand-in
for torch.cuda.tunable (no ROCm here)."""
import os

import pytest
import torch

from rocm_sd import platform
from rocm_sd.tune import vendor


class FakeTunable:
    """torch.cuda.tunable as recent PyTorch has it (no write_file), recording what is asked of it."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name in ("enable", "tuning_enable", "set_filename", "read_file"):
            return lambda *args: self.calls.append((name, *args))
        raise AttributeError(name)

    def get_validators(self):
        return (("PT_VERSION", "2.13.0"), ("ROCM_VERSION", "6.4.0"))

    def get_results(self):
        return (("GemmTunableOp_Half_TN", "tn_320_8192_320", "Gemm_Hipblaslt_1219", 0.0142),)


def test_tunableop_results_are_written_in_its_format_without_write_file(tmp_path):
    path = tmp_path / "tunableop_gfx942.csv"
    vendor.save_tunableop_results(FakeTunable(), path)
    assert path.read_text().splitlines() == ["Validator,PT_VERSION,2.13.0", "Validator,ROCM_VERSION,6.4.0",
                                             "GemmTunableOp_Half_TN,tn_320_8192_320,Gemm_Hipblaslt_1219,0.0142"]
    assert not list(tmp_path.glob("*.tmp"))


def test_older_pytorch_writes_its_own_file(tmp_path):
    written = []

    class Older(FakeTunable):
        def write_file(self, filename):
            written.append(filename)

    vendor.save_tunableop_results(Older(), tmp_path / "t.csv")
    assert written == [str(tmp_path / "t.csv")]


@pytest.fixture
def rocm(monkeypatch):
    fake = FakeTunable()
    monkeypatch.setattr(platform, "torch_gpu_platform", lambda: "hip")
    monkeypatch.setattr(torch.cuda, "tunable", fake, raising=False)
    monkeypatch.delenv("PYTORCH_TUNABLEOP_ENABLED", raising=False)
    monkeypatch.delenv("MIOPEN_USER_DB_PATH", raising=False)
    return fake


def test_rocm_runs_use_the_vendor_results_beside_the_database(tmp_path, rocm):
    results = vendor.tunableop_file(tmp_path, "gfx942_304cu_w64")
    results.write_text("Validator,PT_VERSION,2.13.0\n")
    vendor.miopen_folder(tmp_path).mkdir()
    used = vendor.use_vendor_results(tmp_path, "gfx942_304cu_w64")
    assert len(used) == 2
    assert rocm.calls == [("enable", True), ("tuning_enable", False), ("set_filename", str(results)),
                          ("read_file", str(results))]
    assert os.environ["MIOPEN_USER_DB_PATH"] == str(vendor.miopen_folder(tmp_path))


def test_a_users_own_settings_and_missing_files_are_left_alone(tmp_path, rocm, monkeypatch):
    assert vendor.use_vendor_results(tmp_path, "gfx942_304cu_w64") == [] and rocm.calls == []
    vendor.tunableop_file(tmp_path, "gfx942_304cu_w64").write_text("")
    vendor.miopen_folder(tmp_path).mkdir()
    monkeypatch.setenv("PYTORCH_TUNABLEOP_ENABLED", "0")
    monkeypatch.setenv("MIOPEN_USER_DB_PATH", "/mine")
    assert vendor.use_vendor_results(tmp_path, "gfx942_304cu_w64") == [] and rocm.calls == []
    assert os.environ["MIOPEN_USER_DB_PATH"] == "/mine"


def test_cuda_and_cpu_runs_touch_nothing(tmp_path, monkeypatch):
    vendor.tunableop_file(tmp_path, "sm_90_132sm_w32").write_text("")
    for gpu in ("cuda", None):
        monkeypatch.setattr(platform, "torch_gpu_platform", lambda gpu=gpu: gpu)
        assert vendor.use_vendor_results(tmp_path, "sm_90_132sm_w32") == []
