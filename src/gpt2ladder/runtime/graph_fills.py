"""A captured CUDA graph's small memset nodes rewritten as kernels that store the same bytes.

cuBLAS zeroes a few bytes of its workspace before most of its matmuls (a `cudaMemsetAsync` of 4 bytes), and a
captured step keeps each as a memset node: 128 of them in a step of GPT-2 124M at the top of `auto`. In a trace
the matmul after such a node starts later than a kernel after a kernel does (the rung's record is in
benchmarks/RECORDS.md). A kernel node that stores the same pattern to the same bytes, with the same dependencies,
is the same operation in the graph; this module makes that swap between capture and instantiation, through the CUDA
driver's graph API (libcuda, by ctypes: nothing to install).

Only one-dimensional memsets of whole 32-bit words, at most `MAX_BYTES`, are rewritten; larger ones (a buffer
zeroed for atomic adds) stay memset nodes, which move bytes at the copy rate. The fill kernel is a few lines of PTX
that the driver compiles for the GPU it runs on.
"""

from __future__ import annotations

import ctypes
import re
import sys
from dataclasses import dataclass

MAX_BYTES = 1 << 20  # memsets up to this size become fill kernels
# Kernel names that may be cuBLAS's (or cuBLASLt's), the only kernels that touch its workspace; a name that matches
# by mistake only keeps a fill nearer its matmul, while a cuBLAS kernel it missed could race with the fill.
MAY_BE_CUBLAS = re.compile(r"nvjet|cublas|gemm|gemv|xmma|cutlass|splitk|dot_kernel|reduce_1block|scal_kernel|"
                           r"^(void )?kernel|_z\d+kernel", re.IGNORECASE)
WALK = 256  # kernels looked back through for an anchor before the fill stays where the memset was
THREADS = 256  # per block of the fill kernel, one 32-bit word each
KERNEL_NAME = "gpt2ladder_fill_u32"

# words[i] = value for i < count: one thread a word, any GPU the driver can compile PTX 6.0 for (sm_50 and newer).
FILL_PTX = """\
.version 6.0
.target sm_50
.address_size 64

.visible .entry gpt2ladder_fill_u32(
    .param .u64 dst,
    .param .u32 value,
    .param .u32 count
)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;

    ld.param.u64 %rd1, [dst];
    ld.param.u32 %r1, [value];
    ld.param.u32 %r2, [count];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r3, %r3, %r4, %r5;
    setp.ge.u32 %p, %r3, %r2;
    @%p bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r3, 4;
    add.s64 %rd2, %rd2, %rd3;
    st.global.u32 [%rd2], %r1;
DONE:
    ret;
}
"""

NODE_TYPE_KERNEL = 0  # CU_GRAPH_NODE_TYPE_KERNEL
NODE_TYPE_MEMSET = 2  # CU_GRAPH_NODE_TYPE_MEMSET
NODE_TYPES_MEMORY = (10, 11)  # CU_GRAPH_NODE_TYPE_MEM_ALLOC, _MEM_FREE: their graph's nodes cannot be removed
LOSSY_QUERY = 402  # CUDA_ERROR_LOSSY_QUERY: an edge with data of its own, asked about without room for it


@dataclass(frozen=True)
class Memset:
    """A memset node's parameters (CUDA_MEMSET_NODE_PARAMS): `height` rows of `width` elements of
    `element_size` bytes (1, 2 or 4), rows `pitch` bytes apart, each element set to `value`."""

    dst: int
    pitch: int
    value: int
    element_size: int
    width: int
    height: int


