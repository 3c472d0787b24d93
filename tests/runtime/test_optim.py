"""Muon beside AdamW (runtime/optim.py), against torch's own Muon and AdamW and the Newton-Schulz expression."""

import copy

import pytest
import torch

from gpt2ladder.model import family
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.setup import Setup
from gpt2ladder.runtime import optim
from gpt2ladder.runtime.engine import Engine, OptimConfig

SHAPE = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300)
HAS_TORCH_MUON = hasattr(torch.optim, "Muon")
# bfloat16's 5 iterations land about 1.5% (in norm) from the fp32 expression's, two bfloat16 runs that round in
# another order about 3% apart; a wrong coefficient or one step fewer is 30% off.
BF16_REL = 0.05


def _assert_near(a: torch.Tensor, b: torch.Tensor, rel: float = BF16_REL) -> None:
    """Equal up to bfloat16 rounding: the difference's norm within `rel` of b's."""
    a, b = a.detach().float(), b.detach().float()
    assert (a - b).norm() <= rel * b.norm(), f"{(a - b).norm() / b.norm():.4f} relative"


def _newton_schulz(g: torch.Tensor, schedule=(optim.NS_COEFFICIENTS,) * optim.NS_STEPS,
                   margin: float = 0.0) -> torch.Tensor:
    """The iteration for one matrix, written out in fp32: X <- aX + bAX + cA^2X, A = XX^T (on the wide side), from
    X = g / ((1 + margin) ||g||), with each step's a, b, c from `schedule`."""
    x = g.float()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (x.norm() * (1 + margin)).clamp(min=optim.NS_EPS)
    for a, b, c in schedule:
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (32, 32)])
def test_orthogonalise_is_newton_schulz_and_takes_singular_values_near_one(shape):
    g = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0))
    batched = optim.orthogonalise(g)
    for i in range(3):
        _assert_near(batched[i], _newton_schulz(g[i]))
        assert torch.equal(optim.orthogonalise(g[i:i + 1])[0], batched[i])  # batching changes no number
    s = torch.linalg.svdvals(batched.float())
    assert s.min() > 0.5 and s.max() < 1.3  # U S' V^T with S' about 1: what Muon asks of the iteration


