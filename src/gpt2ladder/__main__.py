"""`python -m gpt2ladder` and `torchrun -m gpt2ladder`."""

from gpt2ladder.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
