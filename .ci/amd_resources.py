"""Per-target kernel resource table of a linked HIP `_C`, read from its code objects (nothing runs).

    python3 .ci/amd_resources.py SO [--out DIR]     (as root, with the sid root of .ci/rocm_toolchain.sh)

The offload bundles in the library's .hip_fatbin section hold one code object per translation unit and target.
For each kernel the code object's metadata (llvm-readelf --notes) gives VGPRs (arch + AGPRs on gfx90a/gfx94x/
gfx950, as the hardware allocates them), AGPRs, SGPRs, spilled registers, scratch (private segment) bytes
per lane, static LDS bytes and the workgroup-size bound; the disassembly (llvm-objdump -d) gives which matrix
instructions it holds (v_mfma: CDNA, v_wmma / v_swmmac: RDNA3/4), how many instructions and LDS instructions it
has, and the same counts for one pass through its key loop (_key_loop: found by the backward branch whose body holds
every matrix instruction). Counts are static (each instruction once), never a time.
Waves per SIMD are computed from the arch's register file, LDS and wave limits as LLVM's AMDGPU backend does
(AMDGPUBaseInfo getNumWavesPerEUWithNumVGPRs, GCNSubtarget getOccupancyWithNumSGPRs,
AMDGPUSubtarget getOccupancyWithWorkGroupSizes), so the number is the compiler's own "Occupancy" remark.

Writes <out>/amd-resources-<toolchain>.json (the table, for tests/test_build_rocm.py) and .md (for people).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import re
import struct
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
TOOLCHAIN = REPO / ".ci" / "rocm_toolchain.sh"
LLVM = "/usr/lib/llvm-21/bin"  # inside the sid root
MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
LOAD128 = {"global_load_dwordx4", "global_load_b128", "buffer_load_dwordx4", "buffer_load_b128"}  # 16-byte loads


class Arch:
    """What bounds waves per SIMD on one target (LLVM AMDGPU subtarget facts)."""

    def __init__(self, wave, vgprs, granule, max_waves, lds_per_cu, lds_per_group, barriers, sgpr_bound):
        self.wave, self.vgprs, self.granule, self.max_waves = wave, vgprs, granule, max_waves
        self.lds_per_cu, self.lds_per_group, self.barriers, self.sgpr_bound = lds_per_cu, lds_per_group, barriers, sgpr_bound


# CDNA: wave64, 512 unified VGPR+AGPR per lane, granule 8, 8 waves/SIMD, 64 KiB LDS per CU (gfx950: 160 KiB),
# SGPRs can bound occupancy. RDNA (workgroup-processor mode): wave32, 4 SIMDs share 128 KiB LDS (64 KiB a
# workgroup), 16 waves/SIMD; 1536 VGPRs per lane and granule 24 on the "1.5x VGPR" parts (gfx1100/1101/1151,
# gfx1200/1201), 1024 and 16 on the others.
CDNA = dict(wave=64, vgprs=512, granule=8, max_waves=8, lds_per_cu=65536, lds_per_group=65536, barriers=16, sgpr_bound=True)
RDNA_15X = dict(wave=32, vgprs=1536, granule=24, max_waves=16, lds_per_cu=131072, lds_per_group=65536, barriers=32,
                sgpr_bound=False)
RDNA = {**RDNA_15X, "vgprs": 1024, "granule": 16}
ARCHS = {
    "gfx90a": Arch(**CDNA), "gfx942": Arch(**CDNA),
    "gfx950": Arch(**{**CDNA, "lds_per_cu": 163840, "lds_per_group": 163840}),
    "gfx1030": Arch(**RDNA), "gfx1100": Arch(**RDNA_15X), "gfx1101": Arch(**RDNA_15X), "gfx1102": Arch(**RDNA),
    "gfx1151": Arch(**RDNA_15X), "gfx1200": Arch(**RDNA_15X), "gfx1201": Arch(**RDNA_15X),
}
MATRIX = {"gfx90a": "v_mfma", "gfx942": "v_mfma", "gfx950": "v_mfma", "gfx1100": "v_wmma", "gfx1101": "v_wmma",
          "gfx1102": "v_wmma", "gfx1151": "v_wmma", "gfx1200": "v_wmma", "gfx1201": "v_wmma"}


def occupancy(arch: str, k: dict) -> tuple[int, str]:
    """Waves per SIMD and what limits them ('vgpr', 'sgpr', 'lds', 'max')."""
    a = ARCHS[arch]
    limits = {"max": a.max_waves}
    if k["vgpr"] >= a.granule:
        limits["vgpr"] = max(1, a.vgprs // (math.ceil(k["vgpr"] / a.granule) * a.granule))
    if a.sgpr_bound:
        s = k["sgpr"]
        limits["sgpr"] = 10 if s <= 80 else 9 if s <= 88 else 8 if s <= 100 else 7
    waves_per_group = math.ceil(k["max_workgroup"] / a.wave)
    groups = a.max_waves * 4 if waves_per_group == 1 else min(a.barriers, a.max_waves * 4 // waves_per_group)
    if k["lds"]:
        groups = min(groups, a.lds_per_cu // k["lds"])
    limits["lds"] = max(1, math.ceil(groups * waves_per_group / 4)) if groups else 0
    waves = min(limits.values())
    return waves, min(limits, key=lambda name: (limits[name], name != "max"))


# ---- code objects out of the shared library ------------------------------------------------------------

def section(path: pathlib.Path, name: str) -> bytes:
    data = path.read_bytes()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    for h in headers:
        start = strtab[4] + h[0]
        if data[start:data.index(b"\0", start)].decode() == name:
            return data[h[4]:h[4] + h[5]]
    raise ValueError(f"{path}: no {name} section")


def bundles(fatbin: bytes):
    """(index, bundle bytes, {target: code object bytes}) of each offload bundle in a .hip_fatbin section."""
    pos, index = fatbin.find(MAGIC), 0
    while pos >= 0:
        count, = struct.unpack_from("<Q", fatbin, pos + len(MAGIC))
        entry, objects, end = pos + len(MAGIC) + 8, {}, pos
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", fatbin, entry)
            triple = fatbin[entry + 24:entry + 24 + id_len].decode()
            entry += 24 + id_len
            objects[triple] = fatbin[pos + offset:pos + offset + size]
            end = max(end, pos + offset + size)
        yield index, fatbin[pos:end], objects
        index += 1
        pos = fatbin.find(MAGIC, end)


def run_in_root(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOOLCHAIN), "exec", "--", *command], capture_output=True, text=True, check=True)


def extract(so: pathlib.Path, workdir: pathlib.Path) -> list[tuple[str, pathlib.Path]]:
    """Writes every bundle (bundle-N.fatbin) and device code object (bundle-N-<arch>.co) into workdir."""
    out = []
    for index, raw, objects in bundles(section(so, ".hip_fatbin")):
        (workdir / f"bundle-{index}.fatbin").write_bytes(raw)
        for triple, blob in objects.items():
            if triple.startswith("hip"):
                arch = triple.rsplit("-", 1)[-1]
                path = workdir / f"bundle-{index}-{arch}.co"
                path.write_bytes(blob)
                out.append((arch, path))
    return out


def listed_targets(workdir: pathlib.Path) -> dict[str, list[str]]:
    """clang-offload-bundler --list of each bundle: the toolchain's own view of which targets it holds."""
    script = (f'for f in "$1"/bundle-*.fatbin; do echo "== $f"; {LLVM}/clang-offload-bundler --list --type=o '
              '--input="$f"; done')
    text = run_in_root(["/bin/sh", "-c", script, "sh", str(workdir)]).stdout
    listing, current = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            current = listing.setdefault(pathlib.Path(line[3:]).name, [])
        elif line.strip():
            current.append(line.strip())
    return listing


