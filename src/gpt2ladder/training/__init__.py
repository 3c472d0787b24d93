"""A training run: its config, the learning-rate schedule, the trainer loop, the run log, Ctrl-C and
SIGTERM handling, and checkpoints that survive crashes."""
