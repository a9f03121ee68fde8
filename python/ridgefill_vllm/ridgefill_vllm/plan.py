"""Which tokens of a vLLM step are filled and which are exact, and the late layers' attention metadata.

A vLLM step packs the scheduled tokens of several requests into one flat list (``query_start_loc``
marks where each request's tokens start). A request's scheduled tokens are consecutive positions
``c, c+1, …, c+q−1`` of its sequence, where ``c`` is its number of computed tokens: a whole prompt, one
chunk of a prompt (chunked prefill), or a decoding token. RidgeFill's rule is by position, as in
``ridgefill.prefill``: with ``P`` the request's prompt length, the token at position ``p`` is **filled**
when ``p < P − tail`` and **exact** otherwise. So the tail is the last ``tail`` tokens of the whole prompt,
however the prompt is chunked, and every generated token is exact (also when a preempted request is
recomputed). In every chunk the exact tokens are a suffix of the request's scheduled tokens, so the late
layers' attention for the exact tokens alone is the attention vLLM already computes for a request whose
earlier tokens are in the KV cache: the late layers get metadata for that subset of queries
(:func:`subset_metadata`; the same requests' sequence lengths and block tables), the way vLLM's KV-sharing
fast prefill (Gemma 3n) builds metadata for the last tokens of each request. Filled tokens of earlier
chunks wrote their predicted K/V when they were scheduled.

Context maps read the split state of the token before each filled token. Within a step it is the previous
scheduled token; for the first token of a later chunk, or the first token after a prefix-cache hit, it is a
token computed in an earlier step, whose split state the model keeps, keyed by its KV-cache slot
(:attr:`FillPlan.carry_out`, :attr:`FillPlan.carry_in`, :class:`CarriedStates`). The plan is computed from the
step's host tensors (query lengths, computed tokens, prompt lengths); what lives on the device (the slot mapping,
the block table) is only gathered from, so building a plan reads no device value.

Prefix caching: the hash of a KV block carries the fill (:func:`fill_block_key`: the maps, the tail, and how
many of the block's rows are filled), so a block is served from the cache only to a request that fills the
same rows of it after the same prefix; block hashes chain, so every later block of the request differs from
the exact model's too.

The prompt lengths and computed-token counts come from the model runner: :func:`set_step_requests` is
called by the hook :func:`install_runner_hook` installs, before each step's metadata is built.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import torch
from torch import Tensor

_STEP = threading.local()


def install_runner_hook() -> bool:
    """Wrap vLLM's (V1) ``GPUModelRunner._build_attention_metadata``, which the CPU runner inherits, so that
    each step records its requests' computed tokens and prompt lengths (:func:`set_step_requests`) before
    the attention metadata is built. Safe to call more than once. Returns whether the hook is installed."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return False
    original = GPUModelRunner._build_attention_metadata
    if getattr(original, "_ridgefill", False):
        return True

    def _build_attention_metadata(self, *args, **kwargs):
        batch = self.input_batch
        set_step_requests(batch.num_computed_tokens_cpu_tensor, batch.num_prompt_tokens_cpu_tensor,
                          list(batch.req_ids), batch.token_ids_cpu_tensor)
        return original(self, *args, **kwargs)

    _build_attention_metadata._ridgefill = True
    GPUModelRunner._build_attention_metadata = _build_attention_metadata
    return True


def set_step_requests(num_computed: Tensor, num_prompt: Tensor, req_ids: list[str] | None = None,
                      token_ids: Tensor | None = None) -> None:
    """Record, for the step whose attention metadata is being built, each request's computed tokens and
    prompt length (``[R]`` integer CPU tensors in the step's request order; padding rows may follow), and
    for row selection its id and token ids (``[≥ R, max_model_len]`` CPU, the prompt first)."""
    _STEP.requests = (num_computed, num_prompt)
    _STEP.ids = (req_ids, token_ids)


def step_request_ids() -> tuple[list[str] | None, Tensor | None]:
    """``(request ids, token ids)`` recorded by :func:`set_step_requests` (``(None, None)`` if none)."""
    return getattr(_STEP, "ids", (None, None))


