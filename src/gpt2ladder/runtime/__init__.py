"""How a step runs on this machine: what the hardware can do (hardware), the `Engine` that builds the
model and runs one step for a `Setup` (engine; the `Setup` itself is `model/setup.py`), many processes
(distributed), the memory a step needs (memory), and the arithmetic about a step: FLOPs, MFU, timing
statistics (metrics)."""
