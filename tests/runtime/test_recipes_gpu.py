"""A modern recipe at the top of `auto` on a GPU: the rungs that apply to it (compile, SDPA, the soft-capped fused
loss, its float8 head and its kernels, the CUDA graph with Muon inside it, the bf16 residual, the rotary kernels)
train as its eager fp32 step does."""

import dataclasses

import pytest
import torch

from gpu_support import GPU, TINY, needs_cuda, random_batches
from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.model.recipe import parse_recipe
from gpt2ladder.runtime.engine import Engine, OptimConfig
from gpt2ladder.runtime.hardware import detect

pytestmark = [pytest.mark.gpu, needs_cuda]
RECIPE = parse_recipe("muon,rope,qk_norm,relu2,rmsnorm,zero_init,untied_head,softcap")
SHAPE = dataclasses.replace(TINY, parts=RECIPE.model_parts)


def _losses(setup, batches, **optim):
    engine = Engine(SHAPE, setup, GPU, seed=0, optim=OptimConfig(name="muon", lr=3e-3, muon_lr=0.02, **optim))
    return [engine.step(x, y).item() for x, y in batches], engine


def test_the_top_of_auto_for_a_modern_recipe_trains_as_its_fp32_step_does():
    names = resolve_rungs("auto", detect(GPU), recipe=RECIPE)
    assert ({"compile", "flash", "fused_loss", "loss_kernel", "cuda_graph", "bf16_residual", "rotary_kernel"}
            <= set(names))
    assert "norm_kernel" not in names and "adamw_kernel" not in names
    batches = random_batches(1) * 8  # one batch again and again: a model that learns lowers its loss
    top, engine = _losses(setup_for(names), batches)
    assert engine.captures == 1  # one graph, Muon's update inside it
    ungraphed, _ = _losses(dataclasses.replace(setup_for(names), cuda_graph=False), batches)
    fp32, _ = _losses(setup_for(["baseline"]), batches)
    assert top[-1] < top[0] - 0.5  # it learns
    for a, b in zip(top, ungraphed):
        assert abs(a - b) <= 0.02 * abs(b)  # the same step replayed: bf16 and float8 rounding apart
    assert abs(top[-1] - fp32[-1]) <= 0.05 * fp32[-1]


def test_the_polar_express_iteration_replays_in_the_graph_as_its_step_runs_unreplayed():
    """The polar_express part at the top of auto: its per-step coefficients are constants of the captured update,
    which replays as the ungraphed step runs, and the model learns."""
    names = resolve_rungs("auto", detect(GPU), recipe=RECIPE)
    batches = random_batches(1) * 8
    top, engine = _losses(setup_for(names), batches, polar_express=True)
    assert engine.captures == 1 and engine.optimizer.polar
    ungraphed, _ = _losses(dataclasses.replace(setup_for(names), cuda_graph=False), batches, polar_express=True)
    assert top[-1] < top[0] - 0.5
    for a, b in zip(top, ungraphed):
        assert abs(a - b) <= 0.02 * abs(b)


def _muon_buffers(engine) -> torch.Tensor:
    params = [p for g in engine.optimizer.param_groups if g.get("muon") for p in g["params"]]
    return torch.cat([engine.optimizer.state[p]["momentum_buffer"].float().flatten() for p in params])


def test_a_captured_step_reads_the_momentum_warmups_momentum_each_replay():
    """The momentum_warmup part fills one device tensor before each step: after steps at 0.95 and then at 0.0, the
    replayed graph's momentum buffers are the unreplayed step's (B <- 0 B + g: the last gradient), where a momentum
    baked into the capture at 0.95 would have kept summing the gradients; and it still captures once."""
    names = resolve_rungs("auto", detect(GPU), recipe=RECIPE)
    batches = random_batches(1) * 5
    buffers = {}
    for label, graph, momenta in (("graph", True, (0.95, 0.95, 0.0, 0.0, 0.0)),
                                  ("eager", False, (0.95, 0.95, 0.0, 0.0, 0.0)),
                                  ("baked", False, (0.95,) * 5)):
        engine = Engine(SHAPE, dataclasses.replace(setup_for(names), cuda_graph=graph), GPU, seed=0,
                        optim=OptimConfig(name="muon", lr=3e-3, muon_lr=0.02, momentum_warmup=True))
        for mu, (x, y) in zip(momenta, batches):
            engine.set_momentum(mu)
            engine.step(x, y)
        assert not graph or engine.captures == 1
        buffers[label] = _muon_buffers(engine)
    replayed = (buffers["graph"] - buffers["eager"]).norm()
    assert replayed <= 0.05 * buffers["eager"].norm()  # bf16 and float8 rounding apart
    assert replayed < 0.25 * (buffers["baked"] - buffers["eager"]).norm()


