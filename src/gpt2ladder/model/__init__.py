"""The network: shapes and presets (`config`), GPT-2 itself (`gpt`), Hugging Face weights (`hf`) and
text generation (`generate`). Knows nothing of how fast it runs."""
