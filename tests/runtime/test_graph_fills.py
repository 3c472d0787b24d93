"""memset_fill's rewrite of a captured graph, without a GPU: which memsets become fills and with what word, the
driver structures' layouts, the order of the rewrite's driver calls, and the fill kernel's PTX assembling for the
GPUs it targets. tests/runtime/test_graph_fills_gpu.py runs it on one."""

import collections
import ctypes
import importlib.util
import random
import subprocess

import pytest

from gpt2ladder.runtime import graph_fills
from gpt2ladder.runtime.graph_fills import FILL_PTX, MAX_BYTES, Fill, Memset, fill_for


def stored_bytes(fill: Fill) -> bytes:
    """What the fill kernel writes: its word, little-endian, `count` times."""
    return fill.word.to_bytes(4, "little") * fill.count


def memset_bytes(m: Memset) -> bytes:
    """What cudaMemsetAsync writes: each element the low `element_size` bytes of `value`, little-endian."""
    element = (m.value & ((1 << (8 * m.element_size)) - 1)).to_bytes(m.element_size, "little")
    return element * (m.width * m.height)


def test_cublas_four_zero_bytes_become_one_word():
    fill = fill_for(Memset(dst=0x7F0000001000, pitch=4, value=0, element_size=1, width=4, height=1))
    assert fill == Fill(0x7F0000001000, 0, 1) and fill.blocks == 1


@pytest.mark.parametrize("element_size,value,word", [(1, 0xAB, 0xABABABAB), (1, 0x1FF, 0xFFFFFFFF),
                                                      (2, 0x1234, 0x12341234), (4, 0x89ABCDEF, 0x89ABCDEF)])
