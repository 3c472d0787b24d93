"""What the CUDA driver says to each graph call memset_fill makes, one at a time, on a small captured graph.

    python3 benchmarks/micro/graph_fill_probe.py

Prints the driver's version, a memset node's parameters and edges (through the unversioned calls and the _v2 ones
with edge data), and the result of adding the fill kernel as a node both ways and of launching it on a stream; then
the memset nodes a cuBLAS matmul leaves in a capture and their edges' data. A diagnostic: it changes nothing.
"""

import ctypes

import torch

from gpt2ladder.runtime import graph_fills as gf


def result(d, name, *args):
    code = getattr(d.lib, name)(*args)
    text = ctypes.c_char_p()
    d.lib.cuGetErrorName(code, ctypes.byref(text))
    return f"{name}: {code} {(text.value or b'').decode()}"


def small_graph():
    x = torch.zeros(1024, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        x.add_(5)
        print("memset during capture:", gf.driver().lib.cuMemsetD32Async(ctypes.c_uint64(x.data_ptr()),
                                                                          ctypes.c_uint(7), ctypes.c_size_t(512),
                                                                          stream))
        x.add_(1)
    return graph, x


def main():
    d = gf.driver()
    version = ctypes.c_int()
    d.lib.cuDriverGetVersion(ctypes.byref(version))
    print(f"driver {version.value}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    graph, x = small_graph()
    g = ctypes.c_void_p(graph.raw_cuda_graph())
    nodes = d.nodes(g)
    kinds = [d.node_type(n) for n in nodes]
    print("node types:", kinds)
    node = nodes[kinds.index(gf.NODE_TYPE_MEMSET)]
    print("memset:", d.memset(node))
    count = ctypes.c_size_t(0)
    print(result(d, "cuGraphNodeGetDependencies", ctypes.c_void_p(node), None, ctypes.byref(count)), count.value)
    found = (ctypes.c_void_p * 4)()
    count = ctypes.c_size_t(4)
    print(result(d, "cuGraphNodeGetDependencies", ctypes.c_void_p(node), found, ctypes.byref(count)), count.value)
    print("v2 dependencies:", d.dependencies(node), "dependents:", d.dependents(node))
    fill = gf.Fill(x.data_ptr() + 2048, 0xABABABAB, 256)
    function = d.fill_function()
    a, b, c = ctypes.c_uint64(fill.dst), ctypes.c_uint32(fill.word), ctypes.c_uint32(fill.count)
    args = (ctypes.c_void_p * 3)(*(ctypes.addressof(v) for v in (a, b, c)))
    stream = torch.cuda.Stream()
    print(result(d, "cuLaunchKernel", function, 1, 1, 1, 256, 1, 1, 0, ctypes.c_void_p(stream.cuda_stream), args,
                 None))
    torch.cuda.synchronize()
    print("launched fill stored:", hex(x[512].item() & 0xFFFFFFFF), "at word 512;", x[767].item() & 0xFFFFFFFF)

    class V1(ctypes.Structure):
        _fields_ = gf._KernelParams._fields_[:-2]

    deps = (ctypes.c_void_p * 1)(node)
    for name, params in (("cuGraphAddKernelNode", V1(function, 1, 1, 1, 256, 1, 1, 0,
                                                      ctypes.cast(args, ctypes.POINTER(ctypes.c_void_p)), None)),
                         ("cuGraphAddKernelNode_v2", gf._KernelParams(function, 1, 1, 1, 256, 1, 1, 0,
                                                                      ctypes.cast(args,
                                                                                  ctypes.POINTER(ctypes.c_void_p)),
                                                                      None, None, None))):
        new = ctypes.c_void_p()
        print(result(d, name, ctypes.byref(new), g, deps, ctypes.c_size_t(1), ctypes.byref(params)))
    try:
        print("rewrite of the small graph:", gf.rewrite_memsets(graph.raw_cuda_graph()))
        graph.instantiate()
        graph.replay()
        torch.cuda.synchronize()
        print("after a replay:", x[:2].tolist(), x[-2:].tolist())
    except RuntimeError as e:
        print("rewrite failed:", e)
    a_, w_ = (torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w_ = w_[:768]
    torch.mm(a_, w_)
    torch.cuda.synchronize()
    mm = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(mm):
        torch.mm(a_, w_)
        torch.mm(a_, w_.t())
    mg = ctypes.c_void_p(mm.raw_cuda_graph())
    for n in d.nodes(mg):
        kind = d.node_type(n)
        line = f"cuBLAS capture node type {kind}"
        if kind == gf.NODE_TYPE_MEMSET:
            line += f": {d.memset(n)}, in {d.dependencies(n)}, out {d.dependents(n)}"
        print(line)


if __name__ == "__main__":
    main()
