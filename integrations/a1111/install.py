"""AUTOMATIC1111 runs this at launch: install rocm_sd from the repository this extension lives in, if the
webui's Python cannot import it yet (building its kernels needs the ROCm or CUDA toolchain of your torch)."""
import os

import launch

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))

if not launch.is_installed("rocm_sd") and os.path.exists(os.path.join(REPO, "pyproject.toml")):
    launch.run_pip(f'install --no-build-isolation -e "{REPO}"', "rocm_sd (builds its GPU kernels, a few minutes)")
