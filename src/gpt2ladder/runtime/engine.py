"""One training step for a given `Setup`: the model, its optimizer and how the step runs.

Optional speed-ups are applied in one fixed order, after torchtitan's:
build the model (its config carries attention, vocabulary padding and the residual's dtype) -> move
it to the device -> the model rewrites of `speedups/` (`speedups.apply`, in the order its list
asserts: fused classifier loss, GELU-kernel MLPs, fp32 weight gradients, their weights'
bf16 copies) ->
`parallelize` for data parallelism (`distributed.py`: FSDP2 shards every Block, then the root; DDP
wraps) -> compile -> optimizer -> CUDA graph capture on the first step. The optimizer comes last because FSDP2
replaces every parameter by a sharded DTensor.
Compile takes the whole (sharded or wrapped) model: under DDP that is torch.compile(DDP(model)), so
dynamo's DDPOptimizer cuts the graph at gradient buckets and the all-reduces overlap backward
(compiling first and wrapping after would leave one backward graph whose gradients all arrive at
its end); under FSDP2 dynamo breaks the graph at each Block's all-gather and compiles the rest.
Precision (TF32, autocast) is not a property of the model but of the region the step runs in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from gpt2ladder import speedups
from gpt2ladder.defaults import OPTIM
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model import family
from gpt2ladder.model.gpt import GPT
from gpt2ladder.model.setup import Setup
from gpt2ladder.runtime import compile_workers
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime import graph_fills
from gpt2ladder.runtime import optim
from gpt2ladder.speedups.weight_cast import weight_casts

WARMUP_STEPS = 3  # eager steps before a CUDA graph capture: compile, autotuning, optimizer state
DDP_WARMUP_STEPS = 11  # PyTorch's CUDA-graph notes: DDP needs 11 eager iterations before a full capture


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer's settings; each default is the table's (`gpt2ladder/defaults.py`, OPTIM)."""

    lr: float = OPTIM["lr"]
    weight_decay: float = OPTIM["weight_decay"]
    beta1: float = OPTIM["beta1"]
    beta2: float = OPTIM["beta2"]
    eps: float = OPTIM["eps"]
    grad_clip: float = OPTIM["grad_clip"]  # 0 disables clipping (the write-up's step does not clip)
    name: str = OPTIM["name"]  # or "muon" (`runtime/optim.py`)
    # muon only: the Blocks' matrices' peak rate and momentum; the embeddings' and an untied head's AdamW rates
    # (None: lr). The schedule scales every rate alike.
    muon_lr: float = OPTIM["muon_lr"]
    muon_momentum: float = OPTIM["muon_momentum"]
    embed_lr: float | None = OPTIM["embed_lr"]
    head_lr: float | None = OPTIM["head_lr"]
    # muon only (the momentum_warmup part): the momentum is a tensor that `Engine.set_momentum` changes each step
    momentum_warmup: bool = OPTIM["momentum_warmup"]
    polar_express: bool = OPTIM["polar_express"]  # muon only (the polar_express part): its orthogonalisation's steps

    @classmethod
    def of(cls, recipe, **rates) -> "OptimConfig":
        """The recipe's optimizer (a `model/recipe.Recipe`), at these rates or the defaults."""
        return cls(name=recipe.optimizer, momentum_warmup=recipe.momentum_warmup, polar_express=recipe.polar_express,
                   **rates)


def built_model_config(model_cfg: ModelConfig, setup: Setup) -> ModelConfig:
    """What this setup trains: the same model, maybe with a padded vocabulary, another attention kernel
    and a bf16 residual stream (the three setup fields that change the model's tensors)."""
    return dataclasses.replace(model_cfg, attention=setup.attention, vocab_multiple=setup.vocab_multiple,
                               low_precision_residual=setup.bf16_residual)