def _pair():
    """A model whose Muon group holds one same-shape matrix pair and one matrix of its own."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(24, 8)), torch.nn.Parameter(torch.randn(24, 8)),
              torch.nn.Parameter(torch.randn(8, 40))]
    grads = [torch.randn_like(p) for p in params]
    return params, grads


@pytest.mark.skipif(not HAS_TORCH_MUON, reason="torch.optim.Muon needs PyTorch 2.9+")
def test_its_muon_steps_as_torch_optim_muon_does():
    params, grads = _pair()
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    start = [p.detach().clone() for p in params]
    ours = optim.MuonAdamW([{"params": params, "muon": True, "weight_decay": 0.1}], lr=0.05, momentum=0.9)
    theirs = torch.optim.Muon(ref, lr=0.05, weight_decay=0.1, momentum=0.9)
    for step in range(3):
        for p, r, g in zip(params, ref, grads):
            p.grad, r.grad = g * (step + 1), g * (step + 1)
        ours.step()
        theirs.step()
    for p, r, p0 in zip(params, ref, start):
        _assert_near(p - p0, r - p0)  # the updates agree


def test_its_compiled_passes_step_as_its_plain_ones_do():
    """With compile_backend (the compile rung's, here the eager backend: the same code traced) the momentum, the
    stacked updates and the step onto the weights give the very numbers of the plain passes, step after step, with
    a learning rate that changes every step and a split matrix beside square ones."""
    params, grads = _pair()
    split = torch.nn.Parameter(torch.randn(48, 16, generator=torch.Generator().manual_seed(3)))
    split.muon_blocks = 3
    twin = [torch.nn.Parameter(p.detach().clone()) for p in (*params, split)]
    twin[-1].muon_blocks = 3
    start = [q.detach().clone() for q in twin]
    plain = optim.MuonAdamW([{"params": [*params, split], "muon": True}], lr=0.05, momentum=0.9)
    fused = optim.MuonAdamW([{"params": twin, "muon": True}], lr=0.05, momentum=0.9, compile_backend="eager")
    assert fused._apply is not optim.apply_updates
    for step in range(3):
        for opt in (plain, fused):
            opt.param_groups[0]["lr"] = 0.05 / (step + 1)
        for p, q, g in zip((*params, split), twin, (*grads, torch.randn(48, 16))):
            p.grad, q.grad = g.clone(), g.clone()
        plain.step()
        fused.step()
    for p, q, q0 in zip((*params, split), twin, start):
        assert torch.equal(p, q) and not torch.equal(q, q0)  # the same steps, and steps they were


def test_a_split_matrix_is_orthogonalised_block_by_block():
    w = torch.nn.Parameter(torch.zeros(3 * 8, 8))
    w.muon_blocks = 3
    g = torch.randn(24, 8)
    w.grad = g.clone()
    opt = optim.MuonAdamW([{"params": [w], "muon": True}], lr=1.0, momentum=0.0, nesterov=False)
    opt.step()
    expected = torch.cat([-_newton_schulz(block).float() for block in g.split(8)])
    _assert_near(w, expected)


@pytest.mark.parametrize("backend, lr", [(None, 1.0), ("eager", 1.0), ("eager", torch.tensor(1.0)),
                                         ("aot_eager", torch.tensor(1.0))],
                         ids=["plain", "compiled", "compiled-tensor-lr", "functionalized-tensor-lr"])
def test_matrices_of_one_iterated_shape_are_orthogonalised_as_one_batch(monkeypatch, backend, lr):
    """A tall matrix beside one of its transposed shape, a 3-block split beside a square of its blocks' shape: two
    batches, the wide side of each (8x32: the tall one turned; 8x8: the square and the three blocks), and a weight of
    two tall blocks, each turned (8x24). Each matrix's step is still its own Newton-Schulz alone, times its own
    shape's scale (the tall ones' are 2 and sqrt 3)."""
    gen = torch.Generator().manual_seed(4)
    shapes, blocks = [(32, 8), (8, 32), (24, 8), (8, 8), (48, 8)], [1, 1, 3, 1, 2]
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]
    params[2].muon_blocks, params[4].muon_blocks = 3, 2
    grads = [torch.randn(shape, generator=gen) for shape in shapes]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    batches = []
    real = optim.orthogonalise
    monkeypatch.setattr(optim, "orthogonalise", lambda g, **kw: batches.append(tuple(g.shape)) or real(g, **kw))
    opt = optim.MuonAdamW([{"params": params, "muon": True}], lr=lr, momentum=0.0, nesterov=False,
                          compile_backend=backend)
    opt.step()
    assert sorted(batches) == [(2, 8, 24), (2, 8, 32), (4, 8, 8)]
    for p, g, k in zip(params, grads, blocks):
        alone = [optim.orthogonalise(m[None])[0] for m in g.split(g.size(0) // k)]  # each matrix by itself
        assert len(alone) == k
        expected = -optim.shape_scale(g.size(0) // k, g.size(1)) * torch.cat(alone).float()
        # The same bfloat16 arithmetic per matrix: equal here, but a BLAS may block a larger batch or a transposed
        # operand otherwise and round once differently; a changed computation (another order, a missing
        # transpose or scale) lands 1% to 100% away, 0.1% is far below it.
        _assert_near(p, expected, rel=1e-3)
    assert set(opt.state) == set(params) and all(opt.state[p]["momentum_buffer"].shape == p.shape for p in params)


def test_its_adamw_groups_step_as_torch_adamw_with_one_state():
    torch.manual_seed(1)
    emb, gain = torch.nn.Parameter(torch.randn(10, 4)), torch.nn.Parameter(torch.ones(4))
    ref = [torch.nn.Parameter(emb.detach().clone()), torch.nn.Parameter(gain.detach().clone())]
    ours = optim.MuonAdamW([{"params": [emb], "lr": 0.1, "weight_decay": 0.0},
                            {"params": [gain], "lr": 0.01, "weight_decay": 0.0}], lr=0.1, betas=(0.8, 0.95))
    theirs = torch.optim.AdamW([{"params": [ref[0]], "lr": 0.1}, {"params": [ref[1]], "lr": 0.01}],
                               betas=(0.8, 0.95), weight_decay=0.0)
    for _ in range(3):
        g = torch.randn(10, 4), torch.randn(4)
        emb.grad, gain.grad, ref[0].grad, ref[1].grad = g[0], g[1], g[0].clone(), g[1].clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(emb, ref[0]) and torch.testing.assert_close(gain, ref[1])
    assert set(ours.state) == {emb, gain} and "exp_avg" in ours.state[emb]


def test_groups_of_the_muon_recipe_and_their_rates():
    model = family.built(ModelConfig(**{**SHAPE.to_dict(), "parts": ("untied_head",)}), 0)
    groups = optim.param_groups(model, "muon", lr=1e-3, weight_decay=0.1, muon_lr=0.02, embed_lr=0.3, head_lr=0.004)
    by_scale = {round(g["lr_scale"], 6): g for g in groups}
    muon = by_scale[20.0]
    assert muon["muon"] and len(muon["params"]) == 2 * 4 and all(p.dim() == 2 for p in muon["params"])
    assert model.transformer.h[0].attn.c_attn.weight.muon_blocks == 3
    assert by_scale[300.0]["params"][0] is model.transformer.wte.weight
    assert by_scale[4.0]["params"] == [model.lm_head.weight]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    adamw = optim.param_groups(model, "adamw", lr=1e-3, weight_decay=0.1, muon_lr=0.02)
    assert [g["weight_decay"] for g in adamw] == [0.1, 0.0] and all(g["lr_scale"] == 1.0 for g in adamw)


def test_the_value_embeddings_go_with_the_embeddings_and_the_parts_scalars_with_the_vectors():
    parts = ("rmsnorm", "value_embeds", "unet_skips", "doc_windows", "embed_skips")
    model = family.built(ModelConfig(**{**SHAPE.to_dict(), "parts": parts}), 0)
    groups = optim.param_groups(model, "muon", lr=1e-3, weight_decay=0.1, muon_lr=0.02, embed_lr=0.3)
    by_scale = {round(g["lr_scale"], 6): g for g in groups}
    tables = {id(t.weight) for t in [*model.value_embeds, model.transformer.wte, model.transformer.wpe]}
    assert {id(p) for p in by_scale[300.0]["params"]} == tables and by_scale[300.0]["weight_decay"] == 0.0
    scalars = {id(model.skip_weights), id(model.residual_mix), id(model.embed_mix)} | {
        id(b.attn.value_mix) for b in model.transformer.h}
    vectors = by_scale[1.0]
    assert {id(p) for p in vectors["params"]} == scalars and not vectors.get("muon") and vectors["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in by_scale[20.0]["params"]) and by_scale[20.0]["muon"]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def _engine(**optim_fields):
    cfg = ModelConfig(**{**SHAPE.to_dict(), "parts": ("rope", "relu2", "untied_head")})
    return Engine(cfg, Setup(), torch.device("cpu"), seed=0,
                  optim=OptimConfig(name="muon", lr=1e-3, muon_lr=0.02, grad_clip=1.0, **optim_fields))


def test_the_engine_trains_the_muon_recipe_and_resumes_it_exactly():
    x = torch.randint(0, 300, (2, 16))
    a = _engine()
    a.set_lr(5e-4)
    assert {round(float(g["lr"]), 8) for g in a.optimizer.param_groups} == {5e-4, 1e-2}
    losses = [a.step(x, x).item() for _ in range(4)]
    assert losses[-1] < losses[0]
    saved = copy.deepcopy(a.state_dict())
    after = [a.step(x, x).item() for _ in range(2)]
    b = _engine()
    b.load_state_dict(saved)
    b.set_lr(5e-4)
    assert [b.step(x, x).item() for _ in range(2)] == after
    assert b.optimizer.adamw.state is b.optimizer.state  # AdamW keeps reading the one state after a load


def test_a_tensor_momentum_changed_in_place_steps_as_the_momentum_expression():
    """The momentum_warmup part's momentum is a 0-d tensor the engine fills each step (a replayed graph reads it in
    place): B <- mu_t B + g_t and the update g_t + mu_t B, with each step's own mu_t, plain and compiled alike."""
    grads = [torch.randn(3, 8, 24, generator=torch.Generator().manual_seed(s)).unbind(0) for s in range(3)]
    mus = [0.85, 0.9, 0.93]
    bufs_ref = [torch.zeros(8, 24) for _ in range(3)]
    expected = []
    for g, mu in zip(grads, mus):  # the expression, written out
        bufs_ref = [mu * b + x for b, x in zip(bufs_ref, g)]
        expected.append(torch.stack([x + mu * b for x, b in zip(g, bufs_ref)]).bfloat16())
    compiled = torch.compile(optim.momentum_update, backend="eager", dynamic=False)
    for update in (optim.momentum_update, compiled):
        mu_t, bufs = torch.tensor(0.0), [torch.zeros(8, 24) for _ in range(3)]
        for g, mu, want in zip(grads, mus, expected):
            mu_t.fill_(mu)
            got = update(list(g), bufs, mu_t, True, [1, 1, 1])
            assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()  # bf16 rounding
        for b, r in zip(bufs, bufs_ref):
            torch.testing.assert_close(b, r, rtol=1e-6, atol=1e-6)


