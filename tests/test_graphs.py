"""rocm_sd.graphs.GraphedCall: capture once per signature, replay, and never replay a stale graph."""
import gc

import pytest
import torch
from torch import nn

from rocm_sd import graphs


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x, scale: float = 1.0, *, shift=None):
        y = torch.relu(self.proj(x)) * scale
        return {"y": y if shift is None else y + shift, "mean": y.mean()}


def graphed(module):
    call = graphs.GraphedCall(module.forward, module, "Tiny.forward")
    module.forward = call
    return call


def test_structure_changes_of_watched_models_bump_the_epoch():
    m = Tiny()
    call = graphed(m)  # installs the registration hooks
    call._model_key()  # watches m's modules
    before = graphs._structure_epoch
    nn.Sequential(nn.Linear(2, 2))[0:]  # registrations elsewhere (temporary containers) do not count
    assert graphs._structure_epoch == before
    m.extra = nn.Linear(2, 2)
    assert graphs._structure_epoch == before + 1
    m.proj.register_buffer("scale", torch.ones(1))
    assert graphs._structure_epoch == before + 2
    m.extra = m.extra  # the same module set again (ComfyUI re-applies its object patches on every load)
    m.proj.weight = m.proj.weight
    assert graphs._structure_epoch == before + 2
    m.proj.weight = nn.Parameter(m.proj.weight.detach().clone())
    assert graphs._structure_epoch == before + 3



def test_a_cleared_call_holds_no_weight_of_its_model():
    """revert() clears a model's graphed calls before it brings the original weights back to the GPU, while the patch
    record still holds the calls: weights a cleared call kept for its signatures (the 8-bit ones) would stay allocated
    beside the originals (the fp8 engine's peak at revert in `python -m rocm_sd bench`)."""
    import weakref

    m = Tiny()
    call = graphed(m)
    call._model_key()  # a signature's model part: the call now compares m's weights
    old = weakref.ref(m.proj.weight)
    m.proj.weight = nn.Parameter(m.proj.weight.detach().clone())  # what a revert does: another tensor in its place
    call.clear()
    gc.collect()
    assert old() is None, "a cleared GraphedCall still references a weight its model no longer holds"
    assert call._model_key() == call._model_key()  # and the next call compares the model as it is now

class _FakeGraph:
    def __init__(self, label):
        self.label = label

    def replay(self, tensors):
        return ("replay", self.label)


def _policy_call(monkeypatch):
    """A GraphedCall whose signature is its first argument and whose captures are stand-ins: the
    eviction policy without a GPU (tests below with the mark `gpu` capture for real)."""
    call = graphs.GraphedCall(lambda x: ("eager", x), nn.Linear(2, 2), "policy")
    monkeypatch.setattr(call, "_signature", lambda args, kwargs: ((None, (args[0],), (0,)), [args[0]], None))
    monkeypatch.setattr(call, "_model_key", lambda: (0,))  # the model as captured: the signature's last part
    monkeypatch.setattr(call, "_capture", lambda args, kwargs, leaves, spec: _FakeGraph(args[0]))
    return call


def test_least_recently_used_graph_is_evicted(monkeypatch):
    call = _policy_call(monkeypatch)
    for label in range(graphs.MAX_GRAPHS):
        assert call(label) == ("replay", label)
    assert call(0) == ("replay", 0)  # 0 is now the most recently used; 1 the least
    assert call("new") == ("replay", "new")
    assert list(call.graphs)[0] == (None, (2,), (0,)) and (None, (1,), (0,)) not in call.graphs
    assert call.stats["graphs evicted (least recently used)"] == 1
    assert call.stats["graph captures"] == graphs.MAX_GRAPHS + 1


def test_signatures_that_change_every_call_stop_capturing(monkeypatch):
    call = _policy_call(monkeypatch)
    outs = [call(label) for label in range(graphs.MAX_GRAPHS + 10)]  # never the same twice
    evicted = call.stats["graphs evicted (least recently used)"]
    assert evicted == graphs.THRASH_EVICTIONS
    assert outs[-1] == ("eager", graphs.MAX_GRAPHS + 9)
    assert sum(v for k, v in call.stats.items() if k.startswith("eager: new input signatures too often")) == \
        10 - graphs.THRASH_EVICTIONS
    for _ in range(graphs.THRASH_WINDOW):  # one signature over and over: once the old evictions leave the
        call(3)                            # window it is captured, then replayed
    assert call(3) == ("replay", 3)
    assert call("after") == ("replay", "after")  # and new signatures are captured again


def test_cpu_calls_run_eagerly_and_say_why():
    m = Tiny()
    call = graphed(m)
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = m(x)
    assert torch.equal(out["y"], torch.relu(m.proj(x)))
    assert call.stats == {"eager: no GPU tensor among the inputs": 1}


