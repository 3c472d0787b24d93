"""The doc_windows part's FlexAttention BlockMask on this GPU, built three ways: from the tile lists by
BlockMask.from_kv_blocks (as gpt2ladder did before), by gpt2ladder's doc_window_block_mask (both sides' lists given to
BlockMask), and by create_block_mask. Prints whether each one's lists, built eagerly and inside torch.compile, equal
create_block_mask's, and how far each one's compiled attention lies from the masked softmax in fp32 (the output, and
the q, k, v gradients; relative, in norm), at GPT-2's attention size (4 x 12 heads x 1024 x 64, bf16). On an H100 with
torch 2.11 the first was 48% off though its lists were equal (benchmarks/records/2026-12-06_race-code-1500).
Run on a GPU: PYTHONPATH=src python benchmarks/micro/flex_block_mask.py"""

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from gpt2ladder.model.modern import (DOC_WINDOW, FLEX_BLOCK, doc_window_block_mask, doc_window_mask,
                                     doc_window_tiles, document_ids, masked_attention)

EOT = 50256
B, H, T, D = 4, 12, 1024, 64
FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
          "full_q_num_blocks", "full_q_indices")


def may_attend_for(docs):
    return lambda b, h, q, k: (k <= q) & (q - k < DOC_WINDOW) & (docs[b, q] == docs[b, k])


def argsort_lists(tiles):
    """(count, indices) as create_block_mask lists them: each query tile's marked tiles first, by an argsort."""
    count = tiles.sum(dim=-1, dtype=torch.int32)
    order = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return count[:, None].contiguous(), order[:, None].contiguous()


def from_kv_blocks(docs):
    partial, full = doc_window_tiles(docs, DOC_WINDOW, FLEX_BLOCK)
    return BlockMask.from_kv_blocks(*argsort_lists(partial), *argsort_lists(full), BLOCK_SIZE=FLEX_BLOCK,
                                    mask_mod=may_attend_for(docs))


def searched(docs):
    return create_block_mask(may_attend_for(docs), docs.shape[0], None, T, T, device=docs.device)


def gap(a, b) -> float:
    return round(((a.float() - b.float()).norm() / b.float().norm()).item(), 4)


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50000, (B, T), generator=gen)
    idx[0, 0] = idx[1, T // 3] = idx[2, 100] = idx[2, 700] = idx[3, 5] = idx[3, 900] = EOT
    docs = document_ids(idx, EOT).cuda()
    reference = searched(docs)
    ways = {"from_kv_blocks": from_kv_blocks, "doc_window_block_mask": doc_window_block_mask}
    for name, build in ways.items():
        def lists(d, build=build):
            return [getattr(build(d), f) for f in FIELDS]
        for how, fn in (("eager", lists), ("compiled", torch.compile(lists))):
            equal = all(torch.equal(x, getattr(reference, f)) for x, f in zip(fn(docs), FIELDS))
            print(f"{name}, built {how}: lists equal create_block_mask's: {equal}", flush=True)

    q, k, v, grad = (torch.randn(B, H, T, D, generator=gen).cuda() for _ in range(4))
    exact = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = masked_attention(*exact, doc_window_mask(docs), manual=True)  # fp32, the four-line attention
    ref.backward(grad)
    for name, build in {**ways, "create_block_mask": searched}.items():
        def attend(q, k, v, docs, build=build):
            return masked_attention(q, k, v, build(docs), manual=False)
        ins = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
        out = torch.compile(attend)(*ins, docs)
        out.backward(grad.to(torch.bfloat16))
        print(f"{name}, compiled: off the masked softmax by output {gap(out, ref)}, gradients "
              f"{[gap(a.grad, b.grad) for a, b in zip(ins, exact)]}", flush=True)


if __name__ == "__main__":
    main()