def test_the_engine_warms_muons_momentum_through_one_tensor_and_resumes_it_exactly():
    x = torch.randint(0, 300, (2, 16))
    a = _engine(momentum_warmup=True)
    muon = [g for g in a.optimizer.param_groups if g.get("muon")]
    assert muon and all(isinstance(g["momentum"], torch.Tensor) for g in muon)
    held = [g["momentum"] for g in muon]
    a.set_momentum(0.85)
    assert all(g["momentum"] is t and float(t) == pytest.approx(0.85) for g, t in zip(muon, held))  # filled in place
    assert all(not isinstance(g.get("momentum"), torch.Tensor) for g in a.optimizer.param_groups if not g.get("muon"))
    for _ in range(3):
        a.step(x, x)
    saved = copy.deepcopy(a.state_dict())
    after = []
    for mu in (0.9, 0.95):
        a.set_momentum(mu)
        after.append(a.step(x, x).item())
    b = _engine(momentum_warmup=True)
    held = [g["momentum"] for g in b.optimizer.param_groups if g.get("muon")]
    b.load_state_dict(saved)
    assert [g["momentum"] for g in b.optimizer.param_groups if g.get("muon")] == held  # the same tensors, kept
    assert all(float(t) == pytest.approx(0.85) for t in held)  # holding the saved value
    again = []
    for mu in (0.9, 0.95):
        b.set_momentum(mu)
        again.append(b.step(x, x).item())
    assert again == after


