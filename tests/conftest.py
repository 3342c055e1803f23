import pytest
import torch

from rocm_sd import platform

HAVE_GPU = platform.gpu_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no GPU visible to torch")
    for item in items:
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip_gpu)


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
    """Tests never read or write the user's tuning database: a tuned `torch` choice there would make
    strict GPU tests pass on PyTorch, and tests must not leave results in a real cache."""
    from rocm_sd import config
    from rocm_sd.tune import active

    saved = config.current
    config.current = config.Config(**{**saved.__dict__, "tune_db": str(tmp_path_factory.mktemp("tune_db"))})
    active.reload()
    yield
    config.current = saved
    active.reload()