def build_model(model_cfg: ModelConfig, setup: Setup, device: torch.device, seed: int) -> GPT:
    """A freshly initialised GPT for this setup, its rewrites applied; the weights depend on the seed only."""
    model = family.built(built_model_config(model_cfg, setup), seed)
    model.to(device)
    speedups.apply(model, setup)
    return model


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, setup: Setup, device: torch.device,
                   compile_backend: str = "inductor"):
    """The named optimizer over the model's groups (`optim.param_groups`); AdamW decays matrices only (biases and
    layer-norm gains are not shrunk). Under the compile rung on a GPU, Muon's passes around its orthogonalisation
    compile too; under the ns_kernel rung on a GPU, its symmetric products run as a Triton kernel."""
    groups = optim.param_groups(model, cfg.name, lr=cfg.lr, weight_decay=cfg.weight_decay, muon_lr=cfg.muon_lr,
                                embed_lr=cfg.embed_lr, head_lr=cfg.head_lr)
    extra = {}
    # Under graph capture a GradScaler (fp16) may not read its inf check back to the CPU; the fused
    # optimizer takes the check on the GPU instead.
    if setup.fused_adamw or (setup.cuda_graph and setup.autocast == "float16"):
        extra["fused"] = True
    if setup.cuda_graph:
        extra["capturable"] = True  # the step counter stays on the GPU, so the step can be replayed
    for group in groups:  # a tensor learning rate can change between graph replays without a new capture
        rate = cfg.lr * group["lr_scale"]
        group["lr"] = torch.tensor(rate, device=device) if setup.cuda_graph else rate
    lr = groups[0]["lr"]
    betas = (cfg.beta1, cfg.beta2)
    if cfg.name == "muon":
        for group in groups:  # as the rate: a tensor a replayed graph reads, compiled passes compiled once
            if group.get("muon") and cfg.momentum_warmup:
                group["momentum"] = torch.tensor(cfg.muon_momentum, device=device)
        fuse = compile_backend if setup.compile and device.type == "cuda" else None
        return optim.MuonAdamW(groups, lr=lr, momentum=cfg.muon_momentum, betas=betas, eps=cfg.eps,
                               compile_backend=fuse, symmetric=setup.ns_kernel and device.type == "cuda",
                               polar=cfg.polar_express, **extra)
    if setup.adamw_kernel:  # the same AdamW, its CUDA step one Triton launch
        from gpt2ladder.speedups import kernel_adamw

        extra["casts"] = weight_casts(model)  # the kernel writes the weight_cast rung's copies, where there are any
        return kernel_adamw.KernelAdamW(groups, lr=lr, betas=betas, eps=cfg.eps, **extra)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=cfg.eps, **extra)


