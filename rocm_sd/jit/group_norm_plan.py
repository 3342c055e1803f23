"""The GroupNorm launcher of hip/group_norm/ in Python (plans.py says why a mirror): group_norm.hip's check, choose,
workspace_bytes and describe; group_norm_split.hip's make_plan and split_launch (stats, finalize, apply: NCHW chunks,
NCHW planes, NHWC); group_norm_resident.hip's and group_norm_resident_nhwc.hip's resident_plan, workspace and launch.
tests/test_jit_plans.py compares it with the C++.

Device facts: multiprocessors and L2 size (make_plan), and, for the resident path with an exchange between blocks
only, how many of its blocks fit on the device at once (least_resident_blocks in rocm_sd/group_norm/impl.h): the
caller passes `capacity(layout, dtype, vec, threads)`, which the backend answers from the driver's occupancy query on
the runtime-compiled kernels (0 when it cannot tell: the path is then refused, as in C++). The automatic path never
needs it: it takes the resident kernels only where one block holds a group (NCHW) or an image (NHWC), and there the
C++ decision does not depend on the occupancy either."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .plans import F32, NCHW, TWO_31, Launch, Memset, ceil_div, elem_bytes, widest_vec
from .sources import DTYPE_NAMES, TYPES

AUTOMATIC, RESIDENT, SPLIT = 0, 1, 2  # rsd::GroupNormPath
WELFORD_BYTES = 12  # sizeof(WelfordStats): count, mean, M2
FLOAT2_BYTES = 8
UNSIGNED_BYTES = 4
CANNOT_HOLD = "the resident GroupNorm path cannot hold a group of this size and layout on this device"

# rocm_sd/group_norm/impl.h
MAX_THREADS_NHWC = 1024
CHUNK_THREADS = 256        # kChunkThreads
CHUNK_BYTES_PER_THREAD = 64
STREAMING_BYTES = 32 << 20  # streaming_output
# group_norm_split.hip
THREADS = 256
UNROLL = 4
BYTES_IN_FLIGHT = 64
CHUNK_ELEMS = 16384
MIN_BLOCKS_PER_SM = 2
BLOCKS_PER_SM_NHWC = 4
PLANE_MIN = 2048
FINALIZE_THREADS = 256
# group_norm_resident.hip / group_norm_resident_nhwc.hip
MIN_FREE_FRACTION = 2
RESIDENT_NHWC_MAX_THREADS = 512
RESIDENT_NHWC_TARGET_THREADS = 256
RESIDENT_NHWC_BYTES_PER_THREAD = 64

Capacity = Callable[[int, int, int, int], int]  # (layout, dtype, vec, threads) -> resident blocks on the device


@dataclass(frozen=True)
class Args:
    """rsd::GroupNormArgs (rocm_sd/group_norm/api.h), less the stream and device."""
    x: int
    y: int
    gamma: int
    beta: int
    dtype: int
    param_dtype: int
    layout: int
    n: int
    c: int
    hw: int
    groups: int
    eps: float
    silu: bool
    workspace: int = 0
    path: int = AUTOMATIC
    input_bias: int = 0


@dataclass(frozen=True)
class Facts:
    multiprocessors: int
    l2_bytes: int


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def tensor_bytes(a: Args) -> int:
    return a.n * a.c * a.hw * elem_bytes(a.dtype)


def pick_vec(a: Args) -> int:
    """gn::pick_vec: the widest access within one channel (NCHW) or one group (NHWC)."""
    return widest_vec(a.dtype, a.hw if a.layout == NCHW else a.c // a.groups, (a.x, a.y))


def streaming_output(a: Args) -> bool:
    return tensor_bytes(a) > STREAMING_BYTES


def check(a: Args) -> str:
    """group_norm_check (group_norm.hip)."""
    if a.n <= 0 or a.c <= 0 or a.hw <= 0:
        return "empty tensor"
    if a.groups <= 0 or a.c % a.groups != 0:
        return "channels must be divisible by groups"
    if a.param_dtype != a.dtype and a.param_dtype != F32:
        return "weight/bias dtype must be the input's or float32"
    eb = elem_bytes(a.dtype)
    if a.x % eb or a.y % eb:
        return "misaligned data pointer"
    if (a.c // a.groups) * a.hw >= TWO_31:
        return "a group holds 2^31 or more elements"
    if a.hw >= TWO_31:
        return "spatial size of 2^31 or more"
    if a.layout == NCHW:
        if a.n * a.groups > 65535:
            return "batch * groups exceeds 65535"
    else:
        if a.n > 65535:
            return "batch exceeds 65535"
        if a.c // pick_vec(a) > MAX_THREADS_NHWC:
            return "channels_last with C / vector width > 1024"
    return ""


# ---- the split path (group_norm_split.hip) ------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitPlan:
    """gn::Plan of group_norm_split.hip."""
    vec: int
    threads: int
    threads_per_row: int
    rows_per_iter: int
    chunk: int
    splits: int
    partial_count: int
    planes: bool
    plane_chunk: int
    plane_splits: int
    streaming: bool
    groups_per_vec: int


def nhwc_unroll(vec_bytes: int, max_threads: int) -> int:
    return BYTES_IN_FLIGHT // vec_bytes if max_threads <= 512 and BYTES_IN_FLIGHT // vec_bytes > UNROLL else UNROLL


def nhwc_max_threads(threads: int) -> int:
    return 512 if threads <= 512 else 1024


def pick_nhwc_vec(a: Args) -> tuple[int, int]:
    """pick_nhwc_vec: (vec, groups_per_vec); a vector spans two groups where a group is narrower than 16 bytes."""
    cg = a.c // a.groups
    eb = elem_bytes(a.dtype)
    vec = pick_vec(a)
    wider = 2 * cg
    if vec == cg and wider * eb <= 16 and a.c % wider == 0 and a.c // wider <= 512 and a.x % (wider * eb) == 0 \
            and a.y % (wider * eb) == 0:
        return wider, 2
    return vec, 1


def split_plan(a: Args, facts: Facts) -> SplitPlan:
    """make_plan (group_norm_split.hip)."""
    vec, groups_per_vec = pick_vec(a), 1
    threads, threads_per_row, rows_per_iter = THREADS, 0, 0
    planes, plane_chunk, plane_splits = False, 0, 0
    ng = a.n * a.groups
    sms = facts.multiprocessors
    want_blocks = MIN_BLOCKS_PER_SM * sms
    if a.layout == NCHW:
        length = (a.c // a.groups) * a.hw
        max_splits = max(1, length // (vec * THREADS))
        splits = ceil_div(length, CHUNK_ELEMS)
        if ng * splits < want_blocks:
            splits = ceil_div(want_blocks, ng)
        splits = max(1, min(splits, max_splits))
        chunk = ceil_div(ceil_div(length, splits), vec) * vec
        splits = ceil_div(length, chunk)
        planes = a.hw >= PLANE_MIN and a.n * a.c <= 65535 and tensor_bytes(a) > facts.l2_bytes
        if planes:
            plane_splits = ceil_div(a.hw, CHUNK_ELEMS)
            plane_chunk = ceil_div(ceil_div(a.hw, plane_splits), vec) * vec
            plane_splits = ceil_div(a.hw, plane_chunk)
    else:
        vec, groups_per_vec = pick_nhwc_vec(a)
        threads_per_row = a.c // vec
        rows_per_iter = max(1, THREADS // threads_per_row)
        threads = threads_per_row * rows_per_iter
        round_rows = rows_per_iter * nhwc_unroll(vec * elem_bytes(a.dtype), nhwc_max_threads(threads))
        splits = min(ceil_div(BLOCKS_PER_SM_NHWC * sms, a.n), ceil_div(a.hw, round_rows))
        if 2 * a.n * ceil_div(a.hw, round_rows) < sms:
            splits = ceil_div(MIN_BLOCKS_PER_SM * sms, a.n)
        splits = max(1, min(splits, ceil_div(a.hw, rows_per_iter)))
        chunk = ceil_div(ceil_div(a.hw, splits), rows_per_iter) * rows_per_iter
        splits = ceil_div(a.hw, chunk)
    return SplitPlan(vec, threads, threads_per_row, rows_per_iter, chunk, splits, ng * splits, planes, plane_chunk,
                     plane_splits, streaming_output(a), groups_per_vec)


def split_workspace_bytes(a: Args, p: SplitPlan) -> int:
    return _round_up(p.partial_count * WELFORD_BYTES, 256) + a.n * a.groups * FLOAT2_BYTES


def split_launches(a: Args, p: SplitPlan) -> list[Launch]:
    """split_launch: stats, finalize (unless every NCHW group is one block), apply."""
    t = TYPES[a.dtype]
    unit = f"group_norm_{'nchw' if a.layout == NCHW else 'nhwc'}_{DTYPE_NAMES[a.dtype]}"
    ng = a.n * a.groups
    cg = a.c // a.groups
    partials = a.workspace
    mean_rstd = a.workspace + _round_up(p.partial_count * WELFORD_BYTES, 256)
    vec = p.vec
    out = []
    single_block_groups = a.layout == NCHW and p.splits == 1
    if a.layout == NCHW:
        out.append(Launch(unit, f"rsd::gn::group_norm_stats_nchw<{t}, {vec}>", (p.splits, ng, 1), "pqqppfpdii",
                          (a.x, cg * a.hw, p.chunk, partials, mean_rstd if single_block_groups else 0, a.eps,
                           a.input_bias, a.hw, cg, a.groups)))
    else:
        if nhwc_max_threads(p.threads) == 1024:
            gpv, max_threads = 1, 1024
        elif p.groups_per_vec == 1:
            gpv, max_threads = 1, 512
        else:
            gpv, max_threads = (2 if vec >= 2 else 1), 512
        out.append(Launch(unit, f"rsd::gn::group_norm_stats_nhwc<{t}, {vec}, {gpv}, {max_threads}>", (p.splits, a.n, 1),
                          "pqiiqiipp", (a.x, a.hw, a.c, a.groups, p.chunk, p.threads_per_row, p.rows_per_iter,
                                        partials, a.input_bias), block=p.threads))
    if not single_block_groups:
        out.append(Launch(unit, "rsd::gn::group_norm_finalize", ng, "pqfp", (partials, p.splits, a.eps, mean_rstd),
                          block=FINALIZE_THREADS))
    params = "float" if a.param_dtype == F32 else t
    silu = "true" if a.silu else "false"
    common = (a.x, a.y, a.gamma, a.beta, mean_rstd)
    if a.layout == NCHW and p.planes:
        out.append(Launch(unit, f"rsd::gn::group_norm_apply_planes<{t}, {params}, {vec}, {silu}>",
                          (p.plane_splits, a.n * a.c, 1), "pppppqiiqbp",
                          (*common, a.hw, a.c, cg, p.plane_chunk, p.streaming, a.input_bias)))
    elif a.layout == NCHW:
        out.append(Launch(unit, f"rsd::gn::group_norm_apply_nchw<{t}, {params}, {vec}, {silu}>", (p.splits, ng, 1),
                          "pppppqdiiqbp", (*common, cg * a.hw, a.hw, cg, a.groups, p.chunk, p.streaming, a.input_bias)))
    else:
        max_threads = 512 if nhwc_max_threads(p.threads) == 512 else 1024
        out.append(Launch(unit, f"rsd::gn::group_norm_apply_nhwc<{t}, {params}, {vec}, {silu}, {max_threads}>",
                          (p.splits, a.n, 1), "pppppqiiqiibp",
                          (*common, a.hw, a.c, a.groups, p.chunk, p.threads_per_row, p.rows_per_iter, p.streaming,
                           a.input_bias), block=p.threads))
    return out


# ---- the resident path (group_norm_resident.hip, group_norm_resident_nhwc.hip) ------------------------------------

@dataclass(frozen=True)
class ResidentPlan:
    """gn::ResidentPlan (rocm_sd/group_norm/impl.h)."""
    vec: int = 1
    blocks_per_group: int = 0
    threads: int = 0
    threads_per_row: int = 0
    rows_per_iter: int = 0
    rows_per_block: int = 0
    blocks_per_image: int = 0
    tickets: bool = True


def chunk_elems(dtype: int) -> int:
    """kChunkElems<T>: the elements a block of the NCHW resident kernel holds."""
    return CHUNK_THREADS * CHUNK_BYTES_PER_THREAD // elem_bytes(dtype)


def resident_loads(dtype: int, vec: int) -> int:
    """kLoads<T, VEC> of group_norm_resident_nhwc.hip: rows a thread holds."""
    return RESIDENT_NHWC_BYTES_PER_THREAD // (vec * elem_bytes(dtype))


def resident_plan(a: Args, capacity: Capacity) -> ResidentPlan | None:
    """resident_plan / resident_nhwc_plan: None where the C++ returns false. `capacity` is asked only where blocks
    exchange statistics (the C++ asks always, and uses the answer only there)."""
    vec = pick_vec(a)
    if a.layout == NCHW:
        blocks_per_group = ceil_div((a.c // a.groups) * a.hw, chunk_elems(a.dtype))
        if blocks_per_group > 1 and blocks_per_group > capacity(a.layout, a.dtype, vec, CHUNK_THREADS) // \
                MIN_FREE_FRACTION:
            return None
        if a.n * a.groups * blocks_per_group > TWO_31:  # grid x and tickets
            return None
        return ResidentPlan(vec=vec, blocks_per_group=blocks_per_group)
    threads_per_row = a.c // vec
    if threads_per_row > RESIDENT_NHWC_MAX_THREADS:
        return None
    rows_per_iter = max(1, RESIDENT_NHWC_TARGET_THREADS // threads_per_row)
    threads = threads_per_row * rows_per_iter
    rows_per_block = rows_per_iter * resident_loads(a.dtype, vec)
    if a.hw > rows_per_block and a.hw // rows_per_block < a.groups:
        rows_per_block = max(1, min(rows_per_block, a.hw // a.groups))
    blocks_per_image = ceil_div(a.hw, rows_per_block)
    tickets = False
    if blocks_per_image > 1:
        free = capacity(a.layout, a.dtype, vec, threads) // MIN_FREE_FRACTION
        if blocks_per_image > free:
            return None
        tickets = a.n * blocks_per_image > free
    if a.n * blocks_per_image > TWO_31:  # grid x and tickets
        return None
    if a.hw * a.c >= TWO_31:  # 32-bit offsets within an image
        return None
    return ResidentPlan(vec, 0, threads, threads_per_row, rows_per_iter, rows_per_block, blocks_per_image, tickets)


def _counter_bytes(a: Args) -> int:
    count = 1 + a.n * a.groups if a.layout == NCHW else 1 + 2 * a.n
    return _round_up(count * UNSIGNED_BYTES, 256)


def _partial_bytes_nhwc(a: Args, p: ResidentPlan) -> int:
    return _round_up(a.n * p.blocks_per_image * a.groups * WELFORD_BYTES, 256)


def exchanges(a: Args, p: ResidentPlan) -> bool:
    """Whether the blocks sharing statistics are more than one (counters to zero, an occupancy to know)."""
    return (p.blocks_per_group if a.layout == NCHW else p.blocks_per_image) > 1


def resident_workspace_bytes(a: Args, p: ResidentPlan) -> int:
    if a.layout == NCHW:
        if p.blocks_per_group == 1:
            return 0
        return _counter_bytes(a) + a.n * a.groups * p.blocks_per_group * WELFORD_BYTES
    return _counter_bytes(a) + _partial_bytes_nhwc(a, p) + a.n * a.groups * FLOAT2_BYTES


def resident_kernels(layout: int, dtype: int, vec: int) -> tuple[str, tuple[str, ...]]:
    """(unit, instances) whose least occupancy sizes the exchange (resident_capacity: params of the input's type
    and float32, SiLU or not)."""
    t = TYPES[dtype]
    kind = "nchw" if layout == NCHW else "nhwc"
    unit = f"group_norm_resident{'' if layout == NCHW else '_nhwc'}_{DTYPE_NAMES[dtype]}"
    return unit, tuple(f"rsd::gn::group_norm_resident_{kind}<{t}, {p}, {vec}, {silu}>"
                       for p in (t, "float") for silu in ("false", "true"))


def resident_launches(a: Args, p: ResidentPlan) -> list[Launch | Memset]:
    """resident_launch / resident_nhwc_launch: the counters zeroed where blocks exchange, then the one kernel."""
    t = TYPES[a.dtype]
    params = "float" if a.param_dtype == F32 else t
    silu = "true" if a.silu else "false"
    counters = _counter_bytes(a)
    out: list[Launch | Memset] = []
    if exchanges(a, p):
        out.append(Memset(a.workspace, counters))
    if a.layout == NCHW:
        cg = a.c // a.groups
        out.append(Launch(f"group_norm_resident_{DTYPE_NAMES[a.dtype]}",
                          f"rsd::gn::group_norm_resident_nchw<{t}, {params}, {p.vec}, {silu}>",
                          a.n * a.groups * p.blocks_per_group, "ppppudiiufpppb",
                          (a.x, a.y, a.gamma, a.beta, cg * a.hw, a.hw, cg, a.groups, p.blocks_per_group, a.eps,
                           a.input_bias, a.workspace + counters, a.workspace, streaming_output(a)),
                          block=CHUNK_THREADS))
        return out
    base = a.workspace
    workspace = (base, base + UNSIGNED_BYTES, base + UNSIGNED_BYTES * (1 + a.n), base + counters,
                 base + counters + _partial_bytes_nhwc(a, p))
    out.append(Launch(f"group_norm_resident_nhwc_{DTYPE_NAMES[a.dtype]}",
                      f"rsd::gn::group_norm_resident_nhwc<{t}, {params}, {p.vec}, {silu}>",
                      a.n * p.blocks_per_image, "ppppqiiiiiubfpw",
                      (a.x, a.y, a.gamma, a.beta, a.hw, a.c, a.groups, p.threads_per_row, p.rows_per_iter,
                       p.rows_per_block, p.blocks_per_image, p.tickets, a.eps, a.input_bias, workspace),
                      block=p.threads))
    return out


# ---- group_norm.hip: the path, workspace, description, launches -----------------------------------------------------

def _unknown_capacity(layout, dtype, vec, threads) -> int:
    return 0


def choose(a: Args, capacity: Capacity) -> tuple[str, ResidentPlan | None]:
    """choose (group_norm.hip): (error, the resident plan, or None for the split path). Automatic takes the resident
    path where one block holds a group (NCHW) or an image (NHWC); a resident plan with an exchange is taken only when
    forced (path=resident), so only then is the occupancy asked."""
    forced = a.path == RESIDENT
    plan = resident_plan(a, capacity if forced else _unknown_capacity) if a.path != SPLIT else None
    if forced and plan is None:
        return CANNOT_HOLD, None
    one_block = plan is not None and (plan.blocks_per_group if a.layout == NCHW else plan.blocks_per_image) == 1
    return "", plan if plan is not None and (forced or one_block) else None


def workspace_bytes(a: Args, facts: Facts, capacity: Capacity) -> int:
    """group_norm_workspace_bytes: 0 where choose fails (and, in the JIT only, where the check does)."""
    if check(a):
        return 0
    why, plan = choose(a, capacity)
    if why:
        return 0
    return resident_workspace_bytes(a, plan) if plan is not None else split_workspace_bytes(a, split_plan(a, facts))


def describe(a: Args, facts: Facts, capacity: Capacity) -> str:
    """group_norm_describe, e.g. "resident vec=8 blocks_per_group=1" or "split vec=4". Unlike the C++ (which
    computes a plan for any arguments), arguments the check refuses are described by its reason."""
    why = check(a)
    if not why:
        why, plan = choose(a, capacity)
    if why:
        return "error: " + why
    if plan is not None and a.layout != NCHW:
        return f"resident vec={plan.vec} blocks_per_image={plan.blocks_per_image}"
    if plan is not None:
        return f"resident vec={plan.vec} blocks_per_group={plan.blocks_per_group}"
    return f"split vec={split_plan(a, facts).vec}"


def launches(a: Args, facts: Facts, capacity: Capacity) -> list[Launch | Memset]:
    """group_norm_forward's work in stream order, for arguments the check passed; raises what the C++ returns."""
    why, plan = choose(a, capacity)
    if why:
        raise RuntimeError(why)
    return resident_launches(a, plan) if plan is not None else split_launches(a, split_plan(a, facts))