def test_muons_compiled_passes_step_gpt2s_matrices_as_its_plain_ones_do():
    """GPT-2's 48 Muon parameters (72 matrices: each Block's c_attn split in three, its attention projection, c_fc
    tall and turned wide beside the MLP's wide projection in one batch): Inductor compiles Muon's momentum and update
    passes for them (a graph of each pass for each of the two batches, counted: no silent fall back to eager past
    Dynamo's recompile limit), and three steps with them land where the plain passes' do. With Inductor's loop
    reordering after fusion (no optim.PASS_OPTIONS) the momentum pass's compile stopped on an AssertionError here on
    an H100 (torch 2.11); with one Block's four matrices, or the tiny preset's shapes, it did not."""
    from torch._dynamo.utils import counters

    from gpt2ladder.runtime import optim

    shapes = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12  # GPT-2's 12 Blocks
    gen = torch.Generator().manual_seed(0)
    start = [0.02 * torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen).to(GPU) for s in shapes] for _ in range(3)]
    ends = []
    for backend in (None, "inductor"):
        torch._dynamo.reset()  # the passes compiled by earlier tests count towards Dynamo's recompile limit
        counters.clear()
        params = [torch.nn.Parameter(w.to(GPU)) for w in start]
        for p in params[::4]:
            p.muon_blocks = 3
        opt = optim.MuonAdamW([{"params": params, "muon": True}], lr=0.02, momentum=0.95, compile_backend=backend)
        assert (opt._apply is optim.apply_updates) == (backend is None)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        assert counters["stats"]["unique_graphs"] == (0 if backend is None else 4)  # 2 passes x 2 batches' shapes
        ends.append([p.detach() for p in params])
    for w, plain, fused in zip(start, *ends):
        moved = (plain - w.to(GPU)).norm()
        assert moved > 0.5 * 0.02 * min(w.shape) ** 0.5  # at least half one step: lr x an orthogonal matrix's norm
        assert (fused - plain).norm() <= 1e-2 * moved  # the same steps: the passes' roundings apart


def test_bf16_tables_with_value_embeddings_trains_at_the_top_of_auto_as_its_ungraphed_step():
    """The bf16_tables part beside value embeddings at the top of auto: fused AdamW steps the bf16 tables and their
    bf16 moments inside the captured graph as the ungraphed step does, near the loss of the same recipe's fp32
    tables."""
    recipe = parse_recipe("speedrun,bf16_tables")  # speedrun has value embeddings
    names = resolve_rungs("auto", detect(GPU), recipe=recipe)
    batches = random_batches(1) * 8

    def losses(setup, parts=recipe.model_parts):
        engine = Engine(dataclasses.replace(TINY, parts=parts), setup, GPU, seed=0,
                        optim=OptimConfig(name="muon", lr=3e-3, muon_lr=0.02, grad_clip=1.0, embed_lr=0.03))
        return [engine.step(x, y).item() for x, y in batches], engine

    top, engine = losses(setup_for(names))
    wte = engine.raw_model.transformer.wte.weight
    assert engine.captures == 1 and wte.dtype == engine.optimizer.state[wte]["exp_avg"].dtype == torch.bfloat16
    ungraphed, _ = losses(dataclasses.replace(setup_for(names), cuda_graph=False))
    fp32_tables, _ = losses(setup_for(names), tuple(p for p in recipe.model_parts if p != "bf16_tables"))
    assert top[-1] < top[0] - 0.5
    for a, b in zip(top, ungraphed):
        assert abs(a - b) <= 0.02 * abs(b)
    assert abs(top[-1] - fp32_tables[-1]) <= 0.05 * fp32_tables[-1]
