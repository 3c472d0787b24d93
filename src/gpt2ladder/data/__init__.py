"""Text into training batches: the GPT-2 tokenizer (`tokenizer`), the text (`text`), its token cache
(`cache`), safe file writes (`files`) and the batch sampler (`batches`). Deterministic, and offline
once the text is on disk."""

from gpt2ladder.data.batches import (
           Batches,
           check_splits,
           eval_batches,
           micro_batches,
           to_device,
)
from gpt2ladder.data.text import (
           DataUnavailable,
           TokenData,
           cache_dir,
           fetch_tinyshakespeare,
           load_tokens,
           random_tokens,
)
from gpt2ladder.data.tokenizer import GPT2_EOT, get_tokenizer

__all__ = ["Batches", "check_splits", "DataUnavailable", "GPT2_EOT", "TokenData", "cache_dir", "eval_batches",
           "fetch_tinyshakespeare", "get_tokenizer", "load_tokens", "micro_batches", "random_tokens", "to_device"]
