"""How a step runs on this machine: the `Setup` (setup), what the hardware can do (hardware), the
`Engine` that builds the model and runs one step (engine), many processes (distributed), and the
arithmetic about a step: FLOPs, MFU, timing statistics (metrics)."""
