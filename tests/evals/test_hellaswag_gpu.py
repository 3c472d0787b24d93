"""HellaSwag on a GPU: the compiled forward in bf16 scores as the eager fp32 model does (to bf16's rounding),
and it compiles once per padded length, not once per batch; skipped without a GPU."""

import json

import pytest
import torch
from gpu_support import GPU, needs_cuda

from gpt2ladder.evals import runner
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights

pytestmark = pytest.mark.gpu
CFG = ModelConfig(n_layer=2, n_head=4, n_embd=128, block_size=256, vocab_multiple=128, attention="sdpa")


def _examples(path, n=40):
    """n examples whose rows fall into two padded lengths (32 and 64 tokens)."""
    with open(path, "w") as f:
        for i in range(n):
            ctx = "A person walks along the shore and looks at the waves. " * (1 + i % 2) + "Then they"
            f.write(json.dumps({"ctx": ctx, "label": i % 4, "endings": [
                "sit down.", "run into the water laughing loudly.", "call a friend.", f"count to {i}."]}) + "\n")
    return path


@needs_cuda
def test_compiled_bf16_scores_as_eager_fp32_and_compiles_once_per_length(tmp_path):
    from torch._dynamo.utils import counters

    prepared = runner.prepare("hellaswag", _examples(tmp_path / "hs.jsonl"))
    model = init_weights(GPT(CFG), seed=0).to(GPU).eval()
    kw = dict(device=GPU, block_size=CFG.block_size, vocab_size=CFG.vocab_size, batch_size=3, progress=False)
    eager = runner.evaluate(prepared, model, **kw)
    torch._dynamo.reset()
    counters.clear()
    compiled = runner.evaluate(prepared, torch.compile(model, dynamic=False), autocast="bfloat16",
                               matmul_precision="high", **kw)
    assert counters["stats"]["unique_graphs"] == 2  # one per padded length, however many batches
    torch.testing.assert_close(compiled.sums, eager.sums, rtol=2e-2, atol=5e-2)
    agree = (compiled.means.argmin(1) == eager.means.argmin(1)).float().mean().item()
    assert agree >= 0.9
