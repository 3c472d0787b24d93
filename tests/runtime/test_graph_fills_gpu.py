"""memset_fill on a GPU: a captured graph's memsets rewritten as fill kernels store the same bytes in the same order,
and a graphed step with the rung computes exactly the losses it computes without. Skipped without a GPU."""

import ctypes

import pytest
import torch
from gpu_support import GPU, LOSS_ROUNDING, TINY, auto_without, needs_cuda, random_batches

from gpt2ladder.ladder import setup_for
from gpt2ladder.runtime import graph_fills
from gpt2ladder.runtime.engine import Engine

pytestmark = pytest.mark.gpu

WORDS = 1024


def capture(rewrite: bool):
    """Kernels and memsets on one buffer, where each result depends on their order; and one memset too large to
    rewrite. Returns the graph, the buffers, and the memsets before and after the rewrite."""
    lib = graph_fills.driver().lib
    x = torch.zeros(WORDS, dtype=torch.int32, device=GPU)
    big = torch.zeros(graph_fills.MAX_BYTES // 4 + 64, dtype=torch.int32, device=GPU)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        x.add_(5)
        assert lib.cuMemsetD32Async(ctypes.c_uint64(x.data_ptr()), ctypes.c_uint(7), ctypes.c_size_t(512), stream) == 0
        assert lib.cuMemsetD8Async(ctypes.c_uint64(x.data_ptr() + 2048), ctypes.c_ubyte(0xAB), ctypes.c_size_t(1024),
                                   stream) == 0
        x.add_(1)
        assert lib.cuMemsetD32Async(ctypes.c_uint64(big.data_ptr()), ctypes.c_uint(3), ctypes.c_size_t(big.numel()),
                                    stream) == 0
    before = graph_fills.memsets(graph.raw_cuda_graph())
    filled = graph_fills.rewrite_memsets(graph.raw_cuda_graph()) if rewrite else 0
    after = graph_fills.memsets(graph.raw_cuda_graph())
    graph.instantiate()
    return graph, x, big, before, filled, after


@needs_cuda
def test_memsets_become_fills_that_store_the_same_bytes_in_the_same_order():
    plain = capture(rewrite=False)
    graph, x, big, before, filled, after = capture(rewrite=True)
    large = [m for m in before if m.width * m.element_size > graph_fills.MAX_BYTES]
    assert len(before) == 3 and filled == 2 and len(large) == 1 and after == large  # the large one stays a memset
    pattern = torch.tensor([0xABABABAB], dtype=torch.int64).to(torch.int32).item()
    expected = torch.cat([torch.full((512,), 8), torch.full((256,), pattern + 1), torch.full((256,), 6)]).to(GPU)
    for replay in range(2):
        plain[0].replay()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(x, plain[1]) and torch.equal(big, plain[2]) and bool((big == 3).all())
        if replay == 0:
            assert torch.equal(x.to(torch.int64), expected)


@needs_cuda
def test_beside_hangs_a_fill_off_the_last_cublas_kernel_before_it():
    """mm, two elementwise kernels, mm: the second matmul's fill (rewrite_memsets's `beside`)
    waits only for the first matmul,
    the matmul for both; the graph computes what eager PyTorch does, to bf16's rounding."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a, w, w2 = (torch.randn(n, 768, device=GPU, dtype=torch.bfloat16, generator=g) for n in (4096, 768, 768))
    expected = ((a @ w + 1) * 2) @ w2
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        y = torch.mm(a, w)
        y.add_(1)
        y.mul_(2)
        z = torch.mm(y, w2)
    d = graph_fills.driver()
    raw = ctypes.c_void_p(graph.raw_cuda_graph())
    found = len(graph_fills.memsets(graph.raw_cuda_graph()))
    assert graph_fills.rewrite_memsets(graph.raw_cuda_graph(), beside=True) == found
    fills = [n for n in d.nodes(raw) if d.node_type(n) == graph_fills.NODE_TYPE_KERNEL
             and d.kernel_name(n) == graph_fills.KERNEL_NAME]
    anchors = [d.dependencies(n)[0] for n in fills]
    if found == 2:  # cuBLAS zeroed its bytes before each matmul, as on the H200
        assert [] in anchors  # the first, at the graph's start
        (held,) = [a for a in anchors if a]
        assert graph_fills.MAY_BE_CUBLAS.search(d.kernel_name(held[0]))
    graph.instantiate()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(z, expected)  # a fill racing the matmul that reads its bytes would not be close


@needs_cuda
def test_a_step_with_its_memsets_filled_computes_the_same_losses():
    """The rung changes which engine stores a few bytes, nothing else: the losses of five steps agree to the
    rounding of the step's atomic sums (whose order varies run to run, with or without the rung: `LOSS_ROUNDING`;
    on an H200 the fifth losses once differed by 1.1e-4, a relative 1.03e-5), the capture
    rewrote memsets (cuBLAS's, before its matmuls), and none that it could rewrite is left."""
    names = auto_without("memset_fill")
    batches = random_batches(5)
    plain = Engine(TINY, setup_for(names), GPU, seed=0)
    filled = Engine(TINY, setup_for(names + ["memset_fill"]), GPU, seed=0)
    losses = [[engine.step(x, y).item() for x, y in batches] for engine in (plain, filled)]
    assert losses[1] == pytest.approx(losses[0], rel=0, abs=LOSS_ROUNDING)
    assert filled.memsets_filled > 0, "no memset in the captured step: cuBLAS zeroed nothing before its matmuls"
    left = graph_fills.memsets(filled._graph.raw_cuda_graph())
    assert not [m for m in left if graph_fills.fill_for(m) is not None]
