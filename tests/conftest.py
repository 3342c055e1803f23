import os
import sys

import pytest
import torch

from rocm_sd import platform
from tests.comfyui_standin import STANDINS, load_node_package

HAVE_GPU = platform.gpu_available()


def pytest_configure(config):
    """On a machine without a GPU, one CPU thread for torch here and in the subprocesses (python -m rocm_sd,
    torchrun), unless OMP_NUM_THREADS says otherwise. The tiny models' ops are too small to gain from a second
    thread, and on a shared two-core machine one waiting for a descheduled peer made the run twice as slow
    (the in-process bench test: 40 s with two threads under load, 4 s with one)."""
    if not HAVE_GPU and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true",
                     help="also run the tests marked slow (ROCM_SD_RUN_SLOW=1 does the same; .ci/run sets it)")


def run_slow(config) -> bool:
    """The default run (the README's `python -m pytest`) skips the `slow` tests, to finish in minutes on two cores:
    whole-hip/ compile lanes, torchrun jobs beyond one of each kind, subprocess twins of in-process CLI tests, nvcc
    drivers, and the AMD emulation's tests whose host library is not built yet (see build_emulation). They run with
    --run-slow, ROCM_SD_RUN_SLOW=1 (CI), or a -m expression that names slow (`-m slow`)."""
    return (config.getoption("--run-slow") or os.environ.get("ROCM_SD_RUN_SLOW", "") not in ("", "0")
            or "slow" in (config.getoption("markexpr") or ""))


def build_emulation(config) -> bool:
    """Whether this run compiles the AMD emulation's host libraries it lacks (34, minutes of clang++ on two cores):
    in the slow lane and when asked for by `-m amd_emulation`. Otherwise the tests of a library not built yet are
    skipped, and those of a built one (cached outside the clone, tests/amd_emulation/build.py) run."""
    return run_slow(config) or "amd_emulation" in (config.getoption("markexpr") or "")


def emulated_libraries(item) -> list[tuple[str, tuple[str, ...]]]:
    """(arch, kernel families) of each emulated library the test loads: its module's LIBRARIES (fixture name ->
    families) for the fixtures it uses, each parametrized by the architecture."""
    libraries = getattr(getattr(item, "module", None), "LIBRARIES", {})
    params = getattr(getattr(item, "callspec", None), "params", {})
    return [(params[name], tuple(families)) for name, families in libraries.items() if name in params]


def pytest_collection_modifyitems(config, items):
    from tests.amd_emulation import build

    skip_gpu = pytest.mark.skip(reason="no GPU visible to torch")
    skip_slow = pytest.mark.skip(reason="slow: run with --run-slow or ROCM_SD_RUN_SLOW=1 (.ci/run does)")
    slow, emulation = run_slow(config), build_emulation(config)
    skip_cold = not emulation and build.compiler() is not None  # without clang++, emulated.MARKS say why
    built = {}
    for item in items:
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip_gpu)
        elif item.get_closest_marker("slow") and not slow:
            item.add_marker(skip_slow)
        elif skip_cold:
            for arch, families in emulated_libraries(item):
                if (arch, families) not in built:  # is_built hashes the sources: once per library
                    built[arch, families] = build.is_built(arch, list(families))
                if built[arch, families]:
                    continue
                item.add_marker(pytest.mark.skip(reason=(
                    f"the AMD emulation's {arch} {'+'.join(families)} library is not built yet: --run-slow, "
                    f"ROCM_SD_RUN_SLOW=1 or -m amd_emulation builds it (into {build.cache_root()})")))
                break


def pytest_collection_finish(session):
    """Builds the emulated libraries the selected tests need, in parallel, before the first test, saying what it
    compiles and where it caches it."""
    from tests.amd_emulation import build

    config = session.config
    if config.option.collectonly or not build_emulation(config) or build.compiler() is None:
        return
    needed = {}
    for item in session.items:
        if not item.get_closest_marker("skip"):
            needed.update(dict.fromkeys(emulated_libraries(item)))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter else print
    build.build_all([(arch, list(families)) for arch, families in needed], len(os.sched_getaffinity(0)), say)


@pytest.fixture(autouse=True)
def _seed_and_stats():
    import rocm_sd

    torch.manual_seed(0)
    rocm_sd.reset_stats()
    yield
    if HAVE_GPU:
        torch.cuda.synchronize()


@pytest.fixture(autouse=True, scope="session")
def _private_tuning_database(tmp_path_factory):
    """Tests never read or write the user's tuning database, nor read the shipped defaults: a tuned `torch`
    choice there would make strict GPU tests pass on PyTorch, and tests must not leave results in a real cache."""
    from rocm_sd import config
    from rocm_sd.tune import active

    saved = config.current
    config.current = config.Config(**{**saved.__dict__, "tune_db": str(tmp_path_factory.mktemp("tune_db")),
                                                  "tune_defaults": False})
    active.reload()
    yield
    config.current = saved
    active.reload()


@pytest.fixture(autouse=True, scope="session")
def _private_self_check_cache(tmp_path_factory):
    """Tests never read or write the user's record of the attention kernel's self-check (ops/attention_self_check.py):
    a passed check kept there would spare a GPU test the check it means to run."""
    from rocm_sd.ops import attention_self_check

    saved = attention_self_check.cache_path
    path = tmp_path_factory.mktemp("self_check") / "attention_self_check.json"
    attention_self_check.cache_path = lambda: path
    yield
    attention_self_check.cache_path = saved


# ---- the ComfyUI node tests: ComfyUI's interfaces from tests/standins, the node package loaded as ComfyUI does

@pytest.fixture(scope="module")
def comfy():
    sys.path.insert(0, STANDINS)
    import comfy.ldm.modules.attention as attention
    import comfy.model_base
    import comfy.model_patcher
    import comfy.sd

    yield {"attention": attention, "model_base": comfy.model_base, "ModelPatcher": comfy.model_patcher.ModelPatcher,
           "VAE": comfy.sd.VAE}
    sys.path.remove(STANDINS)
    for name in [m for m in sys.modules if m == "comfy" or m.startswith("comfy.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def nodes(comfy):
    package, nodes_module = load_node_package()
    assert package.NODE_CLASS_MAPPINGS is nodes_module.NODE_CLASS_MAPPINGS
    return nodes_module