def test_the_word_repeats_the_element(element_size, value, word):
    fill = fill_for(Memset(0x1000, 0, value, element_size, 16 // element_size, 1))
    assert fill.word == word and fill.count == 4


def test_random_memsets_store_the_same_bytes_as_their_fills():
    rng = random.Random(0)
    accepted = 0
    for _ in range(2000):
        size = rng.choice((1, 2, 4))
        m = Memset(dst=rng.choice((0x1000, 0x1002, 0x1004, 0x1001)), pitch=0, value=rng.getrandbits(32),
                   element_size=size, width=rng.randint(1, 600), height=1)
        fill = fill_for(m)
        whole_words = (m.width * size) % 4 == 0 and m.dst % 4 == 0
        assert (fill is not None) == whole_words
        if fill is not None:
            accepted += 1
            assert fill.dst == m.dst and stored_bytes(fill) == memset_bytes(m)
            assert fill.blocks * graph_fills.THREADS >= fill.count > (fill.blocks - 1) * graph_fills.THREADS
    assert accepted > 200


def test_what_stays_a_memset():
    assert fill_for(Memset(0x1000, 0, 0, 1, 6, 1)) is None  # not whole words
    assert fill_for(Memset(0x1002, 0, 0, 2, 2, 1)) is None  # not aligned to a word
    assert fill_for(Memset(0x1000, 64, 0, 4, 8, 4)) is None  # rows with gaps between them
    assert fill_for(Memset(0x1000, 0, 0, 4, MAX_BYTES // 4 + 1, 1)) is None  # large: left to the copy engine
    assert fill_for(Memset(0x1000, 0, 0, 4, MAX_BYTES // 4, 1)).count == MAX_BYTES // 4
    assert fill_for(Memset(0x1000, 32, 7, 4, 8, 3)) == Fill(0x1000, 7, 24)  # rows back to back: one span
    assert fill_for(Memset(0x1000, 0, 0, 3, 4, 1)) is None and fill_for(Memset(0x1000, 0, 0, 4, 0, 1)) is None
    assert fill_for(Memset(0x1000, 16, 0, 4, 4, 0)) is None  # no rows: nothing a kernel of no blocks could store


def test_the_driver_structures_have_cuda_h_layouts():
    """CUDA_MEMSET_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS_v2 and CUgraphEdgeData on a 64-bit platform: the driver
    reads these bytes."""
    m, k, e = graph_fills._MemsetParams, graph_fills._KernelParams, graph_fills._EdgeData
    assert ctypes.sizeof(m) == 40 and [getattr(m, f).offset for f in ("dst", "pitch", "value", "elementSize",
                                                                       "width", "height")] == [0, 8, 16, 20, 24, 32]
    assert ctypes.sizeof(k) == 72 and k.gridDimX.offset == 8 and k.sharedMemBytes.offset == 32
    assert k.kernelParams.offset == 40 and k.extra.offset == 48 and k.kern.offset == 56 and k.ctx.offset == 64
    assert ctypes.sizeof(e) == 8 and e.type.offset == 2


class FakeDriver:
    """A graph as lists of nodes and edges; records every call, so the test can see queries end before edits."""

    def __init__(self, nodes, edges, special=()):
        self.types = dict(nodes)  # node -> "kernel" or a Memset
        self.edges = set(edges)
        self.special = set(special)  # edges with data of their own (a programmatic launch, say)
        self.calls = []
        self.added = 0

    def nodes(self, graph):
        self.calls.append("query")
        return list(self.types)

    def node_type(self, node):
        self.calls.append("query")
        kind = self.types[node]
        return graph_fills.NODE_TYPE_MEMSET if isinstance(kind, Memset) else 10 if kind == "alloc" else 0

    def kernel_name(self, node):  # "k:NAME" is a kernel with a name; a plain "kernel" one the driver cannot name
        self.calls.append("query")
        kind = self.types[node]
        return kind[2:] if isinstance(kind, str) and kind.startswith("k:") else None

    def fill_function(self):
        self.calls.append("load")

    def memset(self, node):
        self.calls.append("query")
        return self.types[node]

    def dependencies(self, node):
        self.calls.append("query")
        edges = [(a, b) for a, b in self.edges if b == node]
        return sorted(a for a, _ in edges), not self.special & set(edges)

    def dependents(self, node):
        self.calls.append("query")
        edges = [(a, b) for a, b in self.edges if a == node]
        return sorted(b for _, b in edges), not self.special & set(edges)

    def exists(self, *nodes):
        if missing := [n for n in nodes if n not in self.types]:
            raise RuntimeError(f"CUDA_ERROR_INVALID_VALUE: no node {missing}")  # as the driver answers

    def add_fill(self, graph, fill, dependencies):
        self.calls.append("edit")
        self.exists(*dependencies)
        self.added += 1
        node = 100 + self.added
        self.types[node] = fill
        self.edges |= {(d, node) for d in dependencies}
        return ctypes.c_void_p(node)

    def connect(self, graph, source, targets):
        self.calls.append("edit")
        self.exists(source.value, *targets)
        self.edges |= {(source.value, t) for t in targets}

    def destroy(self, node):
        self.calls.append("edit")
        del self.types[node]
        self.edges = {(a, b) for a, b in self.edges if node not in (a, b)}


def test_each_memset_is_replaced_in_place_with_its_edges(monkeypatch):
    zero4 = Memset(0x1000, 4, 0, 1, 4, 1)
    big = Memset(0x2000, 0, 0, 4, MAX_BYTES, 1)
    # 1 -> memset 2 -> 3, and 3 -> memset 4 -> {5, 6}; memset 7 is too big to rewrite
    fake = FakeDriver({1: "kernel", 2: zero4, 3: "kernel", 4: zero4, 5: "kernel", 6: "kernel", 7: big},
                      {(1, 2), (2, 3), (3, 4), (4, 5), (4, 6), (6, 7)})
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    assert graph_fills.rewrite_memsets(0xABC) == 2
    first, second = sorted(n for n, t in fake.types.items() if isinstance(t, Fill))
    assert fake.edges == {(1, first), (first, 3), (3, second), (second, 5), (second, 6), (6, 7)}
    assert fake.types[7] is big and all(fake.types[n] == Fill(0x1000, 0, 1) for n in (first, second))
    last_query = max(i for i, c in enumerate(fake.calls) if c == "query")
    assert last_query < fake.calls.index("load") < fake.calls.index("edit")  # a refusal leaves the graph untouched


@pytest.mark.parametrize("order", [(1, 2, 3, 4, 5), (5, 4, 3, 2, 1)])
def test_memsets_next_to_each_other_are_replaced_in_either_order(monkeypatch, order):
    """kernel 1 -> memset 2 -> memset 3 -> memset 4 -> kernel 5, the graph's nodes listed either way round: each
    fill takes its neighbour's place, whichever was replaced first."""
    zero4 = Memset(0x1000, 4, 0, 1, 4, 1)
    nodes = {1: "kernel", 2: zero4, 3: zero4, 4: zero4, 5: "kernel"}
    fake = FakeDriver({n: nodes[n] for n in order}, {(1, 2), (2, 3), (3, 4), (4, 5)})
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    assert graph_fills.rewrite_memsets(0xABC) == 3
    chain, node = [1], 1
    while nexts := [b for a, b in fake.edges if a == node]:
        (node,) = nexts
        chain.append(node)
    assert len(chain) == 5 and chain[-1] == 5 and all(isinstance(fake.types[n], Fill) for n in chain[1:4])
    assert len(fake.edges) == 4


def reach(edges) -> dict:
    """node -> every node after it."""
    after = collections.defaultdict(set)
    for a, b in edges:
        after[a].add(b)
    out = {}
    for start in list(after):
        seen, todo = set(), [start]
        while todo:
            for n in after[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        out[start] = seen
    return out


def may_be_cublas(kind) -> bool:
    return not (isinstance(kind, str) and kind.startswith("k:") and not graph_fills.MAY_BE_CUBLAS.search(kind[2:]))


@pytest.mark.parametrize("beside", [False, True])
@pytest.mark.parametrize("seed", range(25))
def test_every_order_a_fill_needs_is_kept(monkeypatch, seed, beside):
    """A random chain of cuBLAS kernels, other kernels, kernels without a name and memsets (some side by side), with a
    second stream joining it. After the rewrite every original node still precedes every node it preceded; each fill
    still precedes all its memset preceded, and follows every node its memset followed that may be cuBLAS's (in
    place: every node). Beside, some fill starts earlier than its memset did."""
    rng = random.Random(seed)
    kinds = ["k:nvjet_sm90_tst_256x128", "k:triton_poi_fused_add", "k:triton_red_fused_sum", "kernel",
             "k:void cublasLt::splitKreduce_kernel", "k:_gelu_grad_kernel", "memset"]
    chain = ["k:nvjet_sm90_tss", "k:_add_norm_fwd_kernel", "k:triton_poi_fused", "memset", "k:nvjet_sm90_qqtst"]
    chain += [rng.choice(kinds) for _ in range(40)]
    nodes = {i: Memset(0x10000 + 64 * i, 4, 0, 1, 4, 1) if kind == "memset" else kind for i, kind in enumerate(chain)}
    edges = {(i, i + 1) for i in range(len(chain) - 1)}
    nodes[100] = "k:ncclDevKernel_AllReduce"  # a second stream's kernel joining the chain
    edges |= {(7, 100), (100, 30)}
    before = reach(edges)
    fake = FakeDriver(dict(nodes), set(edges))
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    memsets = {n for n, kind in nodes.items() if isinstance(kind, Memset)}
    assert graph_fills.rewrite_memsets(0xABC, beside=beside) == len(memsets)
    fill_of = {m: next(n for n, kind in fake.types.items() if isinstance(kind, Fill) and kind.dst == nodes[m].dst)
               for m in memsets}
    after = reach(fake.edges)
    moved = 0
    for u, later in before.items():
        for v in later:
            if u in memsets and v in memsets:
                assert fill_of[v] in after.get(fill_of[u], set())
            elif u in memsets:
                assert v in after.get(fill_of[u], set())
            elif v in memsets:
                follows = fill_of[v] in after.get(u, set())
                assert follows or (beside and not may_be_cublas(nodes[u])), (u, v)
                moved += not follows
            else:
                assert v in after.get(u, set())
    assert (moved > 0) == beside
    assert len(fake.edges) < 3 * len(edges)


def test_a_memset_with_an_edge_of_its_own_kind_stays(monkeypatch):
    zero4 = Memset(0x1000, 4, 0, 1, 4, 1)
    fake = FakeDriver({1: "kernel", 2: zero4, 3: "kernel", 4: zero4, 5: "kernel"},
                      {(1, 2), (2, 3), (3, 4), (4, 5)}, special={(4, 5)})
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    assert graph_fills.rewrite_memsets(0xABC) == 1 and fake.types[4] is zero4 and 2 not in fake.types


def test_a_refused_query_leaves_the_graph_untouched(monkeypatch):
    zero4 = Memset(0x1000, 4, 0, 1, 4, 1)
    fake = FakeDriver({1: "kernel", 2: zero4, 3: "kernel", 4: zero4, 5: "kernel"}, {(1, 2), (2, 3), (3, 4), (4, 5)})

    def refused(node):
        if node == 4:
            raise RuntimeError("cuGraphNodeGetDependentNodes_v2 failed: CUDA_ERROR_INVALID_VALUE")
        return FakeDriver.dependents(fake, node)

    fake.dependents = refused
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    with pytest.raises(graph_fills.Untouched, match="CUDA_ERROR_INVALID_VALUE"):
        graph_fills.rewrite_memsets(0xABC)
    assert "edit" not in fake.calls and fake.types[2] is zero4


def test_a_graph_that_allocates_is_left_untouched(monkeypatch):
    """The driver removes no node of a graph with allocation nodes (PyTorch's cudaMallocAsync backend makes them)."""
    fake = FakeDriver({1: "alloc", 2: Memset(0x1000, 4, 0, 1, 4, 1), 3: "kernel"}, {(1, 2), (2, 3)})
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    with pytest.raises(graph_fills.Untouched, match="allocates memory"):
        graph_fills.rewrite_memsets(0xABC)
    assert "edit" not in fake.calls


def test_a_fill_kernel_that_does_not_load_leaves_the_graph_untouched(monkeypatch):
    fake = FakeDriver({1: "kernel", 2: Memset(0x1000, 4, 0, 1, 4, 1), 3: "kernel"}, {(1, 2), (2, 3)})

    def no_jit():
        raise RuntimeError("cuModuleLoadData failed: CUDA_ERROR_JIT_COMPILER_NOT_FOUND")

    fake.fill_function = no_jit
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    with pytest.raises(graph_fills.Untouched, match="JIT"):
        graph_fills.rewrite_memsets(0xABC)
    assert "edit" not in fake.calls


def test_a_failed_edit_takes_its_fill_out_again(monkeypatch):
    """A fill kernel left with its dependencies but without the memset's dependents could run beside the matmul
    that reads the bytes: an edit that fails removes it, and the error is not an Untouched (the graph is not)."""
    fake = FakeDriver({1: "kernel", 2: Memset(0x1000, 4, 0, 1, 4, 1), 3: "kernel"}, {(1, 2), (2, 3)})

    def refused(graph, source, targets):
        raise RuntimeError("cuGraphAddDependencies_v2 failed: CUDA_ERROR_INVALID_VALUE")

    fake.connect = refused
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    with pytest.raises(RuntimeError, match="INVALID_VALUE") as raised:
        graph_fills.rewrite_memsets(0xABC)
    assert not isinstance(raised.value, graph_fills.Untouched)
    assert sorted(fake.types) == [1, 2, 3] and fake.edges == {(1, 2), (2, 3)}


class FakeLib:
    """The driver's two edge calls, answering as cuda.h says: CUDA_ERROR_LOSSY_QUERY when asked without room for
    edge data that is not the default; else the count, then the nodes and their data."""

    def __init__(self, edges):
        self.edges = edges  # [(node, type)]

    def _answer(self, node, found, data, count):
        count = ctypes.cast(count, ctypes.POINTER(ctypes.c_size_t))
        if not data and any(kind for _, kind in self.edges):
            return graph_fills.LOSSY_QUERY
        if found is None:
            count[0] = len(self.edges)
            return 0
        found = ctypes.cast(found, ctypes.POINTER(ctypes.c_void_p))
        data = ctypes.cast(data, ctypes.POINTER(graph_fills._EdgeData))
        for i, (n, kind) in enumerate(self.edges[: count[0]]):
            found[i], data[i].type = n, kind
        return 0

    cuGraphNodeGetDependencies_v2 = cuGraphNodeGetDependentNodes_v2 = _answer


@pytest.mark.parametrize("edges,plain", [([], True), ([(7, 0), (8, 0)], True), ([(7, 0), (8, 1)], False)])
def test_edges_and_whether_they_are_plain(edges, plain):
    d = graph_fills._Driver.__new__(graph_fills._Driver)
    d.lib = FakeLib(edges)
    found, all_plain = d.dependencies(5)
    assert all_plain == plain and found == ([n for n, _ in edges] if plain else [])


def test_a_graph_without_memsets_is_left_alone(monkeypatch):
    fake = FakeDriver({1: "kernel", 2: "kernel"}, {(1, 2)})
    monkeypatch.setattr(graph_fills, "driver", lambda: fake)
    assert graph_fills.rewrite_memsets(0xABC) == 0 and "edit" not in fake.calls


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package's ptxas")
@pytest.mark.parametrize("capability", [80, 90, 120])
def test_the_fill_kernel_assembles(capability, tmp_path):
    """The PTX the driver compiles at run time, assembled here by the ptxas that Triton carries."""
    from triton.backends.nvidia.compiler import get_ptxas

    source = tmp_path / "fill.ptx"
    source.write_text(FILL_PTX)
    out = tmp_path / "fill.cubin"
    subprocess.run([get_ptxas(capability).path, f"--gpu-name=sm_{capability}", str(source), "-o", str(out)],
                   check=True, capture_output=True)
    assert out.stat().st_size > 500 and graph_fills.KERNEL_NAME.encode() in out.read_bytes()