@dataclass(frozen=True)
class Fill:
    """What the fill kernel stores instead: `count` 32-bit words of `word` from `dst`."""

    dst: int
    word: int
    count: int

    @property
    def blocks(self) -> int:
        return -(-self.count // THREADS)


def fill_for(m: Memset, max_bytes: int = MAX_BYTES) -> Fill | None:
    """The fill that stores exactly the bytes this memset does, or None where it is not one (two-dimensional,
    not whole aligned words, or larger than `max_bytes`)."""
    if m.element_size not in (1, 2, 4) or m.width <= 0 or m.height <= 0:
        return None
    rows_are_one_span = m.height == 1 or m.pitch == m.width * m.element_size
    nbytes = m.width * m.element_size * m.height
    if not rows_are_one_span or nbytes % 4 or m.dst % 4 or nbytes > max_bytes:
        return None
    element = m.value & ((1 << (8 * m.element_size)) - 1)
    word = 0
    for shift in range(0, 32, 8 * m.element_size):  # the element repeated across the word, little-endian
        word |= element << shift
    return Fill(m.dst, word, nbytes // 4)


# ctypes mirrors of the driver's structures (cuda.h, CUDA 12.3 and newer)
class _MemsetParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("elementSize", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


class _KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.POINTER(ctypes.c_void_p)),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData: all zero for a plain "after it completes" edge
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


REQUIRED = ("cuGraphGetNodes", "cuGraphNodeGetType", "cuGraphMemsetNodeGetParams", "cuGraphNodeGetDependencies_v2",
            "cuGraphNodeGetDependentNodes_v2", "cuGraphAddKernelNode_v2", "cuGraphAddDependencies_v2",
            "cuGraphDestroyNode", "cuModuleLoadData", "cuModuleGetFunction", "cuCtxGetCurrent")


class _Driver:
    """The few driver calls this needs, by the names CUDA 12.3 and newer headers give them (the _v2 graph calls
    carry each edge's data: a memset is rewritten only where all its edges are plain ones)."""

    def __init__(self):
        self.lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        missing = [name for name in REQUIRED if not hasattr(self.lib, name)]
        if missing:
            raise RuntimeError(f"the CUDA driver lacks {', '.join(missing)}: editing graphs needs a driver for "
                               "CUDA 12.3 or newer")
        self._functions: dict[int, ctypes.c_void_p] = {}  # context -> the fill kernel loaded there

    def __call__(self, name: str, *args) -> None:
        self.check(name, getattr(self.lib, name)(*args))

    def check(self, name: str, result: int) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(text))
            raise RuntimeError(f"{name} failed: {(text.value or b'').decode() or result}")

    def nodes(self, graph) -> list:
        count = ctypes.c_size_t(0)
        self("cuGraphGetNodes", graph, None, ctypes.byref(count))
        nodes = (ctypes.c_void_p * max(count.value, 1))()
        self("cuGraphGetNodes", graph, nodes, ctypes.byref(count))
        return list(nodes)[: count.value]

    def node_type(self, node) -> int:
        kind = ctypes.c_int(-1)
        self("cuGraphNodeGetType", ctypes.c_void_p(node), ctypes.byref(kind))
        return kind.value

    def memset(self, node) -> Memset:
        p = _MemsetParams()
        self("cuGraphMemsetNodeGetParams", ctypes.c_void_p(node), ctypes.byref(p))
        return Memset(p.dst, p.pitch, p.value, p.elementSize, p.width, p.height)

    def _edges(self, name: str, node) -> tuple[list, bool]:
        """The nodes at the other end of a node's edges, and whether every one of those edges is a plain one."""
        count = ctypes.c_size_t(0)
        result = getattr(self.lib, name)(ctypes.c_void_p(node), None, None, ctypes.byref(count))
        if result == LOSSY_QUERY:
            return [], False
        self.check(name, result)
        if count.value == 0:  # the driver refuses an array for no edges
            return [], True
        found, data = (ctypes.c_void_p * count.value)(), (_EdgeData * count.value)()
        self(name, ctypes.c_void_p(node), found, data, ctypes.byref(count))
        n = count.value
        plain = all(bytes(data[i]) == bytes(_EdgeData()) for i in range(n))
        return list(found)[:n], plain

    def kernel_name(self, node) -> str | None:
        """The name of a kernel node's function, or None where the driver cannot say (before CUDA 12.3)."""
        p = _KernelParams()
        name = ctypes.c_char_p()
        try:
            self("cuGraphKernelNodeGetParams_v2", ctypes.c_void_p(node), ctypes.byref(p))
            if p.func:
                self("cuFuncGetName", ctypes.byref(name), ctypes.c_void_p(p.func))
            elif p.kern:
                self("cuKernelGetName", ctypes.byref(name), ctypes.c_void_p(p.kern))
        except (AttributeError, RuntimeError):
            return None
        return name.value.decode(errors="replace") if name.value else None

    def dependencies(self, node) -> tuple[list, bool]:
        return self._edges("cuGraphNodeGetDependencies_v2", node)

    def dependents(self, node) -> tuple[list, bool]:
        return self._edges("cuGraphNodeGetDependentNodes_v2", node)

    def fill_function(self) -> ctypes.c_void_p:
        """The fill kernel, loaded once into the current context (PyTorch's, on the current device)."""
        context = ctypes.c_void_p()
        self("cuCtxGetCurrent", ctypes.byref(context))
        if not context.value:
            raise RuntimeError("no current CUDA context to load the fill kernel into")
        if context.value not in self._functions:
            module, function = ctypes.c_void_p(), ctypes.c_void_p()
            self("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(FILL_PTX.encode()))
            self("cuModuleGetFunction", ctypes.byref(function), module, KERNEL_NAME.encode())
            self._functions[context.value] = function  # the module stays loaded for the process
        return self._functions[context.value]

    def add_fill(self, graph, fill: Fill, dependencies: list) -> ctypes.c_void_p:
        dst, word, count = ctypes.c_uint64(fill.dst), ctypes.c_uint32(fill.word), ctypes.c_uint32(fill.count)
        args = (ctypes.c_void_p * 3)(*(ctypes.addressof(a) for a in (dst, word, count)))
        params = _KernelParams(self.fill_function(), fill.blocks, 1, 1, THREADS, 1, 1, 0,
                               ctypes.cast(args, ctypes.POINTER(ctypes.c_void_p)), None, None, None)
        deps = (ctypes.c_void_p * max(len(dependencies), 1))(*dependencies)
        node = ctypes.c_void_p()
        self("cuGraphAddKernelNode_v2", ctypes.byref(node), graph, deps, ctypes.c_size_t(len(dependencies)),
             ctypes.byref(params))  # the driver copies the arguments: they need not outlive the call
        return node

    def connect(self, graph, source, targets: list) -> None:
        if targets:
            sources = (ctypes.c_void_p * len(targets))(*([source.value] * len(targets)))
            to = (ctypes.c_void_p * len(targets))(*targets)
            self("cuGraphAddDependencies_v2", graph, sources, to, None, ctypes.c_size_t(len(targets)))

    def destroy(self, node) -> None:
        self("cuGraphDestroyNode", ctypes.c_void_p(node))


_DRIVER: _Driver | None = None


def driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER


class Untouched(RuntimeError):
    """The driver refused to describe the graph, which is left as captured."""


def problem() -> str | None:
    """Why graphs cannot be edited on this machine (no CUDA driver, or one too old), or None."""
    try:
        driver()
    except (OSError, RuntimeError) as e:
        return f"editing a captured CUDA graph needs the CUDA driver's graph calls: {str(e).splitlines()[0]}"
    return None


def memsets(graph: int) -> list[Memset]:
    """The memset nodes of a graph (a cudaGraph_t, as `torch.cuda.CUDAGraph.raw_cuda_graph()` returns it)."""
    d = driver()
    g = ctypes.c_void_p(graph)
    return [d.memset(n) for n in d.nodes(g) if d.node_type(n) == NODE_TYPE_MEMSET]


def anchor(d, before: list):
    """For a memset whose dependencies are `before`: the last node up its chain of single dependencies that is not a
    kernel known not to be cuBLAS's (a cuBLAS kernel, an unnamed one, another memset, a node where streams join, the
    graph's first node). Its fill may start once that node is done. None after a join."""
    if len(before) != 1:
        return None
    node = before[0]
    for _ in range(WALK):
        if d.node_type(node) != NODE_TYPE_KERNEL:
            return node
        name = d.kernel_name(node)
        if name is None or MAY_BE_CUBLAS.search(name):
            return node
        deps = d.dependencies(node)[0]
        if len(deps) != 1:
            return node
        node = deps[0]
    return node


def rewrite_memsets(graph: int, max_bytes: int = MAX_BYTES, beside: bool = False) -> int:
    """Replace each memset node of a captured, not yet instantiated graph that `fill_for` accepts by a fill kernel
    node with the same dependencies and dependents. Returns how many were replaced.

    With `beside` a fill depends on its `anchor` instead (the last kernel before it that may be cuBLAS's), so that it
    runs beside the kernels between, and the memset's dependencies are joined to its dependents directly: the matmul
    after it still waits for everything that came before the memset. The step leaves it off (within noise in the
    step: its record is in benchmarks/RECORDS.md); benchmarks/micro/memset_fill.py times both.

    Everything is read, and the fill kernel loaded, before anything changes: a driver that refuses a query leaves the
    graph as it was, and the error is an `Untouched`. A failure while editing (not seen) raises as it is, and the
    graph must not be used.
    """
    d = driver()
    g = ctypes.c_void_p(graph)
    plan = []
    try:
        for node in d.nodes(g):
            kind = d.node_type(node)
            if kind in NODE_TYPES_MEMORY:
                raise RuntimeError("the graph allocates memory in it (cudaMallocAsync), and the driver removes no "
                                   "node of such a graph")
            if kind != NODE_TYPE_MEMSET:
                continue
            fill = fill_for(d.memset(node), max_bytes)
            if fill is None:
                continue
            (before, plain_in), (after, plain_out) = d.dependencies(node), d.dependents(node)
            if plain_in and plain_out:  # an edge with data of its own (a port, a programmatic launch) stays
                held = anchor(d, before) if beside else None
                plan.append((node, fill, before, after, held))
        planned = {entry[0] for entry in plan}
        # Beside only where no neighbour is another memset: the lists read above stay true while the others change.
        plan = [(node, fill, before, after, None if planned & {*before, *after} else held)
                for node, fill, before, after, held in plan]
        if plan:
            d.fill_function()  # the PTX compiled and loaded before the first edit
    except RuntimeError as e:
        raise Untouched(str(e)) from e
    replaced = {}  # memset node -> its fill kernel node, for memsets next to each other
    for node, fill, before, after, held in plan:
        before, after = [replaced.get(n, n) for n in before], [replaced.get(n, n) for n in after]
        beside_it = held is not None and [held] != before
        kernel = d.add_fill(g, fill, [replaced.get(held, held)] if beside_it else before)
        try:
            d.connect(g, kernel, after)
            if beside_it:  # what came before the memset still comes before what came after it
                for n in before:
                    d.connect(g, ctypes.c_void_p(n), after)
            d.destroy(node)
        except RuntimeError:
            d.destroy(kernel.value)  # not left to run beside the memset's dependents
            raise
        replaced[node] = kernel.value
    return len(plan)
