import torch, triton
import cublaslt as lt
N,C,M=16384,768,3072
bf=torch.bfloat16
g=torch.randn(N,C,device="cuda",dtype=bf)*1e-3; w=torch.randn(C,M,device="cuda",dtype=bf)*0.02; h=torch.randn(N,M,device="cuda",dtype=bf)
dh=torch.empty_like(h)
for name,ep in (("DGELU",192),("DEFAULT",1)):
    f=lambda: lt.matmul_t(g,w,dh,b_transposed=False,epilogue=ep,aux=h if ep!=1 else None)
    f(); torch.cuda.synchronize()
    gr=torch.cuda.CUDAGraph()
    s=torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): f()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(gr): f()
    print(name, sorted(triton.testing.do_bench(gr.replay,warmup=25,rep=200) for _ in range(3)))
