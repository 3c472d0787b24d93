"""DDP's whole step, all-reduces included, in a CUDA graph, and in that graph with its memsets rewritten as fill
kernels (memset_fill): the same losses and weights as eager DDP."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_support import needs_cuda

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent


@needs_cuda
def test_graphed_ddp_steps_equal_eager_ddp_steps(tmp_path):
    n = min(2, torch.cuda.device_count())
    out = tmp_path / "ddp-graph.pt"
    src = str(HERE.parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                           str(HERE / "ddp_graph_worker.py"), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = torch.load(out)
    from gpt2ladder.runtime.hardware import graph_edit_problem

    assert (saved["filled"] is None) == bool(graph_edit_problem())  # memset_fill's graph too, where it can run
    (eager_losses, eager_w) = saved["eager"]
    assert eager_losses[-1] < eager_losses[0]  # it trains
    for run in ("graphed", "filled"):
        if saved[run] is None:
            continue
        graph_losses, graph_w = saved[run]
        assert eager_losses == pytest.approx(graph_losses, rel=1e-4), run
        for name in eager_w:
            torch.testing.assert_close(graph_w[name], eager_w[name], rtol=1e-3, atol=1e-5, msg=f"{run}: {name}")