def _metadata(notes: str) -> list[dict]:
    """The kernels' scalar fields from llvm-readelf --notes (its YAML; .args are skipped)."""
    kernels, current, in_args = [], None, False
    for line in notes.splitlines():
        m = re.match(r"^  - \.(\w+):\s*(.*)$", line)
        if m:  # a new kernel entry (first key at two spaces + dash)
            current, in_args = {}, m.group(1) == "args"
            kernels.append(current)
            if not in_args:
                current[m.group(1)] = m.group(2).strip()
            continue
        m = re.match(r"^    \.(\w+):\s*(.*)$", line)
        if m and current is not None:
            in_args = m.group(1) == "args"
            if not in_args:
                current[m.group(1)] = m.group(2).strip()
    return kernels


MATRIX_OPS = ("v_mfma", "v_wmma", "v_swmmac")
# The disassembly's counts per kernel (_counts), and those of one pass through its key loop (None: no loop).
COUNTS = ("v_mfma", "v_wmma", "load128", "instructions", "lds_instructions", "matrix_instructions")
LOOP_COUNTS = ("loop_instructions", "loop_lds_instructions", "loop_matrix_instructions")
BRANCH = re.compile(r"^s_(?:c)?branch")
# llvm-objdump's comment after an instruction: "// <address>: <encoding> [<symbol>+0x<offset>]" (the symbol part
# on branches only).
COMMENT = re.compile(r"//\s*([0-9A-Fa-f]+):[^<]*(?:<(.+?)(?:\+0x([0-9a-f]+))?>)?\s*$")