@pytest.mark.gpu
def test_replay_matches_eager_and_outputs_are_not_aliased():
    m = Tiny().cuda().half()
    eager = Tiny().cuda().half()
    eager.load_state_dict(m.state_dict())
    call = graphed(m)
    with torch.no_grad():
        xs = [torch.randn(8, 16, device="cuda", dtype=torch.half) for _ in range(3)]
        outs = [m(x, 2.0) for x in xs]
        for x, out in zip(xs, outs):  # earlier outputs survive later replays
            expected = eager(x, 2.0)
            assert torch.equal(out["y"], expected["y"]) and torch.equal(out["mean"], expected["mean"])
    assert call.stats["graph captures"] == 1 and call.stats["graph replays"] == 3


@pytest.mark.gpu
def test_buffers_passed_in_place_are_read_and_written_where_they_lie_and_static_outputs_are_the_graphs_own():
    m = Tiny().cuda().half()

    def step(x, *, state, out):  # a caller's state, read by the graph, and a buffer it writes
        out.copy_(torch.relu(m.proj(x)) + state)
        return out.sum(dim=0)

    call = graphs.GraphedCall(step, m, "step", in_place=("state", "out"), static_outputs=True)
    states = [torch.randn(8, 16, device="cuda", dtype=torch.half) for _ in range(2)]
    outs = [torch.empty(8, 16, device="cuda", dtype=torch.half) for _ in range(2)]
    sums = []
    with torch.no_grad():
        for x in [torch.randn(8, 16, device="cuda", dtype=torch.half) for _ in range(3)]:
            for state, out in zip(states, outs):
                state.mul_(0.5)  # changed by the caller between calls: the graph reads it where it lies
                sums.append(call(x, state=state, out=out))
                assert torch.equal(out, torch.relu(m.proj(x)) + state)
                assert torch.equal(sums[-1], out.sum(dim=0))
    assert call.stats["graph captures"] == 2 and call.stats["graph replays"] == 6  # a graph per pair of buffers
    held = {id(t) for graph in call.graphs.values() for t in graph.static_inputs}
    assert all(id(t) in held for t in states + outs)  # the buffers themselves, no copies
    assert sums[0] is sums[2] is sums[4] and sums[1] is sums[3]  # each graph's own output, not a clone


@pytest.mark.gpu
def test_graphs_dropped_leave_nothing_allocated():
    """torch keeps a BLAS workspace per stream a GEMM ran on, for good: warm-up calls on a new stream per capture
    left one allocated after every capture, which no revert() could return."""
    def capture_and_drop():
        m = Tiny().cuda().half()
        call = graphed(m)
        with torch.no_grad():
            m(torch.randn(64, 16, device="cuda", dtype=torch.half))
        assert call.stats["graph captures"] == 1
        del m, call
        gc.collect()

    capture_and_drop()  # what a process pays once: the warm-up and capture streams' workspaces
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        capture_and_drop()
    leaked = torch.cuda.memory_allocated() - before
    assert leaked < 2**20, f"{leaked / 2**20:.1f} MiB still allocated after three graphs were captured and dropped"


@pytest.mark.gpu
def test_the_cycle_collector_is_off_while_capturing_and_as_it_was_after():
    # torch 2.11 no longer collects before a capture: a model and its graphed call (a cycle) left to the collector
    # had their CUDA graph destroyed inside a later capture when the collector ran there, which invalidates it.
    seen = []

    class Watched(Tiny):
        def forward(self, x):
            if torch.cuda.is_current_stream_capturing():
                seen.append(gc.isenabled())
            return super().forward(x)

    m = Watched().cuda()
    call = graphed(m)
    with torch.no_grad():
        m(torch.randn(8, 16, device="cuda"))
    assert call.stats["graph captures"] == 1 and seen == [False] and gc.isenabled()


@pytest.mark.gpu
def test_evicted_graphs_free_their_place_and_the_rest_still_replay_right():
    m = Tiny().cuda()
    call = graphed(m)
    eager = Tiny.forward.__get__(m)
    sizes = list(range(1, graphs.MAX_GRAPHS + 3))  # two more shapes than graphs kept: two evictions
    with torch.no_grad():
        for rows in sizes + sizes[-graphs.MAX_GRAPHS:]:  # then the kept ones again, replayed from the shared pool
            x = torch.randn(rows, 16, device="cuda")
            torch.testing.assert_close(m(x)["y"], eager(x)["y"], msg=f"{rows} rows")
    assert call.stats["graphs evicted (least recently used)"] == 2
    assert call.stats["graph captures"] == len(sizes) and len(call.graphs) == graphs.MAX_GRAPHS


