"""Text and corpora into training batches: the GPT-2 tokenizer (`tokenizer`), one text (`text`) and its
token cache (`cache`), either of them by name (`load`), prepared corpora (`sources` -> `prepare` -> `shards`,
read back by `corpus`),
safe file writes (`files`), the batch samplers (`batches` for a text, `loader` for a corpus) and the
host-to-device prefetcher (`prefetch`). Deterministic, and offline once the data is on disk.

Names are imported on first use, so a process that only tokenizes (a `prepare` worker) never imports torch.
"""

import importlib

_WHERE = {
    "Batches": "batches", "check_splits": "batches", "eval_batches": "batches", "micro_batches": "batches",
    "to_device": "batches",
    "DataUnavailable": "text", "TokenData": "text", "cache_dir": "text", "fetch_tinyshakespeare": "text",
    "load_tokens": "load", "random_tokens": "text",
    "GPT2_EOT": "tokenizer", "get_tokenizer": "tokenizer",
    "ShardedTokens": "corpus",
    "OrderedBatches": "loader", "training_batches": "loader", "validation_batches": "loader",
    "Prefetcher": "prefetch",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
