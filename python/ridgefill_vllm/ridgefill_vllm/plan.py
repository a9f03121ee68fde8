"""Which tokens of a vLLM step are filled and which are exact, and the late layers' attention metadata.

A vLLM step packs the scheduled tokens of several requests into one flat list (``query_start_loc``
marks where each request's tokens start). With chunked prefill and prefix caching off (the plugin
refuses them), a request with more than one scheduled token is a whole prompt being prefilled and a
request with one token is a decoding step. RidgeFill's row plan for a step is then, per request:
the last ``min(tail, q_len)`` scheduled tokens are **exact** (every decoding token is), the others
are **filled**. Exact tokens are always a suffix of their request's tokens, so the late layers'
attention for the exact tokens alone is the attention vLLM already computes for a request whose
earlier tokens are in the KV cache (as in chunked prefill): the late layers get metadata for that
subset of queries (:func:`subset_metadata`), the way vLLM's KV-sharing fast prefill (YOCO, Gemma 3n)
builds metadata for the last tokens of each request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class FillPlan:
    """The row plan of one step (token indices into the step's flat token list).

    Attributes:
        filled: ``[F]`` int64 indices of the filled tokens (on the model's device).
        exact: ``[E]`` int64 indices of the exact tokens (on the model's device).
        filled_slots: ``[F]`` the filled tokens' KV-cache slots (``slot_mapping[filled]``).
        exact_slots: ``[E]`` the exact tokens' KV-cache slots.
        num_tokens: tokens in the step, padding excluded.
        query_lens: ``[R]`` int64 CPU, scheduled tokens per request (1 for a decoding step).
        filled_prev: ``[F]`` int64 (on the model's device), the index of the token before each filled
            token in the same request, or ``-1`` for a request's first scheduled token: the previous split
            state that context maps read (zeros there, as before row 0 in ``ridgefill.fill.context_features``).
    """

    filled: Tensor
    exact: Tensor
    filled_slots: Tensor
    exact_slots: Tensor
    num_tokens: int
    query_lens: Tensor
    filled_prev: Tensor | None = None


def make_plan(query_start_loc_cpu: Tensor, slot_mapping: Tensor, tail: int) -> FillPlan | None:
    """The row plan of a step, or ``None`` when it has no filled token (decoding, short prompts).

    Args:
        query_start_loc_cpu: ``[R+1]`` int32 CPU, where each request's tokens start (last: the total).
        slot_mapping: ``[≥ total]`` int64, the KV-cache slot of each token.
        tail: exact tokens per prefilled prompt, ``≥ 1``.
    """
    qsl = query_start_loc_cpu.to(torch.int64)
    q_lens = qsl[1:] - qsl[:-1]
    n_filled = (q_lens - tail).clamp_min(0)
    if int(n_filled.sum()) == 0:
        return None
    total = int(qsl[-1])
    req = torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens)
    is_filled = (torch.arange(total) - qsl[:-1][req]) < n_filled[req]
    device = slot_mapping.device
    filled_cpu = is_filled.nonzero().flatten()
    prev = torch.where(filled_cpu > qsl[:-1][req[filled_cpu]], filled_cpu - 1, -1)  # -1: a request's first token
    filled, exact = filled_cpu.to(device), (~is_filled).nonzero().flatten().to(device)
    return FillPlan(filled, exact, slot_mapping[filled], slot_mapping[exact], total, q_lens, prev.to(device))


def subset_metadata(common, plan: FillPlan, tail: int):
    """vLLM ``CommonAttentionMetadata`` for the exact tokens only: the same requests, sequence
    lengths and block tables, queries restricted to each request's last ``min(tail, q_len)`` tokens."""
    qsl = common.query_start_loc_cpu.to(torch.int64)
    n_exact = (qsl[1:] - qsl[:-1]).clamp_max(tail)
    sub = torch.zeros_like(qsl)
    sub[1:] = torch.cumsum(n_exact, 0)
    sub = sub.to(common.query_start_loc_cpu.dtype)
    positions = common.positions[plan.exact] if common.positions is not None else None
    return dataclasses.replace(
        common, query_start_loc=sub.to(common.query_start_loc.device), query_start_loc_cpu=sub,
        num_actual_tokens=int(sub[-1]), max_query_len=int(n_exact.max()), slot_mapping=plan.exact_slots,
        positions=positions)
