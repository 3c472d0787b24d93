"""Arithmetic about a step: FLOPs per token, MFU against a device's peak, and timing statistics.

Kept outside the model so the numbers can be checked by hand and the peak table grows without
touching training code.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.recipe import DOC_WINDOW

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) from the vendors' datasheets. One peak per device
# for every rung, so MFU compares rungs: a fp32 rung's MFU is low because it does not use this peak.
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 5090": 209.5e12,
    "RTX 5080": 112.6e12,
    "RTX 5070": 61.7e12,
    "RTX 4090": 165.2e12,
    "RTX 3090": 71e12,
    "V100": 125e12,  # fp16 tensor cores: Volta has no bf16
    "T4": 65e12,  # fp16 tensor cores: Turing has no bf16
}


def flops_per_token(cfg: ModelConfig, seq_len: int, n_params: int) -> float:
    """Training FLOPs per token: 6N for the weights (2 forward, 4 backward) plus attention scores.

    N = parameters without the tables that are looked up (the position embedding, the value embeddings; the tied
    classifier counted once); the attention term 12*L*H*Q*T counts the QK^T and AV products, forward and backward,
    for a full T x T matrix, as nanoGPT and PaLM do (the causal half is not subtracted). With the doc_windows part
    a query sees at most DOC_WINDOW keys, so the width counted is min(T, DOC_WINDOW) (the keys its documents cut
    off depend on the data, and are not subtracted either).
    """
    L, H, Q = cfg.n_layer, cfg.n_head, cfg.head_size
    keys = min(seq_len, DOC_WINDOW) if cfg.has("doc_windows") else seq_len
    return 6 * n_params + 12 * L * H * Q * keys


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak for a device name, or None when the device is not in the table."""
    # Longest key first so "H100 PCIe" wins over "H100".
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(tokens_per_second: float, flops_per_tok: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over peak; None when the peak is unknown."""
    if not peak:
        return None
    return tokens_per_second * flops_per_tok / peak


@dataclass(frozen=True)
class TimingStats:
    median: float
    p10: float
    p90: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> "TimingStats":
        if not samples:
            raise ValueError("no timed samples")
        s = sorted(samples)
        return cls(
            median=statistics.median(s),
            p10=_quantile(s, 0.10),
            p90=_quantile(s, 0.90),
            min=s[0],
            max=s[-1],
            n=len(s),
        )


def _quantile(sorted_samples: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on an already sorted list."""
    pos = q * (len(sorted_samples) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)