def _key_loop(ops: list[tuple[str, int, int | None]]) -> tuple[int, int] | None:
    """(first, last) index into ops of the kernel's key loop: the smallest loop (a backward branch and its target)
    that holds every matrix instruction of the kernel; None without matrix instructions or such a loop.

    ops: (mnemonic, offset in the kernel or None (objdump's "..." for skipped padding), branch target offset or
    None). A loop's body is the address range from
    a backward branch's target to the branch; the compiler lays the attention kernel's key loop out as one such
    range with the K / V copies (inner loops of their own) and the softmax inside."""
    matrix = [i for i, (op, _, _) in enumerate(ops) if op.startswith(MATRIX_OPS)]
    if not matrix:
        return None
    index = {offset: i for i, (_, offset, _) in enumerate(ops) if offset is not None}
    loops = [(index[target], i) for i, (_, offset, target) in enumerate(ops)
             if target is not None and target <= offset and target in index]
    holding = [(first, last) for first, last in loops if first <= matrix[0] and matrix[-1] <= last]
    return min(holding, key=lambda loop: loop[1] - loop[0]) if holding else None


def _counts(disassembly: str) -> dict[str, dict]:
    """Per kernel: matrix instructions by family, 16-byte global loads, all instructions, LDS instructions (every
    ds_* op: loads, stores, atomics and the LDS-routed lane permutes ds_bpermute / ds_swizzle), and the same three
    counts for one pass through the key loop (_key_loop; None where there is none)."""
    kernels: dict[str, list] = {}
    name, start = None, None
    for line in disassembly.splitlines():
        m = re.match(r"^(?:[0-9a-f]+ )?<(.+)>:$", line)
        if m:
            name, start = m.group(1), None
            kernels[name] = []
            continue
        if name is None or not line.startswith("\t") or not line.strip():
            continue
        op = line.split(None, 1)[0]
        if op == "s_code_end":
            continue
        comment = COMMENT.search(line)
        offset = target = None
        if comment:
            address = int(comment.group(1), 16)
            start = address if start is None else start
            offset = address - start
            if BRANCH.match(op) and comment.group(2) == name:
                target = int(comment.group(3) or "0", 16)
        kernels[name].append((op, offset, target))
    counts = {}
    for name, ops in kernels.items():
        def tally(selected):
            return {"instructions": len(selected), "lds_instructions": sum(op.startswith("ds_") for op in selected),
                    "matrix_instructions": sum(op.startswith(MATRIX_OPS) for op in selected)}
        mnemonics = [op for op, _, _ in ops]
        c = {"v_mfma": sum(op.startswith("v_mfma") for op in mnemonics),
             "v_wmma": sum(op.startswith(("v_wmma", "v_swmmac")) for op in mnemonics),
             "load128": sum(op in LOAD128 for op in mnemonics), **tally(mnemonics)}
        loop = _key_loop(ops)
        body = tally(mnemonics[loop[0]:loop[1] + 1]) if loop else dict.fromkeys(("instructions", "lds_instructions",
                                                                                 "matrix_instructions"))
        c.update({f"loop_{key}": value for key, value in body.items()})
        counts[name] = c
    return counts


def short_name(demangled: str) -> str:
    name = re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", demangled)  # drop the parameter list
    name = re.sub(r"^void ", "", name)  # and a template's return type
    for prefix in ("rsd::", "(anonymous namespace)::", "attn::"):
        name = name.replace(prefix, "")
    return name.replace("__half", "f16").replace("bf16", "bf16").replace(" ", "")


def kernel_family(name: str) -> str:
    base = re.sub(r"<.*", "", name)
    return {"attention_kernel": "attention", "wide_attention_kernel": "attention_wide",
            "attention_fp8_kernel": "attention_fp8"}.get(base, base)


