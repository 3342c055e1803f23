"""Where the Composable Kernel headers come from.

    python ck_templates/ck_headers.py find           # prints the include folder in use, or nothing
    python ck_templates/ck_headers.py fetch DEST     # CI: CK's headers from the amd-aiter wheel on PyPI

On ROCm, CK ships with the install (/opt/rocm/include/ck) or comes from a source tree named by
ROCM_SD_CK_ROOT / CK_ROOT. For CI's AMD compile checks, where only PyPI and Debian are reachable, the
headers come from the `amd-aiter` wheel, which carries CK's source tree; its config.h and version.h are
generated here from the .in templates (every optional feature off, as a plain CMake configure leaves them).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile

AITER = "amd-aiter==0.1.7.post2.dev18"
CK_IN_WHEEL = "aiter_meta/3rdparty/composable_kernel/include/"


def find() -> str | None:
    """The include folder holding ck/ck.hpp (with its config.h), or None."""
    candidates = [os.environ.get("ROCM_SD_CK_ROOT"), os.environ.get("CK_ROOT")]
    candidates = [os.path.join(c, "include") for c in candidates if c]
    candidates.append(os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "include"))
    for include in candidates:
        if os.path.exists(os.path.join(include, "ck", "ck.hpp")) and os.path.exists(os.path.join(include, "ck", "config.h")):
            return include
    return None


def _configure(include: str) -> None:
    ck = os.path.join(include, "ck")
    with open(os.path.join(ck, "config.h.in")) as f:
        config = re.sub(r"#cmakedefine (\w+).*", r"/* #undef \1 */", f.read())
    with open(os.path.join(ck, "config.h"), "w") as f:
        f.write(re.sub(r"@\w+@", "", config))
    with open(os.path.join(ck, "version.h.in")) as f:
        version = re.sub(r"@\w+@", "0", f.read()).replace("#cmakedefine", "// ")
    with open(os.path.join(ck, "version.h"), "w") as f:
        f.write(version)


def fetch(dest: str) -> str:
    """CK's include folder under dest (downloaded once; later calls reuse it). Returns dest."""
    include = os.path.join(dest, "include")
    if os.path.exists(os.path.join(include, "ck", "config.h")):
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, AITER], check=True)
        wheel = next(os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(CK_IN_WHEEL) and not name.endswith("/"):
                    target = os.path.join(include, name[len(CK_IN_WHEEL):])
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with z.open(name) as src, open(target, "wb") as out:
                        out.write(src.read())
    _configure(include)
    return dest


if __name__ == "__main__":
    if sys.argv[1:2] == ["fetch"] and len(sys.argv) == 3:
        print(fetch(sys.argv[2]))
    elif sys.argv[1:] == ["find"]:
        print(find() or "")
    else:
        sys.exit(__doc__)
