#!/usr/bin/env bash
# Downloads the wheels the AUTOMATIC1111 webui needs on the GPU box (Python 3.12, manylinux x86_64, no internet
# there) into .whl-a1111/ (git-ignored), one by one and without dependencies, so that torch is never pulled:
#   integrations/a1111/download_gpu_wheels.sh
# On the GPU box:  python -m venv --system-site-packages /tmp/a1111-venv &&
#                  /tmp/a1111-venv/bin/pip install --no-index --no-deps --no-build-isolation .whl-a1111/*
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl-a1111
grep -v '^#' integrations/a1111/gpu_wheels.txt | while read -r requirement; do
  [ -z "$requirement" ] && continue
  pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl-a1111 "$requirement" \
    || pip download --quiet --no-deps --no-binary=:all: -d .whl-a1111 "$requirement" \
    || echo "MISSING $requirement"  # pure-Python packages published as sources only
done
ls .whl-a1111 | wc -l