def _muon_weights(engine) -> torch.Tensor:
    return torch.cat([p.detach().flatten()
                      for g in engine.optimizer.param_groups if g.get("muon") for p in g["params"]])


def test_a_tensor_momentum_trains_as_that_fixed_momentum_does_and_the_value_reaches_muon():
    """The momentum_warmup engine set to mu ends four steps with the Muon weights of an engine whose fixed momentum
    is mu (the tensor path computes what the number path does, up to the rounding of mu B + g fused or not), and
    0.85 against 0.95 moves them a thousand times further apart than that. An engine without the part refuses
    set_momentum: a number there would recompile the compiled passes each time and stay baked into a graph."""
    x = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    weights = {}
    for mu in (0.85, 0.95):
        warm, fixed = _engine(momentum_warmup=True), _engine(muon_momentum=mu)
        warm.set_momentum(mu)
        for _ in range(4):
            warm.step(x, x)
            fixed.step(x, x)
        weights[mu] = _muon_weights(warm)
        same = (weights[mu] - _muon_weights(fixed)).norm()
        assert same <= 1e-6 * weights[mu].norm()
    assert (weights[0.85] - weights[0.95]).norm() > 1e-2 * weights[0.95].norm()  # 0.09 of 2.9 here
    with pytest.raises(ValueError, match="momentum_warmup=True"):
        _engine().set_momentum(0.9)


# --- the polar_express part -------------------------------------------------------------------------------------


def _quintic(coefficients, x):
    a, b, c = coefficients
    return a * x + b * x ** 3 + c * x ** 5


@pytest.mark.parametrize("lo, hi", [(0.02, 1.0), (0.3, 1.2), (0.86, 1.14)])
def test_the_best_odd_quintic_equioscillates_about_one_and_no_nearby_quintic_does_better(lo, hi):
    """Chebyshev's criterion: p - 1 reaches its largest size at four points of [lo, hi] (both ends and p's two
    extrema inside) with alternating signs; then no other odd quintic is nearer to 1 there."""
    best = optim.best_odd_quintic(lo, hi)
    x = torch.linspace(lo, hi, 100_001, dtype=torch.float64)
    error = (_quintic(best, x) - 1).abs().max().item()
    a, b, c = best
    root = (9 * b * b - 20 * a * c) ** 0.5
    inner = sorted(((-3 * b + s * root) / (10 * c)) ** 0.5 for s in (-1, 1))
    signs = [_quintic(best, t) - 1 for t in (lo, *inner, hi)]
    assert all(abs(abs(s) - error) < 1e-9 for s in signs)
    assert all(s * t < 0 for s, t in zip(signs, signs[1:]))
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        other = [k * (1 + 1e-3 * float(torch.randn(1, generator=gen))) for k in best]
        assert (_quintic(other, x) - 1).abs().max().item() > error


