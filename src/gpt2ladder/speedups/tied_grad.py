"""The tied embedding's gradient added into the classifier's in place, behind the `tied_grad` rung.

GPT-2's token embedding and classifier share one weight (50304 x 768, fp32: 154 MB), so its gradient is the sum of
two: the classifier's, a dense matmul product, and the embedding's, one row per token scattered into a zeroed
copy of the whole weight. The compiled backward does just that: it writes 154 MB of zeros, adds the tokens' rows
into them (atomically, since a token repeats), then reads both 154 MB tensors to write their sum. Adding the rows
into the classifier's gradient instead gives the same sum without the zeros and the extra pass.

The change is a pass over Inductor's graph after autograd (a post-grad custom pass, which the engine hands to
`torch.compile`): where an add's operand is an accumulating index_put into zeros of the add's own shape and dtype,
used by nothing else, the index_put takes the add's other operand as its base. Floating point adds the same terms
in another order, as the scatter's atomics already do from run to run.

It acts only where both gradients meet in one compiled graph: with Inductor, the whole model compiled at once.
Under DDP, whose compiled model is split into a graph per gradient bucket, the embedding and the classifier land in
different graphs and autograd adds the two outside them; there the pass finds nothing and changes nothing.
"""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

aten = torch.ops.aten
# The accumulating scatters that an embedding's backward decomposes into: (op, where its `accumulate` flag is).
SCATTERS = {aten.index_put.default: 3, aten._unsafe_masked_index_put_accumulate.default: None}


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_zeros(node) -> bool:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if node.target is aten.full.default:
        return len(node.args) > 1 and node.args[1] == 0
    return node.target in (aten.zeros.default, aten.zeros_like.default)


def _accumulates(node) -> bool:
    position = SCATTERS[node.target]
    if position is None:
        return True
    return bool(node.args[position] if len(node.args) > position else node.kwargs.get("accumulate", False))


def _scatter_into_zeros(node, like) -> bool:
    """Whether `node` is an accumulating scatter into zeros, of `like`'s shape and dtype, that only the add reads."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in SCATTERS:
        return False
    out, ref = _val(node), _val(like)
    return (len(node.users) == 1 and _accumulates(node) and _is_zeros(node.args[0])
            and out is not None and ref is not None and out.shape == ref.shape and out.dtype == ref.dtype
            and out.device == ref.device)


def fold(graph: torch.fx.Graph) -> int:
    """Rewrite `dense + scatter(zeros, ...)` as `scatter(dense, ...)` in `graph`; returns how many it rewrote."""
    folded = 0
    for add in list(graph.nodes):
        if add.op != "call_function" or add.target is not aten.add.Tensor or add.kwargs.get("alpha", 1) != 1:
            continue
        for dense, scatter in (add.args, add.args[::-1]):
            if isinstance(dense, torch.fx.Node) and dense is not scatter and _scatter_into_zeros(scatter, dense) \
                    and _val(add) is not None and _val(add).dtype == _val(dense).dtype:
                zeros = scatter.args[0]
                with graph.inserting_before(add):
                    into = graph.call_function(scatter.target, (dense, *scatter.args[1:]), dict(scatter.kwargs))
                into.meta = dict(add.meta)
                add.replace_all_uses_with(into)
                graph.erase_node(add)
                graph.erase_node(scatter)
                if not zeros.users:
                    graph.erase_node(zeros)
                folded += 1
                break
    return folded


class FoldTiedScatter(CustomGraphPass):
    """`fold` as the post-grad pass `torch.compile` takes (`post_grad_custom_post_pass`). `folded` counts the rewrites
    of the compilations it ran: none where Inductor's caches held the compiled graph already."""

    def __init__(self):
        self.folded = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.folded += fold(graph)

    def uuid(self):  # Inductor's cache key: the pass is this file's code
        return get_hash_for_files((__file__,))
