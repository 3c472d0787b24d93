"""Triton kernels and the custom ops around them. Imports nothing else of the package, so each kernel
can be read, tested and benchmarked on its own; off CUDA each op falls back to its reference expression."""