class Engine:
    """A model, its optimizer and `step(x, y)`: zero_grad, forward + loss, backward, (clip), update."""

    SCHEDULED = ("lr", "momentum")  # the groups' settings a schedule changes between steps (set_lr, set_momentum)

    def __init__(self, model_cfg: ModelConfig, setup: Setup, device: torch.device, *, seed: int = 0,
                 optim: OptimConfig = OptimConfig(), compile_backend: str = "inductor",
                 model: torch.nn.Module | None = None,
                 parallelize: Callable[[torch.nn.Module], torch.nn.Module] | None = None):
        self.setup = setup
        self.device = device
        self.optim_cfg = optim
        self.compile_backend = compile_backend
        self.raw_model = model if model is not None else build_model(model_cfg, setup, device, seed)
        # What forward calls: the raw model, a DDP wrapper, or (FSDP2) the raw model sharded in place.
        # The stream a CUDA graph's warm-up and capture run on. DDP is built on it too: DDP keeps each
        # parameter's gradient accumulator, which remembers the stream it was made on, and a backward on
        # another stream would synchronise with it at every gradient (PyTorch warns of exactly that).
        self._stream = torch.cuda.Stream(device) if setup.cuda_graph and device.type == "cuda" else None
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            self.model = parallelize(self.raw_model) if parallelize else self.raw_model
        if self._stream is not None:
            torch.cuda.current_stream(device).wait_stream(self._stream)
        self.tied_grad_pass = None  # tied_grad's graph pass, where Inductor compiles (`_compiled`)
        self.forward = self._compiled(self.model, compile_backend)
        self.optimizer = make_optimizer(self.raw_model, optim, setup, device, compile_backend)
        self.scaler = torch.amp.GradScaler(device.type) if setup.autocast == "float16" else None
        self._graph = None
        self._fused_clip = None  # whether the clipping factor goes to fused AdamW (`_clip`); known at the first step
        self.captures = 0  # CUDA graph captures so far: a step that raised it was no ordinary step
        self.memsets_filled = 0  # memset nodes of the last capture that memset_fill made fill kernels

    def _compiled(self, module, backend: str):
        if not self.setup.compile:
            return module
        # A fresh compile cache per engine: many engines in one process would otherwise exhaust
        # dynamo's per-function recompile limit and silently fall back to eager.
        torch._dynamo.reset()
        if backend == "inductor":  # a signal to the run's process group leaves the workers to end the compile
            compile_workers.detach()
        options = None  # Inductor's own options; only Inductor takes them
        if self.setup.tied_grad and backend == "inductor":
            from gpt2ladder.speedups.tied_grad import FoldTiedScatter

            self.tied_grad_pass = FoldTiedScatter()
            options = {"post_grad_custom_post_pass": self.tied_grad_pass}
        return torch.compile(module, backend=backend, options=options)

    @contextlib.contextmanager
    def precision(self):
        """TF32 (or not), and with the cublaslt rung cuBLASLt for PyTorch's matmuls, for this step only: the global
        settings are restored, so rungs never leak. Without the rung the library is left as it is (cuBLAS, unless
        the user chose otherwise, e.g. TORCH_BLAS_PREFER_CUBLASLT=1)."""
        before = torch.get_float32_matmul_precision()
        lt = self.setup.cublaslt and self.device.type == "cuda"
        blas = torch.backends.cuda.preferred_blas_library() if lt else None  # the library to hand back
        try:
            torch.set_float32_matmul_precision(self.setup.matmul_precision)
            if blas is not None:
                torch.backends.cuda.preferred_blas_library("cublaslt")
            yield
        finally:
            torch.set_float32_matmul_precision(before)
            if blas is not None:
                torch.backends.cuda.preferred_blas_library(blas)

    def autocast(self):
        if self.setup.autocast is None:
            return contextlib.nullcontext()
        # Graph capture replays kernels, not Python: autocast's cast cache must not outlive a step.
        return torch.autocast(self.device.type, dtype=self.setup.autocast_dtype,
                              cache_enabled=not self.setup.cuda_graph)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            _, loss = self.forward(x, y)
        return loss

    def state_dict(self) -> dict:
        """The full, unwrapped state in the single-process layout, so it loads on any number of ranks:
        "model", "optimizer" and "scaler" (fp16's GradScaler, else None). Under FSDP2 a collective:
        every rank calls it, rank 0 gets the state (`distributed.py` gathers it)."""
        return {"model": self.weights(), "optimizer": distributed.optimizer_state(self.raw_model, self.optimizer),
                "scaler": self.scaler.state_dict() if self.scaler else None}

    def weights(self) -> dict:
        """The model's full state dict alone; a collective under FSDP2, as `state_dict`."""
        return distributed.model_state(self.raw_model)

    def load_state_dict(self, state: dict) -> None:
        """Load what `state_dict` gave, here or on any number of ranks (FSDP2: each keeps its shard).

        Each group's learning rate and momentum keep the type they have here: the CUDA-graph rung's rate (and
        the momentum_warmup part's momentum) is a device tensor that a replayed graph reads in place, and a
        saved one would come back as a CPU tensor (or as a float from a run without that rung) and break the
        capture.
        """
        kept = [{k: group[k] for k in self.SCHEDULED if k in group} for group in self.optimizer.param_groups]
        distributed.load_state(self.raw_model, self.optimizer, state["model"], state["optimizer"])
        for group, ours in zip(self.optimizer.param_groups, kept):
            for key, mine in ours.items():
                value = float(group.get(key, mine))
                if isinstance(mine, torch.Tensor):
                    mine.fill_(value)
                    group[key] = mine
                else:
                    group[key] = value
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self._refresh_casts()

    def _refresh_casts(self) -> None:
        """The weight_cast rung's copies made again from the weights now, for a captured step that may not make
        them itself (speedups/weight_cast.py)."""
        casts = weight_casts(self.raw_model)
        if casts is not None:
            casts.refresh()

    def set_lr(self, lr: float) -> None:
        """The schedule's rate now: each group's is its `lr_scale` times it."""
        for group in self.optimizer.param_groups:
            self._set(group, "lr", lr * group.get("lr_scale", 1.0))

    def set_momentum(self, momentum: float) -> None:
        """Muon's momentum now (the momentum_warmup part), for every Muon group. Only an engine built for it holds
        the momentum as a tensor: a number set here would recompile the compiled passes at each new value, and a
        captured graph would keep the first."""
        if not self.optim_cfg.momentum_warmup:
            raise ValueError("this engine's momentum is fixed: build it with OptimConfig(momentum_warmup=True)")
        for group in self.optimizer.param_groups:
            if group.get("muon"):
                self._set(group, "momentum", momentum)

    @staticmethod
    def _set(group: dict, key: str, value: float) -> None:
        if isinstance(group[key], torch.Tensor):
            group[key].fill_(value)  # in place: a captured graph reads this tensor
        else:
            group[key] = value

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step over micro-batches x, y of shape (accum, B, T) or (B, T).

        Returns the mean loss as a detached device tensor (no host sync here).
        """
        if x.dim() == 2:
            x, y = x.unsqueeze(0), y.unsqueeze(0)
        with self.precision():
            if self.setup.cuda_graph:
                return self._graphed_step(x, y)
            self.optimizer.zero_grad(set_to_none=True)
            return self._eager_step(x, y)

    def _eager_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        accum = x.shape[0]
        total = torch.zeros((), device=self.device)
        casts = weight_casts(self.raw_model)  # the weight_cast rung: refreshed once, read by every micro-step
        with casts.fresh() if casts is not None else contextlib.nullcontext():
            for i in range(accum):
                with self._no_sync(i < accum - 1):
                    loss = self.loss(x[i], y[i]) / accum
                    self._backward(loss)
                total += loss.detach()
        self._update()
        return total

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def _update(self) -> None:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        scale = self._clip() if self.optim_cfg.grad_clip > 0 else None
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif scale is None:
            self.optimizer.step()
        else:  # set for this step only, as a GradScaler sets it for the steps it drives
            self.optimizer.grad_scale = scale
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.grad_scale

    def _clip(self) -> torch.Tensor | None:
        """Scale the gradients down to a total norm of at most grad_clip, as clip_grad_norm_ does; or, with fused
        AdamW or the adamw_kernel rung's (and no GradScaler, whose place that is), return the factor to divide them
        by, which the optimizer takes as its `grad_scale`: it divides each gradient as it reads it and stores the
        result, so the pass of clip_grad_norm_'s own that read and rewrote every gradient first goes (one read of
        them all, and its launches)."""
        params = [p for p in self.raw_model.parameters() if p.grad is not None]
        clip = self.optim_cfg.grad_clip
        if self._fused_clip is None:  # the parameters' kind does not change: decided at the first step
            self._fused_clip = self._clips_in_optimizer(params)
        if not self._fused_clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
            return None
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        return ((norm + 1e-6) / clip).clamp(min=1.0)  # 1 / clip_grad_norm_'s factor min(clip / (norm + 1e-6), 1)

    def _clips_in_optimizer(self, params) -> bool:
        takes_scale = bool(self.optimizer.defaults.get("fused")) or getattr(self.optimizer, "takes_grad_scale", False)
        return (self.scaler is None and takes_scale
                and hasattr(torch.nn.utils, "get_total_norm")  # PyTorch 2.6+
                and not any(hasattr(p, "to_local") for p in params))  # FSDP2's sharded gradients: clip_grad_norm_

    def _no_sync(self, skip_allreduce: bool):
        """Inner micro-steps of gradient accumulation do not all-reduce (DDP); a no-op otherwise."""
        if skip_allreduce and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        if skip_allreduce and hasattr(self.model, "set_requires_gradient_sync"):  # FSDP2
            self.model.set_requires_gradient_sync(False)
            return _restore_gradient_sync(self.model)
        return contextlib.nullcontext()

    def _graphed_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._graph is None or self._static_x.shape != x.shape:
            self._capture(x, y)
        self._static_x.copy_(x, non_blocking=True)
        self._static_y.copy_(y, non_blocking=True)
        self._graph.replay()
        return self._static_loss.clone()

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Warm up on a side stream, capture one whole step, then undo the warm-up's updates.

        Under DDP the all-reduces are captured too (NCCL 2.9.6+): PyTorch's CUDA-graph notes ask for DDP
        built on a side stream (the engine builds it on the capture stream), at least 11 eager DDP steps
        before the capture, and NCCL's async error handling off (`distributed.init_from_env`).
        Gradient accumulation's inner micro-steps run under `no_sync` while capturing, so the graph
        all-reduces once per step, after the last one.

        What the capture adds to the step's memory is kept small, so a card that fits the step fits
        the graph: the values to restore wait in host memory, and the memory the warm-up used goes back
        to the device before the graph's own pool takes what the captured step needs.
        """
        ddp = hasattr(self.model, "no_sync")
        self.captures += 1
        self._static_x, self._static_y = x.clone(), y.clone()
        snapshot = _snapshot(self.raw_model, self.optimizer)
        _allocate_optimizer_state(self.optimizer)
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(DDP_WARMUP_STEPS if ddp else WARMUP_STEPS):  # compile, autotuning, optimizer state
                self.optimizer.zero_grad(set_to_none=True)
                self._eager_step(self._static_x, self._static_y)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        # The graph allocates gradients of its own: freed only once capturing, the warm-up's would stay
        # cached where nothing can reuse them, a gradient's worth of the card lost for the whole run.
        # (Under DDP they are views into its buckets, which DDP keeps: nothing is freed, nothing lost.)
        self.optimizer.zero_grad(set_to_none=True)
        # cuBLAS keeps a workspace per handle and stream, made at its first matmul there: the warm-up's
        # backward (autograd's thread, a handle of its own) carves its 32 MiB out of memory the logits had
        # freed, and that one block would keep their whole segment (hundreds of MB) out of empty_cache's
        # reach for the run. Cleared, the captured step makes its workspace in the graph's pool, as
        # Inductor's CUDA graphs do (torch/_inductor/cudagraph_trees.py, clear_cublass_cache).
        torch._C._cuda_clearCublasWorkspaces()
        # Hand the warm-up's cached activations back too, or a step holds two sets of them (the graph
        # allocates from a pool of its own).
        torch.cuda.empty_cache()
        # memset_fill edits the captured graph before it is instantiated, which keep_graph leaves to us.
        self._graph = torch.cuda.CUDAGraph(keep_graph=True) if self.setup.memset_fill else torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph, stream=side):
            # Gradients set to None, not zeroed: backward then hands each parameter its gradient tensor,
            # allocated in the graph's own memory pool (the same addresses on every replay), instead of
            # zeroing every gradient and adding the new one into it. For GPT-2 that removes 7 multi-tensor
            # zeroing kernels and 149 fp32 adds a step. Under DDP too: its
            # reducer then copies each new gradient into its bucket, dividing by the world size on the
            # way (one pass), and points the parameter's .grad at the bucket again, where a zeroed bucket
            # view costs a zeroing, an add and a division in place (three passes and a write).
            self.optimizer.zero_grad(set_to_none=True)
            self._static_loss = self._eager_step(self._static_x, self._static_y)
        try:
            if self.setup.memset_fill:
                self._fill_memsets()
        finally:
            _restore(self.raw_model, self.optimizer, snapshot)
        self._refresh_casts()

    def _fill_memsets(self) -> None:
        """memset_fill: the captured graph's memsets rewritten as fill kernels, then the graph instantiated."""
        self.memsets_filled = 0
        try:
            # the driver's current context is the engine's device's, which the fill kernel is loaded into; the
            # capture's stream context has switched back to the device that was current before it
            with torch.cuda.device(self.device):
                self.memsets_filled = graph_fills.rewrite_memsets(self._graph.raw_cuda_graph())
        except graph_fills.Untouched as e:  # the step as captured, memsets and all
            print(f"notice: memset_fill left the CUDA graph's memsets as they were: {e}", file=sys.stderr)
        except RuntimeError:
            self._graph = None  # half edited: never replayed
            raise
        self._graph.instantiate()


