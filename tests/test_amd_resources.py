"""The instruction counts of .ci/amd_resources.py on a hand-written disassembly in llvm-objdump's layout (the
current-ROCm lane, tests/test_build_rocm.py, reads them from the real code objects): the key loop is the smallest
backward branch's body holding every matrix instruction, and the committed table's counts bound the new ones; and
the committed table's "_kv" attention instances fit two workgroups a CU on gfx90a / gfx942."""
import sys

from tests.test_build_rocm import RESULTS, ROOT, kv_instance_problems

sys.path.insert(0, str(ROOT / ".ci"))
import amd_resources  # noqa: E402


def disassembly(name, body):
    """llvm-objdump -d --no-show-raw-insn --no-leading-addr of one kernel: (mnemonic, branch target index or None)
    per instruction, 4 bytes each from 0x1000."""
    lines = [f"<{name}>:"]
    for i, (op, target) in enumerate(body):
        comment = f"// {0x1000 + 4 * i:012X}: BF800000"
        if target is not None:
            comment += f" <{name}+0x{4 * target:x}>"
        lines.append(f"\t{op} v0, v1{' ' * 20}{comment}")
    return "\n".join(lines + ["\t\t...", ""])


# A prologue, a copy loop (2..4) before the key loop, the key loop (5..15: an inner copy loop 6..8, a branch over
# its second half, two matrix products, a permute), an epilogue with a loop of its own (17..18), and a loop around
# all but the first instruction (1..19), which holds the key loop.
KERNEL = [("s_load_b64", None), ("v_mov_b32", None),
          ("global_load_b128", None), ("ds_store_b128", None), ("s_cbranch_scc1", 2),
          ("s_waitcnt", None), ("global_load_b128", None), ("ds_store_b128", None), ("s_cbranch_execnz", 6),
          ("ds_load_b128", None), ("v_wmma_f32_16x16x16_f16", None), ("s_cbranch_vccz", 14),
          ("ds_bpermute_b32", None), ("v_wmma_f32_16x16x16_f16", None), ("v_add_f32", None), ("s_branch", 5),
          ("v_mul_f32", None), ("global_store_b128", None), ("s_cbranch_scc0", 17), ("s_cbranch_scc1", 1),
          ("s_endpgm", None)]


def test_key_loop_counts():
    counts = amd_resources._counts(disassembly("kern", KERNEL) + disassembly("plain", KERNEL[:5] + [("s_endpgm", None)]))
    kern = counts["kern"]
    assert (kern["instructions"], kern["lds_instructions"], kern["matrix_instructions"]) == (22, 4, 2)  # "..." too
    assert (kern["loop_instructions"], kern["loop_lds_instructions"], kern["loop_matrix_instructions"]) == (11, 3, 2)
    assert (kern["v_wmma"], kern["v_mfma"], kern["load128"]) == (2, 0, 2)
    plain = counts["plain"]  # a loop, but no matrix instruction: no key loop
    assert plain["loop_instructions"] is None and plain["lds_instructions"] == 1


def test_no_key_loop_when_a_product_lies_outside_every_loop():
    body = KERNEL[:-1] + [("v_mfma_f32_16x16x16_f16", None), ("s_endpgm", None)]
    assert amd_resources._counts(disassembly("kern", body))["kern"]["loop_instructions"] is None


def row(name="attention_kernel<f16,64,4,1,64>", **counts):
    base = {"v_mfma": 0, "v_wmma": 32, "matrix_instructions": 32, "loop_matrix_instructions": 32,
            "instructions": 1000, "lds_instructions": 100, "loop_instructions": 500, "loop_lds_instructions": 90}
    return {"name": name, "family": amd_resources.kernel_family(name), "matrix": "v_wmma", **base, **counts}


def test_count_regressions():
    committed = {"gfx1100": [row(), row("old_kernel<1>"), {**row("layer_norm_kernel<f16>"), "loop_instructions": None}]}

    def problems(**counts):
        return amd_resources.count_regressions({"gfx1100": [row(**counts)]}, committed)

    assert problems() == []
    assert problems(instructions=900, lds_instructions=50, loop_instructions=400, loop_lds_instructions=10) == []
    for column in amd_resources.CEILING_COUNTS:
        assert problems(**{column: row()[column] + 1}) == [
            f"gfx1100: attention_kernel<f16,64,4,1,64>: {column} {row()[column]} -> {row()[column] + 1}"]
    for column in amd_resources.EXACT_COUNTS[1:]:
        assert len(problems(**{column: 31})) == 1 and len(problems(**{column: 33})) == 1
    lost = problems(loop_instructions=None, loop_lds_instructions=None, loop_matrix_instructions=None)
    assert lost[0].endswith("no key loop found around its matrix instructions") and len(lost) == 4
    # A kernel the committed table lacks is only checked for its key loop; a column it lacks is not compared.
    assert amd_resources.count_regressions({"gfx1100": [row("new_kernel<1>"), row("old_kernel<1>")]},
                                           {"gfx1100": [{"name": "old_kernel<1>", "instructions": 2000}]}) == []


def test_committed_kv_instances_fit_two_workgroups_a_cu_on_cdna():
    """What tests/test_build_rocm.py checks in a fresh build, in the committed table (hip/attention/attention.hip's
    "_kv" instances: every narrow instance that LDS holds to one wave a SIMD on gfx90a / gfx942 has one)."""
    (path,) = RESULTS.glob("amd-resources-hipcc*.json")
    targets = amd_resources.load(path)["targets"]
    assert sum(k["name"].startswith("attention_kernel<") and k["name"].count(",") == 5 for k in targets["gfx942"]) == 16
    assert not kv_instance_problems(targets), "\n".join(kv_instance_problems(targets))
