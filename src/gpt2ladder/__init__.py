"""gpt2ladder: train GPT-2 as fast as the hardware allows, and measure where every millisecond went.

The Python API (`api.py`) is reachable from here: `gpt2ladder.load`, `generate`, `save_hf` and
`evaluate`. They are looked up on first use, so `import gpt2ladder` (and `gpt2ladder --help`) never
imports torch.
"""

from gpt2ladder.version import __version__

__all__ = ["__version__", "evaluate", "generate", "load", "save_hf"]
_API = ("evaluate", "generate", "load", "save_hf")


def __getattr__(name: str):
    if name in _API:
        from gpt2ladder import api

        return getattr(api, name)
    raise AttributeError(f"module 'gpt2ladder' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
