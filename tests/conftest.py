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
