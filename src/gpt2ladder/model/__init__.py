"""The network: shapes and presets (`config`), GPT-2 itself (`gpt`), Hugging Face weights (`hf`) and
text generation (`generate`); and `setup`, the record of how a training step runs, which the rungs
build and everything above reads."""