def compilations() -> int:
    """How many compilation events torch has timed in this process since the last compile reset: dynamo's
    frames, backward graphs compiled on first use, Inductor's autotuning. A step that raises it compiled.

    Read from dynamo's own timing table, which every compile path writes to; its compile callbacks would
    not do: the compile reset each compiling engine makes removes them.
    """
    from torch._dynamo.utils import compilation_time_metrics

    return sum(len(times) for times in compilation_time_metrics.values())


@contextlib.contextmanager
def _restore_gradient_sync(model):
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


@torch.no_grad()
def _snapshot(model, optimizer) -> dict:
    """The weights and optimizer state as they are, copied to host memory: on the GPU the copy would
    take 4 bytes per parameter (12 once AdamW has state, as after resuming) beside a step that needs
    the rest of the card."""
    params = {p: p.detach().to("cpu", copy=True) for p in model.parameters()}
    state = {p: {k: v.to("cpu", copy=True) if torch.is_tensor(v) else v for k, v in s.items()}
             for p, s in optimizer.state.items()}
    return {"params": params, "state": state}


@torch.no_grad()
def _allocate_optimizer_state(optimizer) -> None:
    """Have the optimizer create its state now, before the warm-up: created inside it (after the first
    backward) AdamW's moments would be carved out of the memory the warm-up's activations had just
    freed, and those blocks could then not go back to the device for the graph's pool. One step on
    zero gradients makes them; `_restore` undoes what it changed."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for p in params:
        p.grad = None
    torch.cuda.empty_cache()  # the zero gradients' memory, before the warm-up can take part of it


@torch.no_grad()
def _restore(model, optimizer, snapshot: dict) -> None:
    """Copy the pre-warm-up values back in place: the captured graph keeps pointing at these tensors."""
    for p, saved in snapshot["params"].items():
        p.copy_(saved)
    for p, state in optimizer.state.items():
        before = snapshot["state"].get(p, {})
        for k, v in state.items():
            if torch.is_tensor(v):
                v.copy_(before[k]) if k in before else v.zero_()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
