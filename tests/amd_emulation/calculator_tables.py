"""Regenerates matrix_layouts.json: the operand layouts of the matrix instructions rocm_sd's kernels call, as AMD's
Matrix Instruction Calculator (github.com/ROCm/amd_matrix_instruction_calculator) prints them. The calculator
is not needed by the tests (the JSON is committed); run this only to refresh or extend the tables:

    python tests/amd_emulation/calculator_tables.py PATH/TO/amd_matrix_instruction_calculator [COMMIT] \
        > tests/amd_emulation/matrix_layouts.json

(COMMIT: the calculator's commit, for a copy that is not a git checkout; otherwise it is read from the checkout.)

Each table maps every element of A (M x K), B (K x N) and D (M x N) to the places that hold it, "v<VGPR>{<lane>}"
plus ".[15:0]" / ".[31:16]" for 16-bit halves or ".[7:0]" .. ".[31:24]" for the bytes of 8-bit (FP8) inputs; an
element held by several lanes (RDNA3's replicated inputs) lists them all. matrix_layout_test.cpp's own tables are
compared with these entry by entry (tests/test_amd_emulation.py).
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

# (calculator architecture, instruction, wave size) for each instruction the kernels use
# (hip/include/rocm_sd/attention/wave_mma.h, hip/include/rocm_sd/attention_fp8/wave_mma_fp8.h). The calculator has no
# CDNA4 (gfx950) tables: gfx950's fp8 MFMA is emulated in CDNA3's layout (rsd_emu/amdgcn_matrix.h).
INSTRUCTIONS = [
    ("cdna3", "v_mfma_f32_16x16x16_f16", 64),
    ("cdna3", "v_mfma_f32_16x16x16_bf16", 64),
    ("rdna3", "v_wmma_f32_16x16x16_f16", 32),
    ("rdna3", "v_wmma_f32_16x16x16_bf16", 32),
    ("rdna4", "v_wmma_f32_16x16x16_f16", 32),
    ("rdna4", "v_wmma_f32_16x16x16_bf16", 32),
    ("cdna3", "v_mfma_f32_16x16x32_fp8_fp8", 64),
    ("rdna4", "v_wmma_f32_16x16x16_fp8_fp8", 32),
]


def table(calculator: Path, arch: str, instruction: str, wave: int, matrix: str) -> list[list[str]]:
    out = subprocess.run([sys.executable, str(calculator / "matrix_calculator.py"), "-a", arch, "-i", instruction,
                          "-w", str(wave), f"-{matrix}", "--register-layout", "--csv"],
                         check=True, capture_output=True, text=True).stdout
    rows = list(csv.reader(io.StringIO(out[out.index(f"{matrix}[") :])))
    return [row[1:] for row in rows[1:] if row]


def dumps(source: str, tables: dict[str, dict[str, list[list[str]]]]) -> str:
    """The JSON as committed: one line per matrix row, so that a table reads as the calculator prints it."""
    def matrix(name: str, rows: list[list[str]]) -> str:
        return f'  "{name}": [\n' + ",\n".join("   " + json.dumps(r, separators=(",", ":")) for r in rows) + "\n  ]"

    entries = [' "_source": ' + json.dumps(source)] + [
        f" {json.dumps(key)}: {{\n" + ",\n".join(matrix(m, rows) for m, rows in matrices.items()) + "\n }"
        for key, matrices in tables.items()]
    return "{\n" + ",\n".join(entries) + "\n}\n"


def main() -> None:
    calculator = Path(sys.argv[1])
    commit = sys.argv[2] if len(sys.argv) > 2 else subprocess.run(
        ["git", "-C", str(calculator), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    tables = {f"{arch} {ins}": {m: table(calculator, arch, ins, wave, m) for m in "ABD"}
              for arch, ins, wave in INSTRUCTIONS}
    sys.stdout.write(dumps(f"AMD Matrix Instruction Calculator {commit or '(unknown commit)'}", tables))


if __name__ == "__main__":
    main()
