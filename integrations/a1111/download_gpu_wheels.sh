#!/usr/bin/env bash
# Downloads the wheels of integrations/a1111/gpu_wheels.txt for the offline GPU box (CPython 3.12, manylinux
# x86_64) into .whl-a1111/ (git-ignored):   integrations/a1111/download_gpu_wheels.sh
# One pin at a time and --no-deps, so that pip never pulls torch (a CUDA one) or a numpy 1.x. The three pins
# published as sources only (pure Python) are built here into py3-none-any wheels: the box has no internet and
# must not build anything. Then: integrations/a1111/pack_for_device.sh, and install_on_device.sh on the box.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl-a1111 && mkdir .whl-a1111  # exactly this set: whatever is in the folder gets packed
sed 's/#.*//' integrations/a1111/gpu_wheels.txt | while read -r pin; do
  [ -z "$pin" ] && continue
  pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl-a1111 "$pin" 2>/dev/null \
    || pip wheel --quiet --no-deps --no-binary=:all: -w .whl-a1111 "$pin" \
    || { echo "MISSING $pin"; exit 1; }
done
ls .whl-a1111 | grep -vE 'cp312-cp312|-abi3-|-none-any\.whl$' && { echo "not for CPython 3.12 (above)"; exit 1; }
echo "$(ls .whl-a1111/*.whl | wc -l) wheels, $(du -sm .whl-a1111 | cut -f1) MiB in .whl-a1111"
