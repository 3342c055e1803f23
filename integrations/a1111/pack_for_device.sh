#!/usr/bin/env bash
# Packs the webui's wheels (.whl-a1111/, from download_gpu_wheels.sh) and a webui checkout (with its repositories/)
# into .a1111-pack/a1111.tar.part-NN, chunks of at most 55 MiB: a device call carries only ~60 MiB, so the chunks
# go over one per call and install_on_device.sh reassembles them there. Plain tar: wheels are compressed already.
#   integrations/a1111/pack_for_device.sh [WEBUI]     (default /var/cache/rocm_sd-a1111/webui)
set -euo pipefail
cd "$(dirname "$0")/../.."
webui=$(realpath "${1:-/var/cache/rocm_sd-a1111/webui}")
rm -rf .a1111-pack && mkdir .a1111-pack
# The webui lands as webui/ whatever its folder is called; no .git or __pycache__ (not needed, only weight).
tar -c --exclude=.git --exclude=__pycache__ .whl-a1111 -C "$(dirname "$webui")" \
    --transform "s,^$(basename "$webui"),webui," "$(basename "$webui")" \
  | split -b 55M -d -a 2 - .a1111-pack/a1111.tar.part-
# Carried along with the last chunk: install_on_device.sh checks that every chunk arrived intact.
cat .a1111-pack/a1111.tar.part-* | sha256sum | cut -d' ' -f1 > .a1111-pack/a1111.tar.sha256
ls -l .a1111-pack
