import ctypes, torch, triton
import cublaslt as lt
N,C,M=16384,768,3072
bf=torch.bfloat16
x=torch.randn(N,C,device="cuda",dtype=bf); dh=torch.randn(N,M,device="cuda",dtype=bf)*1e-3
dw=torch.empty(M,C,device="cuda"); db=torch.empty(M,device="cuda")
lib=lt._library()
def wgrad(ep):
    with lt._Desc(lib) as d:
        lt._check(lib.cublasLtMatmulDescCreate(ctypes.byref(d.desc), 68, 0), "create")
        d.set(3, ctypes.c_int32(0)); d.set(4, ctypes.c_int32(1)); d.set(7, ctypes.c_int32(ep))
        if ep != 1:
            d.set(8, ctypes.c_void_p(db.data_ptr())); d.set(26, ctypes.c_int32(0))
        la=d.layout(bf, C, N, C); lb=d.layout(bf, M, N, M); ld=d.layout(torch.float32, C, M, C)
        lt._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(d.pref)),"pref")
        ws=ctypes.c_uint64(lt.WORKSPACE_BYTES)
        lib.cublasLtMatmulPreferenceSetAttribute(d.pref,1,ctypes.byref(ws),8)
        res=lt._AlgoResult(); found=ctypes.c_int(0)
        lt._check(lib.cublasLtMatmulAlgoGetHeuristic(lt._handle(0), d.desc, la, lb, ld, ld, d.pref, 1, ctypes.byref(res), ctypes.byref(found)),"heur")
        w=torch.empty(lt.WORKSPACE_BYTES,dtype=torch.uint8,device="cuda")
        a,b=ctypes.c_float(1),ctypes.c_float(0)
        lt._check(lib.cublasLtMatmul(lt._handle(0), d.desc, ctypes.byref(a), x.data_ptr(), la, dh.data_ptr(), lb, ctypes.byref(b), dw.data_ptr(), ld, dw.data_ptr(), ld, ctypes.byref(res.algo), w.data_ptr(), lt.WORKSPACE_BYTES, torch.cuda.current_stream().cuda_stream),"mm")
def t(f):
    f(); torch.cuda.synchronize()
    gr=torch.cuda.CUDAGraph(); s=torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): f()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(gr): f()
    return sorted(triton.testing.do_bench(gr.replay,warmup=25,rep=200) for _ in range(3))
ref=torch.mm(dh.t(),x,out_dtype=torch.float32)
print("torch.mm out_dtype fp32", t(lambda: torch.mm(dh.t(),x,out_dtype=torch.float32)))
print("torch.mm + colsum", t(lambda: (torch.mm(dh.t(),x,out_dtype=torch.float32), dh.sum(0,dtype=torch.float32))))
print("Lt default", t(lambda: wgrad(1)))
wgrad(1); print("Lt default err", ((dw-ref).norm()/ref.norm()).item())
print("Lt BGRADB", t(lambda: wgrad(512)))
wgrad(512); print("Lt BGRADB err", ((dw-ref).norm()/ref.norm()).item(), ((db-dh.float().sum(0)).norm()/dh.float().sum(0).norm()).item())
