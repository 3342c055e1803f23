"""AUTOMATIC1111 runs this at launch: install rocm_sd from the repository this extension lives in, if the
webui's Python cannot import it yet (building its kernels needs the ROCm or CUDA toolchain of your torch).

The install runs without build isolation, so that the build sees the webui's own torch (an isolated build would
fetch another, and the kernels would be built for it): the build backend and pybind11 (pyproject.toml's
build-system requires) must then be in the webui's Python, and are installed first when missing."""
import os

import launch

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
BUILD_REQUIRES = {"scikit-build-core": "scikit-build-core>=0.10", "pybind11": "pybind11>=2.12"}

if not launch.is_installed("rocm_sd") and os.path.exists(os.path.join(REPO, "pyproject.toml")):
    missing = [spec for name, spec in BUILD_REQUIRES.items() if not launch.is_installed(name)]
    if missing:
        launch.run_pip("install " + " ".join(f'"{spec}"' for spec in missing),
                       "rocm_sd's build requirements (" + ", ".join(missing) + ")")
    launch.run_pip(f'install --no-build-isolation -e "{REPO}"', "rocm_sd (builds its GPU kernels, a few minutes)")
