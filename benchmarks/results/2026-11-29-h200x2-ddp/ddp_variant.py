"""`gpt2ladder` under torchrun with one DDP setting changed from outside, to measure it before adopting it:
  torchrun --nproc_per_node=2 benchmarks/scripts/ddp_variant.py VARIANT bench ARGS...
VARIANT: one-graph (torch._dynamo.config.optimize_ddp = False: one compiled graph, the all-reduces
after backward instead of overlapped at bucket boundaries) or bucketMB (DDP buckets of MB megabytes)."""

import sys

import torch._dynamo
import torch.nn.parallel

variant = sys.argv[1]
if variant == "one-graph":
    torch._dynamo.config.optimize_ddp = False
elif variant.startswith("bucket"):
    mb = int(variant.removeprefix("bucket"))
    init = torch.nn.parallel.DistributedDataParallel.__init__

    def with_buckets(self, *args, **kwargs):
        kwargs.setdefault("bucket_cap_mb", mb)
        init(self, *args, **kwargs)

    torch.nn.parallel.DistributedDataParallel.__init__ = with_buckets
else:
    sys.exit(f"unknown variant {variant!r}")

from gpt2ladder.cli import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