def read_kernels(objects: list[tuple[str, pathlib.Path]], workdir: pathlib.Path) -> dict[str, list[dict]]:
    script = (f'for f in "$1"/*.co; do {LLVM}/llvm-readelf --notes "$f" > "$f.notes"; '
              f'{LLVM}/llvm-objdump -d --no-show-raw-insn --no-leading-addr "$f" > "$f.s"; done')
    run_in_root(["/bin/sh", "-c", script, "sh", str(workdir)])
    per_arch: dict[str, list[dict]] = {}
    mangled = set()
    for arch, path in objects:
        counts = _counts(pathlib.Path(f"{path}.s").read_text())
        for meta in _metadata(pathlib.Path(f"{path}.notes").read_text()):
            name = meta["name"]
            mangled.add(name)
            c = counts.get(name, {**dict.fromkeys(COUNTS, 0), **dict.fromkeys(LOOP_COUNTS)})
            k = {
                "mangled": name, "vgpr": int(meta.get("vgpr_count", 0)), "agpr": int(meta.get("agpr_count", 0)),
                "sgpr": int(meta.get("sgpr_count", 0)), "vgpr_spill": int(meta.get("vgpr_spill_count", 0)),
                "sgpr_spill": int(meta.get("sgpr_spill_count", 0)),
                "scratch": int(meta.get("private_segment_fixed_size", 0)),
                "dynamic_stack": meta.get("uses_dynamic_stack", "false") == "true",
                "lds": int(meta.get("group_segment_fixed_size", 0)), "wave": int(meta.get("wavefront_size", 0)),
                "max_workgroup": int(meta.get("max_flat_workgroup_size", 1024)),
                **{column: c[column] for column in COUNTS + LOOP_COUNTS},
            }
            k["matrix"] = "v_mfma" if k["v_mfma"] else "v_wmma" if k["v_wmma"] else "none"
            if arch in ARCHS:
                k["waves_per_simd"], k["limited_by"] = occupancy(arch, k)
            per_arch.setdefault(arch, []).append(k)
    names = sorted(mangled)
    demangled = subprocess.run([str(TOOLCHAIN), "exec", "--", f"{LLVM}/llvm-cxxfilt"], input="\n".join(names) + "\n",
                               capture_output=True, text=True, check=True).stdout.splitlines()
    pretty = {m: short_name(d) for m, d in zip(names, demangled)}
    for kernels in per_arch.values():
        for k in kernels:
            k["name"] = pretty[k["mangled"]]
            k["family"] = kernel_family(k["name"])
        kernels.sort(key=lambda k: (k["family"], k["name"]))
    return dict(sorted(per_arch.items(), key=lambda item: (len(item[0]), item[0])))


# Counted in the disassembly (_counts). Matrix instructions are a kernel's matrix work, fixed by
# its tile shape: any change is lost or repeated work, or a product moved out of the key loop. The others may fall
# freely (the improvements they are there to show) but not rise: a kernel that grows fails until the table is
# written anew (ROCM_SD_WRITE_RESOURCES=1) and committed, a decision in the diff.
EXACT_COUNTS = ("v_mfma", "v_wmma", "matrix_instructions", "loop_matrix_instructions")
CEILING_COUNTS = ("instructions", "lds_instructions", "loop_instructions", "loop_lds_instructions")


def count_regressions(kernels: dict[str, list[dict]], committed: dict[str, list[dict]]) -> list[str]:
    """What tests/test_build_rocm.py fails on, kernel by kernel against the committed table (arch -> kernels)."""
    problems = []
    for arch, group in kernels.items():
        before = {k["name"]: k for k in committed.get(arch, [])}
        for k in group:
            if k["family"].startswith("attention") and k["matrix"] != "none" and k["loop_instructions"] is None:
                problems.append(f"{arch}: {k['name']}: no key loop found around its matrix instructions")
            old = before.get(k["name"])
            if not old:
                continue
            for column in EXACT_COUNTS + CEILING_COUNTS:
                was, now = old.get(column), k[column]
                if was is None:  # a column the committed table predates
                    continue
                if now is None or (now != was if column in EXACT_COUNTS else now > was):
                    problems.append(f"{arch}: {k['name']}: {column} {was} -> {now}")
    return problems


def toolchain_versions(root: str | None = None) -> dict[str, str]:
    root = root or os.environ.get("ROCM_SD_SID_ROOT") or str(pathlib.Path(
        os.environ.get("ROCM_SD_TOOLCHAIN_CACHE", "/var/cache/rocm_sd-ci")) / "sid-rocm" / "current" / "root")
    versions_file = pathlib.Path(root).resolve().parent / "versions.txt"
    return dict(line.split("=", 1) for line in versions_file.read_text().split())


