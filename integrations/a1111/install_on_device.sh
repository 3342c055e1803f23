#!/usr/bin/env bash
# On the offline GPU box: reassembles pack_for_device.sh's chunks, unpacks the webui to /tmp/a1111/webui and installs
# the wheels into /tmp/a1site, never into the system's Python (--target; --no-deps: the box's torch and numpy stay).
#   integrations/a1111/install_on_device.sh [CHUNK_DIR]   (default .a1111-pack)
# Then: PYTHONPATH=/tmp/a1site:$PWD python3 integrations/a1111/check_in_a1111.py --webui /tmp/a1111/webui ...
set -euo pipefail
pack=${1:-.a1111-pack}
[ "$(cat "$pack"/a1111.tar.part-* | sha256sum | cut -d' ' -f1)" = "$(cat "$pack"/a1111.tar.sha256)" ] \
  || { echo "chunks incomplete or corrupt: $(ls "$pack" | tr "\n" " ")"; exit 1; }
rm -rf /tmp/a1111 /tmp/a1site && mkdir -p /tmp/a1111
cat "$pack"/a1111.tar.part-* | tar -x -C /tmp/a1111
python3 -m pip install --quiet --no-index --no-deps --target /tmp/a1site /tmp/a1111/.whl-a1111/*.whl
# Python 3.12 has no distutils and gradio 3.41 imports distutils.version. setuptools' stand-in for it (a .pth) works
# from site-packages only, not from PYTHONPATH: where the box's own setuptools does not provide it, this does.
if ! PYTHONPATH=/tmp/a1site python3 -c "import distutils" 2>/dev/null; then
  mkdir /tmp/a1site/distutils
  echo "import setuptools  # its _distutils_hack makes setuptools._distutils sys.modules['distutils']" \
    > /tmp/a1site/distutils/__init__.py
fi
# Fail here rather than in the webui: the box's torch/numpy must be the ones imported, and the webui's stack load.
PYTHONPATH=/tmp/a1site python3 -W ignore -c "
import numpy, torch, torchvision, gradio, cv2, skimage.exposure, scipy.stats, transformers, pytorch_lightning
assert not numpy.__file__.startswith('/tmp/a1site') and not torch.__file__.startswith('/tmp/a1site')
print('a1site ok: torch', torch.__version__, 'numpy', numpy.__version__, 'gradio', gradio.__version__)"
