"""Row selection under tensor parallelism: every rank chooses the rows one rank holding every head would.

With ``tensor_parallel_size = T`` each rank holds ``H / T`` query heads (rank ``r`` heads ``r·H/T ..
(r+1)·H/T − 1``, vLLM's split) and their K/V heads in its paged cache; the split states ``h_S`` and the
maps product are the same on every rank (vLLM's hidden states are whole on each rank). Selection's
attention parts (``ridgefill.select.AttentionScores``) score heads, so the ranks exchange:

- the induction scores of the heads (``[layers, H/T]`` per rank, gathered to ``[layers, H]``), once per
  engine, for maps that do not hold them (format version 2 does: the same on every rank), so every rank keeps
  the same ``top_heads`` heads of all ``H`` and scores its own of them (:func:`local_heads`);
- after each late layer with a kept head, each attention part's row scores (``[N]`` per request): the maximum
  over ranks (``heads="induction"``: the maximum over kept heads; ``"max"``: this layer's maximum over
  heads, added to the running sum) or their sum (``"sum"``).

Every rank then holds equal scores and chooses the same rows with ``ridgefill.select``'s own code. With
``T = 1`` every function here returns its input unchanged, without a collective.
"""

from __future__ import annotations

from torch import Tensor


def _world() -> tuple[int, int]:
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()


def gather_heads(scores: Tensor, device) -> Tensor:
    """Per-head scores of this rank's heads ``[layers, H/T]`` float32 (CPU) → every head's ``[layers, H]``
    (rank order, as vLLM splits the heads), the same on every rank, on the CPU; exchanged through ``device``
    (the model's: NCCL needs GPU tensors). ``scores`` itself when ``T = 1``."""
    world, _ = _world()
    if world == 1:
        return scores
    from vllm.distributed import tensor_model_parallel_all_gather

    return tensor_model_parallel_all_gather(scores.to(device).contiguous(), dim=-1).cpu()


def local_heads(scorers) -> None:
    """Give each ``AttentionScores`` (its ``heads``: per layer, the kept heads' indices among every head ``0 .. H-1``)
    this rank's kept heads, as indices among its own ``H/T`` (rank ``r`` holds heads ``r·H/T .. (r+1)·H/T − 1``), in
    place, before it scores; nothing when ``T = 1``. Its K/V head of local head ``h`` is then ``h // (H / KV)`` (the
    scorer's rule with the model's head counts): vLLM gives each rank ``KV/T`` K/V heads, or one when ``KV < T``."""
    world, rank = _world()
    if world == 1:
        return
    for sc in scorers:
        per = sc.adapter.num_heads // world
        sc.heads = [[h - rank * per for h in heads if rank * per <= h < (rank + 1) * per] for heads in sc.heads]


def combine_layer(scorer, before: Tensor) -> None:
    """After one late layer's ``scorer.add`` on every rank: set ``scorer.scores`` (``[N]`` float32) to what
    one rank with every head would hold, given ``before``, the scores before that layer (equal on every
    rank). A collective: every rank calls it for the same scorers and layers. Nothing when ``T = 1``."""
    world, _ = _world()
    if world == 1:
        return
    from vllm.distributed import tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce

    mode = scorer.select.heads
    if mode == "induction":  # running maximum over layers and kept heads: the maximum over ranks
        scorer.scores = tensor_model_parallel_all_gather(scorer.scores[None].contiguous(), dim=0).amax(0)
    elif mode == "max":  # this layer's maximum over heads, summed over layers
        delta = (scorer.scores - before)[None].contiguous()
        scorer.scores = before + tensor_model_parallel_all_gather(delta, dim=0).amax(0)
    else:  # "sum": over heads and layers
        scorer.scores = before + tensor_model_parallel_all_reduce((scorer.scores - before).contiguous())