def toolchain_tag(versions: dict[str, str]) -> str:
    def upstream(v):
        return re.match(r"(?:\d+:)?([0-9.]+)", v).group(1)
    return f"hipcc{upstream(versions['hipcc'])}-clang{upstream(versions['clang-21'])}"


def build_table(so: pathlib.Path, workdir: pathlib.Path, command: str = "") -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    objects = extract(so, workdir)
    versions = toolchain_versions()
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                                text=True).stdout.strip()  # "-dirty": built from uncommitted changes to that commit
    except OSError:
        commit = ""
    return {
        "toolchain": toolchain_tag(versions), "versions": versions,
        "date": datetime.date.today().isoformat(), "commit": commit, "command": command,
        "device": "none: read from the code objects of the linked _C (compile only, nothing ran)",
        "bundles": listed_targets(workdir), "targets": read_kernels(objects, workdir),
    }


def summary(table: dict) -> dict[str, dict]:
    out = {}
    for arch, kernels in table["targets"].items():
        attention = [k for k in kernels if k["family"].startswith("attention")]
        out[arch] = {
            "kernels": len(kernels),
            "spilling": sum(1 for k in kernels if k["scratch"] or k["vgpr_spill"] or k["dynamic_stack"]),
            "sgpr_spilling": sum(1 for k in kernels if k["sgpr_spill"]),
            "max_scratch": max((k["scratch"] for k in kernels), default=0),
            "attention": len(attention),
            "attention_matrix": sorted({k["matrix"] for k in attention}),
            "attention_empty": sum(1 for k in attention if k["vgpr"] == 0),
            "attention_waves": sorted({k.get("waves_per_simd", 0) for k in attention}),
            "max_lds": max((k["lds"] for k in kernels), default=0),
        }
    return out