def step_requests(num_reqs: int) -> tuple[Tensor, Tensor] | tuple[None, None]:
    """``(num_computed, num_prompt)`` of the step's first ``num_reqs`` requests, int64 CPU, or
    ``(None, None)`` where no hook records them (vLLM's model runner V2, which the plugin serves only with
    chunked prefill off: every prompt is then scheduled whole, from position 0)."""
    got = getattr(_STEP, "requests", None)
    if got is None:
        return None, None
    computed, prompt = got
    if computed.numel() < num_reqs or prompt.numel() < num_reqs:
        raise RuntimeError(f"the recorded step has {computed.numel()} requests, the metadata {num_reqs}")
    return computed[:num_reqs].to(torch.int64), prompt[:num_reqs].to(torch.int64)


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
        num_filled: ``[R]`` int64 CPU, filled tokens per request (a prefix of its scheduled tokens).
        filled_prev: ``[F]`` int64 (on the model's device): the index of the token before each filled token
            when it is in this step; ``-1`` at position 0 (zeros, as before row 0 in
            ``ridgefill.maps.context_features``); ``-2`` when it is the last token of the request's previous
            chunk (its split state is in the model's carry, :attr:`carry_in`).
        carry_in: ``[C]`` int64 (on the model's device): the filled tokens (indices into :attr:`filled`) whose
            previous token was computed in an earlier step (a later chunk's first token, the first token after a
            prefix-cache hit), or by another request in this step (a hit on blocks this step computes).
        carry_in_slots: ``[C]`` int64 (on the model's device): the KV-cache slots of those previous tokens.
        carry_out: ``[K]`` int64 (on the model's device): tokens whose split state a later step may read: the last
            scheduled token of a request whose next token is filled (read once, by its next chunk), and every
            filled token that ends a KV block (read by any request that hits the block in the prefix cache;
            kept until the block is written again).
        carry_out_slots: ``[K]`` int64 (on the model's device): their KV-cache slots.
        block_size: the KV block size (``None`` without a block table).
        num_computed: ``[R]`` int64 CPU, each request's position of its first scheduled token.
        num_prompt: ``[R]`` int64 CPU, each request's prompt length.
        req_ids, token_ids: the requests' ids and token ids (row selection; ``None`` where not recorded).
        common, build: the step's ``CommonAttentionMetadata`` and a function building the late layers'
            backend metadata from one (row selection runs the late layers on other rows).
    """

    filled: Tensor
    exact: Tensor
    filled_slots: Tensor
    exact_slots: Tensor
    num_tokens: int
    query_lens: Tensor
    num_filled: Tensor
    filled_prev: Tensor | None = None
    carry_in: Tensor | None = None
    carry_in_slots: Tensor | None = None
    carry_out: Tensor | None = None
    carry_out_slots: Tensor | None = None
    block_size: int | None = None
    num_computed: Tensor | None = None
    num_prompt: Tensor | None = None
    req_ids: list[str] | None = None
    token_ids: Tensor | None = None
    common: object = None
    build: object = None


def make_plan(query_start_loc_cpu: Tensor, slot_mapping: Tensor, tail: int, num_computed: Tensor | None = None,
              num_prompt: Tensor | None = None, block_table: Tensor | None = None,
              block_size: int | None = None, select: bool = False) -> FillPlan | None:
    """The row plan of a step, or ``None`` when it has no filled token (decoding, short prompts, tails).

    Args:
        query_start_loc_cpu: ``[R+1]`` int32 CPU, where each request's tokens start (last: the total).
        slot_mapping: ``[≥ total]`` int64, the KV-cache slot of each token.
        tail: exact tokens at the end of each prompt, ``≥ 1``.
        num_computed: ``[R]`` tokens each request had computed before this step (default: all zero,
            every request's scheduled tokens being its whole prompt).
        num_prompt: ``[R]`` each request's prompt length (default: its scheduled tokens).
        block_table: ``[R, blocks]`` block ids, and ``block_size``: needed when a request's first scheduled
            token is filled and not at position 0 (a later chunk), to find the previous token's slot.
        select: row selection is on: a step also gets a plan when it schedules prompt tokens of a request
            with filled rows (``prompt > tail``) but no filled token (a chunk of the tail), so that their
            split states are kept and the request selects when its last prompt token is scheduled.
    """
    qsl = query_start_loc_cpu.to(torch.int64)
    q_lens = qsl[1:] - qsl[:-1]
    computed = torch.zeros_like(q_lens) if num_computed is None else num_computed.to(torch.int64)
    prompt = q_lens.clone() if num_prompt is None else num_prompt.to(torch.int64)
    # positions computed .. computed+q-1; filled: p < prompt - tail
    n_filled = torch.minimum((prompt - tail - computed).clamp_min(0), q_lens)
    if int(n_filled.sum()) == 0 and not (select and bool(((computed < prompt) & (prompt > tail)).any())):
        return None
    total = int(qsl[-1])
    req = torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens)
    offset = torch.arange(total) - qsl[:-1][req]
    is_filled = offset < n_filled[req]
    device = slot_mapping.device
    filled_cpu = is_filled.nonzero().flatten()
    f_req, f_off = req[filled_cpu], offset[filled_cpu]
    first = f_off == 0
    prev = torch.where(first, torch.where(computed[f_req] > 0, -2, -1), filled_cpu - 1)
    carried = (prev == -2).nonzero().flatten()  # host tensors: the plan reads no device value
    if carried.numel() and (block_table is None or block_size is None):
        raise ValueError("a later chunk's first filled token needs the block table to find the previous token")
    c_req = f_req[carried]
    # whole chunk filled and more filled tokens to come: keep its last h_S
    chunk_end = (q_lens > 0) & (n_filled == q_lens) & (computed + q_lens < prompt - tail)
    keep = (qsl[1:] - 1)[chunk_end]
    if block_size is not None:  # filled tokens that end a KV block: a later request may hit the block in the
        ends = filled_cpu[(computed[f_req] + f_off + 1) % block_size == 0]  # prefix cache and read them
        keep = torch.cat([keep, ends])
    keep = torch.unique(keep)  # sorted
    filled, exact = filled_cpu.to(device), (~is_filled).nonzero().flatten().to(device)
    carry_out = keep.to(device)
    carry_in_slots = (slots_of(block_table, (computed[c_req] - 1).to(device), block_size, c_req.to(device))
                      if carried.numel() else torch.zeros(0, dtype=torch.int64, device=device))
    return FillPlan(filled, exact, slot_mapping[filled], slot_mapping[exact], total, q_lens, n_filled,
                    prev.to(device), carried.to(device), carry_in_slots, carry_out, slot_mapping[carry_out].to(torch.int64),
                    block_size, computed, prompt)


def slots_of(block_table: Tensor, positions: Tensor, block_size: int, rows: Tensor | None = None) -> Tensor:
    """KV-cache slots (int64, on ``block_table``'s device) of ``positions`` (int64 ``[n]``) of the one request whose
    block table row ``block_table`` is (``[blocks]``), or with ``rows`` (``[n]``) of the requests in those rows of
    ``block_table`` (``[requests, blocks]``). A gather on the device: no host read."""
    blocks = (block_table[positions // block_size] if rows is None
              else block_table[rows, positions // block_size]).to(torch.int64)
    return blocks * block_size + positions % block_size


class CarriedStates:
    """The split states a later step reads with context maps (:attr:`FillPlan.carry_out`, :attr:`FillPlan.carry_in`),
    for the plain fill (with row selection the model keeps every token's, :class:`ridgefill_vllm.selection.SplitStates`):
    one ``d``-vector per KV block, the last state written for a token of that block (a chunk's last token until the
    next chunk reads it; a filled block's last token until the block is written again), with the slot it belongs to.
    Allocated once for the whole KV pool (:meth:`allocate`; reserved when vLLM sizes the pool,
    :func:`ridgefill_vllm.memory.fill_bytes_per_block`): a request that ends or is aborted leaves nothing to free."""

    def __init__(self):
        self.h: Tensor | None = None
        self.slot: Tensor | None = None
        self.block_size = 1

    def allocate(self, num_blocks: int, block_size: int, like: Tensor) -> None:
        """``[num_blocks, d]`` states in ``like``'s dtype and device, and ``[num_blocks]`` int64 slots (−1: none)."""
        self.h = like.new_zeros((num_blocks, like.shape[-1]))
        self.slot = torch.full((num_blocks,), -1, dtype=torch.int64, device=like.device)
        self.block_size = block_size

    def write(self, slots: Tensor, h: Tensor) -> None:
        """Keep ``h`` ``[K, d]``, the states of the tokens at ``slots`` ``[K]`` (at most one per block)."""
        rows = slots // self.block_size
        self.h[rows] = h
        self.slot[rows] = slots

    def read(self, slots: Tensor) -> tuple[Tensor, Tensor]:
        """The kept states of the tokens at ``slots`` ``[C]``: ``([C, d], [C] bool: kept)``; no host read."""
        rows = slots // self.block_size
        return self.h[rows], self.slot[rows] == slots


def carried_states(plan: FillPlan, h: Tensor, read) -> Tensor:
    """The split states ``[C, d]`` of the previous tokens of the plan's carried filled tokens (:attr:`FillPlan.carry_in`)
    given this step's ``h`` ``[tokens, d]``: a token of this step (another request's, whose blocks this request hit in the
    prefix cache) from ``h``, any other from ``read(slots) -> ([C, d], [C] bool kept)``. One host read per step with
    carried tokens (that every state was kept).

    Raises:
        RuntimeError: a state was not kept (a bug of the plugin: the step that computed the token kept none).
    """
    slots = plan.carry_in_slots
    kept_h, kept = read(slots)
    here = plan.carry_out_slots[None, :] == slots[:, None]  # [C, K]: the previous token is computed in this step
    in_step = here.any(1)
    got = torch.where(in_step[:, None], h[plan.carry_out[here.to(torch.int64).argmax(1)]] if here.shape[1] else kept_h,
                      kept_h)
    if not bool((in_step | kept).all()):
        raise RuntimeError("RidgeFill: the split state of a token before the first filled token of a chunk was not "
                           "kept; this is a bug of the plugin")
    return got


def subset_metadata(common, plan: FillPlan):
    """vLLM ``CommonAttentionMetadata`` for the exact tokens only: the requests that have exact tokens in
    this step, with their sequence lengths and block tables, queries restricted to those tokens (each
    request's last ``q_len − num_filled`` scheduled tokens): :func:`runs_metadata` with one run per request."""
    n_exact = plan.query_lens - plan.num_filled
    keep = (n_exact > 0).nonzero().flatten()
    end = plan.num_computed[keep] + plan.query_lens[keep]
    positions = common.positions[plan.exact] if common.positions is not None else None
    return runs_metadata(common, keep, end - n_exact[keep], end, plan.exact_slots, positions)


def runs_metadata(common, reqs: Tensor, starts: Tensor, ends: Tensor, slots: Tensor, positions: Tensor | None):
    """vLLM ``CommonAttentionMetadata`` for runs of consecutive positions as pseudo-requests: run ``i`` holds positions
    ``starts[i] .. ends[i] − 1`` of the request in batch row ``reqs[i]`` (int64 CPU ``[n]`` each), with that request's
    block table and the sequence length ``ends[i]`` (its queries attend causally to the request's cache up to the run's
    end). ``slots``/``positions``: the runs' tokens in order (on the device). The exact tokens of a step
    (:func:`subset_metadata`) and row selection's runs (:meth:`ridgefill_vllm.llama.FillModel._late_run`) both use
    it; the host copies (``query_start_loc_cpu``, ``seq_lens_cpu_upper_bound``) are the runs' own."""
    q = (ends - starts).to(torch.int64)
    qsl = torch.zeros(reqs.numel() + 1, dtype=torch.int64)
    qsl[1:] = torch.cumsum(q, 0)
    qsl = qsl.to(common.query_start_loc_cpu.dtype)
    seq = ends.to(common.seq_lens.dtype)

    def rows(x):
        if x is None:
            return None
        return x[reqs.to(x.device)] if isinstance(x, Tensor) else x[reqs.numpy()]

    return dataclasses.replace(
        common, query_start_loc=qsl.to(common.query_start_loc.device), query_start_loc_cpu=qsl,
        seq_lens=seq.to(common.seq_lens.device), num_reqs=reqs.numel(), num_actual_tokens=int(qsl[-1]),
        max_query_len=int(q.max()) if q.numel() else 0, max_seq_len=int(ends.max()) if ends.numel() else 0,
        block_table_tensor=rows(common.block_table_tensor), slot_mapping=slots, positions=positions,
        causal=rows(common.causal) if isinstance(common.causal, Tensor) else common.causal,
        encoder_seq_lens=rows(common.encoder_seq_lens), encoder_seq_lens_cpu=rows(common.encoder_seq_lens_cpu),
        dcp_local_seq_lens=None, dcp_local_seq_lens_cpu_upper_bound=None, seq_lens_cpu_upper_bound=seq.clone(),
        is_prefilling=rows(common.is_prefilling), req_idx=rows(common.req_idx),
        rswa_prefix_lens=rows(common.rswa_prefix_lens), replayssm_decode_base_cpu=rows(common.replayssm_decode_base_cpu),
        _num_computed_tokens_cache=None, _token_to_req_indices_cache=None)
