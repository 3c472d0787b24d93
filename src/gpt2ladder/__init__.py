"""gpt2ladder: train GPT-2 as fast as the hardware allows, and measure where every millisecond went."""

__version__ = "0.1.0"