def test_polar_express_takes_every_singular_value_of_its_range_nearer_one_than_newton_schulz_does():
    """From a start divided by 1.02 its norm, POLAR_EXPRESS's five quintics take every singular value in [1e-3, 1]
    into [0.84, 1.15]; Newton-Schulz's one quintic five times leaves them in [0.47, 1.21]. Between the steps they
    stay inside (0, 2), the range each next quintic is planned for."""
    x = torch.linspace(1e-3, 1.0, 200_001, dtype=torch.float64)
    polar, plain = x / (1 + optim.POLAR_EXPRESS_SAFETY), x.clone()
    for coefficients in optim.POLAR_EXPRESS:
        polar = _quintic(coefficients, polar)
        assert 0 < polar.min() and polar.max() < 2
    for _ in range(optim.NS_STEPS):
        plain = _quintic(optim.NS_COEFFICIENTS, plain)
    assert (polar - 1).abs().max() < 0.16 and (plain - 1).abs().max() > 0.3
    assert len(optim.POLAR_EXPRESS) == optim.NS_STEPS == len(optim.polar_express_coefficients())
    assert optim.polar_express_coefficients(3) != optim.POLAR_EXPRESS[:3]  # a schedule is planned for its length


def test_the_schedule_is_the_published_one_at_the_published_settings():
    """The Polar Express paper's list (Amsel, Persson, Musco and Gower, 2025: 8 steps from [1e-3, 1], cushion
    0.02407..., no margin) and modded-nanogpt's 5 steps (cushion 0.02, margin 2%, POLAR_EXPRESS itself), to 1e-8."""
    paper = [(8.28721201814563, -23.595886519098837, 17.300387312530933),
             (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
             (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
             (3.3184196573706015, -2.488488024314874, 0.51004894012372),
             (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
             (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
             (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
             (1.875, -1.25, 0.375)]
    speedrun = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
                (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]
    ours = optim.polar_express_coefficients(8, cushion=0.02407327424182761, safety=0)
    for mine, published in [*zip(ours, paper), *zip(optim.POLAR_EXPRESS, speedrun)]:
        assert mine == pytest.approx(published, rel=1e-8, abs=1e-8)


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (64, 256)])
def test_orthogonalise_polar_is_its_expression_and_ends_nearer_one_than_newton_schulz(shape):
    g = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0))
    polar = optim.orthogonalise(g, polar=True)
    for i in range(3):
        _assert_near(polar[i], _newton_schulz(g[i], optim.POLAR_EXPRESS, optim.POLAR_EXPRESS_SAFETY))
    s, plain = torch.linalg.svdvals(polar.float()), torch.linalg.svdvals(optim.orthogonalise(g).float())
    assert 0.8 < s.min() and s.max() < 1.2 and plain.min() < 0.8  # Newton-Schulz's smallest stay near 0.68


def test_the_polar_express_recipe_reaches_muon_and_changes_its_step():
    """`--recipe muon,polar_express`: the engine's Muon orthogonalises with POLAR_EXPRESS; four steps then end
    elsewhere than plain Muon's (a part changes what is trained, on purpose)."""
    from gpt2ladder.model.recipe import parse_recipe

    assert OptimConfig.of(parse_recipe("muon,polar_express")).polar_express
    assert not OptimConfig.of(parse_recipe("speedrun")).polar_express
    x = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    polar, plain = _engine(polar_express=True), _engine()
    assert polar.optimizer.polar and not plain.optimizer.polar
    for _ in range(4):
        polar.step(x, x)
        plain.step(x, x)
    assert (_muon_weights(polar) - _muon_weights(plain)).norm() > 1e-3 * _muon_weights(plain).norm()


def test_adamw_keeps_bf16_tables_moments_in_bf16_and_the_engine_resumes_them_exactly():
    cfg = ModelConfig(**{**SHAPE.to_dict(), "parts": ("rope", "untied_head", "bf16_tables")})

    def engine():
        return Engine(cfg, Setup(), torch.device("cpu"), seed=0,
                      optim=OptimConfig(name="muon", lr=1e-3, muon_lr=0.02, grad_clip=1.0, embed_lr=0.03))

    x = torch.randint(0, 300, (2, 16))
    a = engine()
    wte = a.raw_model.transformer.wte.weight
    before = wte.detach().clone()
    losses = [a.step(x, x).item() for _ in range(4)]
    assert losses[-1] < losses[0] and not torch.equal(wte, before) and wte.dtype == torch.bfloat16
    state = a.optimizer.state[wte]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    saved = copy.deepcopy(a.state_dict())
    after = [a.step(x, x).item() for _ in range(2)]
    b = engine()
    b.load_state_dict(saved)
    assert [b.step(x, x).item() for _ in range(2)] == after


def test_bf16_tables_under_fsdp_is_refused_in_one_line_and_elsewhere_not():
    assert "FSDP2" in optim.strategy_problem("adamw", "fsdp", ("untied_head", "bf16_tables"))
    assert optim.strategy_problem("adamw", "ddp", ("untied_head", "bf16_tables")) is None
    assert optim.strategy_problem("adamw", "fsdp", ("untied_head",)) is None
