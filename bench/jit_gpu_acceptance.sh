#!/usr/bin/env bash
# The runtime-compiled (JIT) backend on a GPU machine, issue 27's acceptance: a fresh venv, rocm_sd installed with
# no GPU compiler (ROCM_SD_GPU=none: no _C, the kernel sources only), no nvcc on PATH; kernels compiled at first use.
#
#   bash bench/jit_gpu_acceptance.sh [STEP...]      (from the repository root; default: every step in order)
#
# Steps (each one command):
#   venv      python -m venv $JIT_VENV seeing the base env's packages (torch, diffusers, pytest), then
#             pip install --no-build-isolation --no-deps . with ROCM_SD_GPU=none (needs scikit-build-core and pybind11
#             in the base env, as docs/building.md says for offline machines); checks the venv's rocm_sd has no _C
#             and ships rocm_sd/_hip
#   info      python -m rocm_sd info: "kernels from runtime-compiled (JIT)", each op "rocm_sd kernel (JIT, ...)"
#   compile   python -m rocm_sd.jit twice, into an empty cache: cold, then cached
#   bench     bench/bench_jit.py: cold / cached / load seconds per unit, a row in bench/results/data/jit-<device>.jsonl
#   covered   the strict GPU tests of every op the JIT covers (expected: all pass)
#   suite     the whole strict GPU suite on the JIT (the failures are listed; the Composable Kernel instances are
#             _C's only, so tests that require them have none to run)
# In the base environment (with _C built for this GPU), not in the venv:
#   bitwise   tests/ops/test_jit_matches_built.py: JIT and _C give identical bits (ROCM_SD_KERNELS=auto)
#   sd15      python -m rocm_sd bench --model sd15 with ROCM_SD_KERNELS=built, then =jit (steady state: the same
#             kernels with the same launches, so the two rows are expected equal within noise)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
JIT_VENV=${JIT_VENV:-/tmp/rocm_sd-jit-venv}
BASE_PYTHON=${BASE_PYTHON:-python}
export ROCM_SD_JIT_CACHE=${ROCM_SD_JIT_CACHE:-/tmp/rocm_sd-jit-cache}
COVERED_TESTS="tests/ops/test_attention.py tests/ops/test_bias_residual.py tests/ops/test_geglu.py
  tests/ops/test_group_norm.py tests/ops/test_layer_norm.py tests/ops/test_parity_shuffle.py
  tests/ops/test_quantize_rows.py tests/ops/test_quantized_outputs.py tests/ops/test_ada_layer_norm.py"

no_compiler_path() {  # PATH where no nvcc is found: a folder holding one is replaced by links to its other programs
  local keep=() dir n=0 shadow
  IFS=: read -ra dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    if [[ -x "$dir/nvcc" ]]; then
      shadow=/tmp/rocm_sd-jit-nonvcc-$((n++))
      rm -rf "$shadow" && mkdir -p "$shadow"
      for f in "$dir"/*; do [[ $(basename "$f") == nvcc ]] || ln -s "$f" "$shadow/"; done
      keep+=("$shadow")
    else
      keep+=("$dir")
    fi
  done
  (IFS=:; echo "${keep[*]}")
}

in_venv() {  # runs a command in the venv, outside the checkout (so `import rocm_sd` is the installed package)
  (cd /tmp && PATH="$JIT_VENV/bin:$(no_compiler_path)" CUDA_HOME= CUDA_PATH= "$@")
}

step_venv() {
  rm -rf "$JIT_VENV"
  # The base env's packages (torch, diffusers, pytest, scikit-build-core) as a plain path, not as a site folder: its
  # .pth files stay unread, so an editable rocm_sd install there cannot shadow the venv's.
  "$BASE_PYTHON" -m venv "$JIT_VENV"
  "$BASE_PYTHON" -c "import site; print('\n'.join(site.getsitepackages()))" \
    > "$("$JIT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_rocm_sd_base.pth"
  (cd "$REPO" && PATH="$JIT_VENV/bin:$(no_compiler_path)" ROCM_SD_GPU=none \
     "$JIT_VENV/bin/pip" install --no-build-isolation --no-deps --force-reinstall .)
  in_venv "$JIT_VENV/bin/python" - <<'EOF'
import shutil, sys
import rocm_sd, rocm_sd._ext as ext
from rocm_sd.jit import sources
print("rocm_sd from", rocm_sd.__file__, "| kernel sources", sources.source_root(), "| nvcc on PATH:", shutil.which("nvcc"))
problems = []
if not rocm_sd.__file__.startswith(sys.prefix):
    problems.append("rocm_sd is not the venv's install (an editable install of the base env shadows it?)")
if ext.BUILT is not None:
    problems.append("the venv's rocm_sd has a _C")
if sources.source_root() is None or sources.source_root().name != "_hip":
    problems.append("the kernel sources were not installed as rocm_sd/_hip")
if shutil.which("nvcc"):
    problems.append("nvcc is on PATH")
sys.exit("venv check failed: " + "; ".join(problems) if problems else 0)
EOF
}

step_info() { in_venv "$JIT_VENV/bin/python" -m rocm_sd info; }

step_compile() {
  rm -rf "$ROCM_SD_JIT_CACHE"
  echo "== cold"; in_venv "$JIT_VENV/bin/python" -m rocm_sd.jit
  echo "== cached"; in_venv "$JIT_VENV/bin/python" -m rocm_sd.jit
}

step_bench() {  # one repeat: 55 cold units take ~150 s each time, and compile times are not noisy at that scale
  in_venv "$JIT_VENV/bin/python" "$REPO/bench/bench_jit.py" --repeats 1 --out-dir "$REPO/bench/results"
}

# The tests import tests.* helpers and read integrations/ and bench/: run them from a copy of the checkout without
# rocm_sd/ and hip/, so that `import rocm_sd` is the venv's install.
tests_copy() {
  local dir=/tmp/rocm_sd-jit-tests
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$REPO" && git ls-files -z | grep -zv -e '^rocm_sd/' -e '^hip/' | tar --null -T - -cf -) | tar -xf - -C "$dir"
  echo "$dir"
}

step_covered() {
  local dir; dir=$(tests_copy)
  (cd "$dir" && PATH="$JIT_VENV/bin:$(no_compiler_path)" ROCM_SD_STRICT=1 \
     "$JIT_VENV/bin/python" -m pytest -m gpu -q -p no:cacheprovider $COVERED_TESTS)
}

step_suite() {
  local dir; dir=$(tests_copy)
  (cd "$dir" && PATH="$JIT_VENV/bin:$(no_compiler_path)" ROCM_SD_STRICT=1 \
     "$JIT_VENV/bin/python" -m pytest -m gpu -q -p no:cacheprovider -rf tests) || true
}

step_bitwise() {
  (cd "$REPO" && ROCM_SD_STRICT=1 ROCM_SD_KERNELS=auto "$BASE_PYTHON" -m pytest -m gpu -q tests/ops/test_jit_matches_built.py)
}

step_sd15() {
  for kernels in built jit; do
    echo "== ROCM_SD_KERNELS=$kernels"
    (cd "$REPO" && ROCM_SD_KERNELS=$kernels "$BASE_PYTHON" -m rocm_sd bench --model sd15 --engines eager,rocm_sd \
       --repeats 5 --out "/tmp/rocm_sd-jit-sd15-$kernels")
  done
}

steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(venv info compile bench covered suite bitwise sd15)
for step in "${steps[@]}"; do
  echo "######## $step"
  "step_$step"
done