@pytest.mark.gpu
def test_new_shapes_values_and_strides_capture_new_graphs():
    m = Tiny().cuda()
    call = graphed(m)
    with torch.no_grad():
        m(torch.randn(8, 16, device="cuda"))
        m(torch.randn(4, 16, device="cuda"))                 # shape
        m(torch.randn(8, 16, device="cuda"), 3.0)            # a non-tensor argument's value
        m(torch.randn(16, 8, device="cuda").t())             # strides
        m(torch.randn(8, 16, device="cuda"), shift=torch.ones(16, device="cuda"))  # structure
        y = m(torch.ones(4, 16, device="cuda"))["y"]
    assert call.stats["graph captures"] == 5 and call.stats["graph replays"] == 6
    assert call.stats["captured again: the shape, strides, dtype or value of args[0]"] == 2  # shape, strides
    assert call.stats["captured again: the arguments' structure"] == 2  # one argument more; a keyword more
    assert torch.allclose(y, torch.relu(m.proj.weight.sum(1) + m.proj.bias).expand(4, 16))


@pytest.mark.gpu
def test_weight_changes_are_seen():
    m = Tiny().cuda()
    call = graphed(m)
    x = torch.randn(8, 16, device="cuda")
    with torch.no_grad():
        m(x)
        m.proj.weight.copy_(torch.randn(16, 16))           # in place: same storage, the graph reads it
        assert torch.allclose(m(x)["y"], torch.relu(m.proj(x)))
        assert call.stats["graph captures"] == 1
        m.proj.weight.data = torch.randn(16, 16, device="cuda")  # new storage: captured again
        assert torch.allclose(m(x)["y"], torch.relu(m.proj(x)))
        assert call.stats["graph captures"] == 2
        assert call.stats["captured again: the storage of 1 weights (moved or replaced)"] == 1
        previous = m.proj
        m.proj = nn.Linear(16, 16).cuda()                  # new module: captured again
        assert torch.allclose(m(x)["y"], torch.relu(m.proj(x)))
        assert call.stats["graph captures"] == 3
        m.proj = previous                                  # put back as it was: its graph replays
        assert torch.allclose(m(x)["y"], torch.relu(m.proj(x)))
        assert call.stats["graph captures"] == 3
        changed = "captured again: the model's modules, parameters or buffers (one registered or replaced)"
        assert call.stats[changed] == 1


@pytest.mark.gpu
def test_ineligible_calls_run_eagerly():
    m = Tiny().cuda()
    call = graphed(m)
    x = torch.randn(8, 16, device="cuda")
    out = m(x)  # autograd on
    out["y"].sum().backward()
    assert m.proj.weight.grad is not None
    with torch.no_grad():
        m(x, torch.tensor(2.0))  # a CPU tensor argument
    assert call.stats["eager: autograd is on (graphs are captured under torch.no_grad / inference_mode)"] == 1
    assert call.stats["eager: a cpu tensor argument (graphs replay device memory only) at args[1]"] == 1
    assert "graph replays" not in call.stats


@pytest.mark.gpu
def test_calls_that_sync_with_the_host_run_eagerly_without_a_capture():
    class Syncs(nn.Module):
        def forward(self, x):
            return x * float(x.sum())  # .item()-like sync: illegal while capturing

    m = Syncs().cuda()
    call = graphed(m)
    x = torch.ones(4, device="cuda")
    with torch.no_grad():
        assert torch.equal(m(x), x * 4)
        assert torch.equal(m(x), x * 4)
    # the reason names the model code that synchronized, not torch's
    assert any("synchronizes with the host" in key and "test_graphs.py:" in key and "float(x.sum())" in key
               for key in call.stats), call.stats
    assert torch.cuda.get_sync_debug_mode() == 0


@pytest.mark.gpu
def test_arguments_a_call_consumes_are_whole_for_every_warm_up_and_the_eager_fallback():
    class PopsAndSyncs(nn.Module):  # ComfyUI's UNet pops the ControlNet residuals off their lists
        def forward(self, x, residuals: list):
            r = residuals.pop()
            return x * float(r.sum())  # a host sync: the capture fails, the call runs eagerly

    m = PopsAndSyncs().cuda()
    call = graphed(m)
    x, residuals = torch.ones(4, device="cuda"), [torch.full((2,), 1.5, device="cuda")]
    with torch.no_grad():
        out = m(x, residuals)  # warm-ups on copies of the list; the eager call after the failed capture gets it whole
    assert torch.equal(out, x * 3.0) and residuals == []
    assert any("synchronizes with the host" in key for key in call.stats), call.stats


@pytest.mark.gpu
def test_a_failed_capture_leaves_random_ops_working():
    class SyncsInCapture(nn.Module):
        def forward(self, x):
            if torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize()  # invalidates the capture; sync debug mode does not see it
            return x + 1

    m = SyncsInCapture().cuda()
    call = graphed(m)
    x = torch.ones(4, device="cuda")
    with torch.no_grad():
        assert torch.equal(m(x), x + 1)
        assert torch.equal(m(x), x + 1)
    assert any(key.startswith("eager: capture failed") for key in call.stats), call.stats
    torch.randn(8, device="cuda")  # the default generator must not be left mid-capture
    torch.cuda.synchronize()