def markdown(table: dict) -> str:
    lines = [
        f"# AMD kernel resources: {table['toolchain']}",
        "",
        f"Date {table['date']}, commit {table['commit']}, device: {table['device']}.",
        f"Toolchain (Debian sid root, .ci/rocm_toolchain.sh): "
        + ", ".join(f"{k} {v}" for k, v in sorted(table['versions'].items())) + ".",
        f"Command: `{table['command']}`" if table["command"] else "",
        "",
        "VGPR counts AGPRs too where the register file is unified (gfx90a/gfx942/gfx950); scratch is bytes per lane "
        "(a spill or a stack the compiler could not keep in registers); LDS is static bytes per workgroup; waves/SIMD "
        "is the occupancy bound from registers, LDS and workgroup size (LLVM's rules, computed, not measured); "
        "matrix is the matrix instruction family in the kernel's ISA; instructions are counted statically in the "
        "disassembly (each instruction once, however often it runs), LDS instructions are every ds_* op (ds_bpermute "
        "included), and the key loop's counts are those of one pass through the loop body (the smallest loop that holds "
        "every matrix instruction: one key tile; docs/amd.md). Nothing here is a time. No AMD GPU ran any of this.",
        "",
        "| arch | kernels | with scratch / VGPR spills | max scratch B | SGPR spills | attention kernels | "
        "attention matrix | attention empty (0 VGPR) | attention waves/SIMD | max LDS B |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arch, s in summary(table).items():
        lines.append(f"| {arch} | {s['kernels']} | {s['spilling']} | {s['max_scratch']} | {s['sgpr_spilling']} | "
                     f"{s['attention']} | {', '.join(s['attention_matrix'])} | {s['attention_empty']} | "
                     f"{', '.join(map(str, s['attention_waves']))} | {s['max_lds']} |")
    for arch, kernels in table["targets"].items():
        lines += ["", f"## {arch}", "",
                  "Attention instances (every one), then the other kernel families (worst case over their instances; "
                  "every instance is in the .json).", "",
                  "| kernel | VGPR | AGPR | SGPR | VGPR spill | SGPR spill | scratch B | LDS B | waves/SIMD (bound) | "
                  "matrix (count) | instructions | LDS instructions | key loop: instructions / LDS / matrix |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k in kernels:
            if not k["family"].startswith("attention"):
                continue
            count = k["v_mfma"] or k["v_wmma"]
            loop = " / ".join(str(k.get(c)) for c in LOOP_COUNTS) if k.get("loop_instructions") is not None else ""
            lines.append(f"| `{k['name']}` | {k['vgpr']} | {k['agpr']} | {k['sgpr']} | {k['vgpr_spill']} | "
                         f"{k['sgpr_spill']} | {k['scratch']} | {k['lds']} | {k.get('waves_per_simd', '')} "
                         f"({k.get('limited_by', '')}) | {k['matrix']}{f' ({count})' if count else ''} | "
                         f"{k['instructions']} | {k.get('lds_instructions', '')} | {loop} |")
        lines += ["", "| family | instances | max VGPR | max AGPR | max SGPR | with VGPR spills | with SGPR spills | "
                  "max scratch B | max LDS B | min waves/SIMD | matrix |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        families: dict[str, list] = {}
        for k in kernels:
            if not k["family"].startswith("attention"):
                families.setdefault(k["family"], []).append(k)
        for family, group in sorted(families.items()):
            lines.append(
                f"| `{family}` | {len(group)} | {max(k['vgpr'] for k in group)} | {max(k['agpr'] for k in group)} | "
                f"{max(k['sgpr'] for k in group)} | {sum(1 for k in group if k['vgpr_spill'])} | "
                f"{sum(1 for k in group if k['sgpr_spill'])} | {max(k['scratch'] for k in group)} | "
                f"{max(k['lds'] for k in group)} | {min(k.get('waves_per_simd', 0) for k in group)} | "
                f"{', '.join(sorted({k['matrix'] for k in group}))} |")
    return "\n".join(lines) + "\n"


COLUMNS = ["vgpr", "agpr", "sgpr", "vgpr_spill", "sgpr_spill", "scratch", "dynamic_stack", "lds", "max_workgroup",
           "waves_per_simd", "limited_by", "matrix", "v_mfma", "v_wmma", "load128", "instructions", "wave",
           "lds_instructions", "matrix_instructions", "loop_instructions", "loop_lds_instructions",
           "loop_matrix_instructions"]


def dumps(table: dict) -> str:
    """JSON with one line per kernel (a row of COLUMNS under its short name): small, and diffs read well."""
    head = {key: value for key, value in table.items() if key != "targets"}
    parts = ["{", f' "columns": {json.dumps(COLUMNS)},']
    parts += [f" {json.dumps(key)}: {json.dumps(value, sort_keys=True)}," for key, value in sorted(head.items())]
    parts.append(' "targets": {')
    for i, (arch, kernels) in enumerate(table["targets"].items()):
        parts.append(f"  {json.dumps(arch)}: {{")
        for j, k in enumerate(kernels):
            row = json.dumps([k.get(c) for c in COLUMNS])
            parts.append(f"   {json.dumps(k['name'])}: {row}{',' if j + 1 < len(kernels) else ''}")
        parts.append("  }" + ("," if i + 1 < len(table["targets"]) else ""))
    parts += [" }", "}"]
    return "\n".join(parts) + "\n"


def load(path: pathlib.Path) -> dict:
    """A table written by write(), in build_table()'s shape (targets: arch -> list of kernel dicts)."""
    raw = json.loads(pathlib.Path(path).read_text())
    columns = raw.pop("columns")
    raw["targets"] = {arch: [{"name": name, "family": kernel_family(name), **dict(zip(columns, row))}
                             for name, row in kernels.items()]
                      for arch, kernels in raw["targets"].items()}
    return raw


def write(table: dict, out: pathlib.Path, what: str = "") -> tuple[pathlib.Path, pathlib.Path]:
    """amd-resources[-<what>]-<toolchain>.json / .md in `out` (what: "ck" for the Composable Kernel build)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = "-".join(filter(None, ("amd-resources", what, table["toolchain"])))
    json_path, md_path = (out / f"{stem}{suffix}" for suffix in (".json", ".md"))
    json_path.write_text(dumps(table))
    md_path.write_text(markdown(table))
    return json_path, md_path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("so", type=pathlib.Path, help="the linked _C*.so (ROCM_SD_GPU=hip)")
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results")
    parser.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/rocm_sd-amd-resources"))
    args = parser.parse_args(argv)
    table = build_table(args.so.resolve(), args.workdir, command=" ".join(["python3", ".ci/amd_resources.py", *sys.argv[1:]]))
    for path in write(table, args.out):
        print(path)


if __name__ == "__main__":
    main()
