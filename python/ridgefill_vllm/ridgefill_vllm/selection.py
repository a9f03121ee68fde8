"""Row selection inside vLLM's forward: the rows of each prompt that the fill makes exact, chosen as
:func:`ridgefill.prefill` chooses them (``ridgefill.select``: its :class:`~ridgefill.select.Planner`,
:class:`~ridgefill.select.AttentionScores` and :func:`~ridgefill.select.choose_rows` are used as they are).

A request selects in the step that schedules its last prompt token (with chunked prefill, the last chunk;
:func:`selecting_requests`). Its split states ``h_S`` of every prompt token are kept by KV-cache slot
(:class:`SplitStates`, written in every step with filled tokens), so rows of earlier chunks can run the
late layers again without their lower layers (whose K/V are in the cache). The plan is decided on the host
(NumPy row lists, as the reference's): the device is read once per round of scores.

1. The parts chosen up front: the lexical part from the prompt's token ids; a one-pass part (``by="predicted"``,
   ``select: "one-pass"``) from the attention of the tail's *predicted* late-layer queries over every row's
   predicted keys (the filled rows' in the paged cache, the tail's computed from their kept ``h_S``), with no
   late layer run (:meth:`ridgefill_vllm.llama.FillModel._predicted_scores`).
2. Pass 1: the tail and those rows run the late layers, as pseudo-requests (one per run of consecutive
   rows, with the request's block table and the sequence length ending at the run;
   :func:`ridgefill_vllm.plan.runs_metadata`),
   while the attention parts record, in each late layer, the attention of the last exact rows over the
   request's keys, read from the paged KV cache (:func:`read_keys`) after the layer wrote them.
3. The attention parts choose; if rows were added, pass 2 runs the tail and every chosen row through the
   late layers again: chosen rows overwrite their predicted K/V with exact ones, the tail attends to them.
   A selection without attention parts (one-pass) runs the late layers once, after step 1.

The heads the attention parts keep (``heads="induction"``) follow the induction scores the maps hold (format
version 2, found at calibration); for maps without them they are scored once per engine from the served weights
(:func:`induction_scores`, the reference's rule). The chosen rows of a request are kept by request id, so a
preempted and recomputed request reuses them (:class:`ChosenRows`).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ridgefill import defaults
from ridgefill.errors import InputError as RidgeFillInputError
from ridgefill.select import INDUCTION_PROBE, SETTINGS, as_selection, resolve_auto

from .errors import InputError

#: The default of the maps config's ``select`` entry: ``ridgefill``'s default, ``"auto"`` (the setting the maps
#: record, else ``"on"``).
DEFAULT_SELECT = defaults.SELECT


def is_auto(value) -> bool:
    """Whether a ``select`` setting is ``"auto"`` (resolved against the maps' recorded setting)."""
    return isinstance(value, str) and value.strip() == "auto"


def parse_select(value, recorded: str | None = None):
    """The selection of the maps config's ``select`` entry, as ``ridgefill.prefill`` reads its ``select``
    (:func:`ridgefill.select.resolve_auto`): ``"auto"`` (the default: ``recorded``, the setting the maps record,
    else ``"on"``), a named setting (``"on"``, ``"two-pass"``, ``"one-pass"``, ``"off"``) or a spec string
    (``"attention"``, ``"ngram"``, ``key=value`` parts joined by ``+``); a ``ridgefill.select.Selection``, or
    ``None`` for the plain fill.

    Raises:
        InputError: not a string, a bad spec (given, or recorded in the maps), or a query-agnostic part
            (``by=leverage``, ``"prompt"``: it needs the maps' calibration covariance, which the plugin does not
            read).
    """
    if not isinstance(value, str):
        raise InputError(f"ridgefill select={value!r} must be a string: one of {', '.join(SETTINGS)} (default "
                         f"{DEFAULT_SELECT!r}) or a spec")
    via = f" (the maps' recorded setting {recorded!r})" if is_auto(value) and recorded is not None else ""
    try:
        chosen = resolve_auto(value, recorded)
    except RidgeFillInputError as e:
        raise InputError(f"ridgefill select={value!r}{via}: {e}") from None
    if chosen is None:
        return None
    selection = as_selection(chosen)
    if any(p.by == "leverage" for p in selection.parts):
        raise InputError(f"ridgefill select={value!r}{via} has a query-agnostic part (by=leverage, 'prompt'), which "
                         "the vLLM plugin does not serve; use 'on' (or 'one-pass'), 'two-pass' or 'off'")
    return selection


def engine_selects(cfg: dict, maps_path: str) -> bool:
    """Whether an engine whose ``ridgefill`` config is ``cfg`` selects rows: its ``select`` setting, ``"auto"`` resolved
    against the setting recorded in the maps file at ``maps_path`` (:func:`~ridgefill_vllm.maps.recorded_select`). Read
    where the model is not at hand (the KV pool's sizing, the prefix-cache keys), after the model refused a bad setting.
    """
    from .maps import recorded_select

    value = cfg.get("select", DEFAULT_SELECT)
    return parse_select(value, recorded_select(maps_path) if is_auto(value) else None) is not None


def read_scores(scores: dict) -> dict:
    """Device score vectors ``{key: [N_key]}`` (float32; the requests' prompt lengths may differ) read to the host in
    one transfer, as host NumPy ``{key: [N_key]}`` (``ridgefill.select.read_scores`` for vectors of one length)."""
    if not scores:
        return {}
    keys = list(scores)
    host = torch.cat([scores[k].float() for k in keys]).cpu().numpy()
    return dict(zip(keys, np.split(host, np.cumsum([scores[k].numel() for k in keys])[:-1])))


@dataclass
class SelectingRequest:
    """A request that selects in this step: its row ``req`` in the step's batch, prompt length ``prompt``,
    first scheduled position ``computed``, its id and its prompt's token ids ``[prompt]`` int64 (host NumPy)."""

    req: int
    prompt: int
    computed: int
    req_id: str
    token_ids: np.ndarray


def selecting_requests(plan, tail: int) -> list[SelectingRequest]:
    """The requests of the step whose last prompt token is scheduled in it and that have filled rows
    (``prompt > tail``)."""
    if plan.num_prompt is None or plan.req_ids is None:
        return []
    out = []
    q = plan.query_lens.tolist()
    for r, (c, p) in enumerate(zip(plan.num_computed.tolist(), plan.num_prompt.tolist())):
        if p > tail and c < p <= c + q[r]:
            out.append(SelectingRequest(r, p, c, plan.req_ids[r], plan.token_ids[r, :p].numpy().astype(np.int64)))
    return out


class SplitStates:
    """The split state ``h_S`` of every computed token, by KV-cache slot: ``[slots, d]`` in the model's
    dtype, allocated at the first step with filled tokens (one ``d``-vector per KV-cache slot; beside a
    late layer's K/V, which hold ``2 · kv_heads · head_dim`` values per slot per layer; reserved when vLLM sizes
    the KV pool, :func:`ridgefill_vllm.memory.fill_bytes_per_block`)."""

    def __init__(self):
        self.h: Tensor | None = None

    def allocate(self, num_slots: int, like: Tensor) -> None:
        self.h = like.new_zeros((num_slots, like.shape[-1]))

    def write(self, slots: Tensor, h: Tensor) -> None:
        self.h[slots] = h

    def read(self, slots: Tensor) -> Tensor:
        return self.h[slots]


class ChosenRows:
    """The exact rows (sorted host ``int64`` positions) each request's selection chose, by request id, so that a
    preempted request recomputed later runs the same rows; the oldest are forgotten beyond ``capacity``."""

    def __init__(self, capacity: int = 4096):
        self.rows: OrderedDict[str, tuple[int, np.ndarray]] = OrderedDict()
        self.capacity = capacity

    def get(self, req_id: str, prompt: int) -> np.ndarray | None:
        got = self.rows.get(req_id)
        return got[1] if got is not None and got[0] == prompt else None

    def put(self, req_id: str, prompt: int, rows: np.ndarray) -> None:
        self.rows[req_id] = (prompt, np.asarray(rows, dtype=np.int64))
        self.rows.move_to_end(req_id)
        while len(self.rows) > self.capacity:
            self.rows.popitem(last=False)


def spans(positions: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive values of sorted host ``positions`` (``int64`` ``[n]``), as ``(start, end)``
    (``end`` exclusive)."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0:
        return []
    cut = np.flatnonzero(np.diff(positions) != 1) + 1
    starts, ends = positions[np.r_[0, cut]], positions[np.r_[cut - 1, positions.size - 1]] + 1
    return list(zip(starts.tolist(), ends.tolist()))


@functools.cache
def _cpu_key_layout(isa: str, dtype: torch.dtype, block_size: int, head_size: int) -> str:
    """How vLLM's CPU backend stores keys for ``isa``: ``"plain"`` (``[block, head, pos, dim]``) or
    ``"transposed"`` (``[block, head, dim, pos]``), found by writing known keys to a scratch cache.

    Raises:
        InputError: neither layout (a CPU kernel this plugin does not know).
    """
    from vllm import _custom_ops as ops

    n = block_size
    key = torch.arange(n * head_size, dtype=torch.float32).view(n, 1, head_size).to(dtype)
    cache = torch.zeros(1, 1, 2 * block_size, head_size, dtype=dtype)
    kc, vc = cache.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, key, kc, vc, torch.arange(n), isa, k_scale=1.0, v_scale=1.0,
                                   kv_cache_dtype="auto")
    block = kc[0, 0].contiguous()
    if torch.equal(block, key[:, 0]):
        return "plain"
    if torch.equal(block.reshape(head_size, block_size).t(), key[:, 0]):
        return "transposed"
    raise InputError(f"vLLM's CPU attention ISA {isa!r} stores keys in a layout RidgeFill's row selection cannot "
                     "read; set 'select': 'off' in the ridgefill config")


def read_keys(attn, block_table_row: Tensor, n: int, block_size: int) -> Tensor:
    """The keys (after RoPE) of positions ``0..n-1`` of one request in the paged KV cache of attention
    layer ``attn`` (vLLM's ``Attention``): ``[kv_heads, n, head_size]``."""
    cache = attn.kv_cache
    blocks = block_table_row[: (n + block_size - 1) // block_size].to(torch.int64)
    if cache.dim() == 4:  # vLLM's CPU backend: [blocks, kv_heads, block_size, 2 · head_size], seen as
        nb, heads, _, two_hd = cache.shape  # [blocks, kv_heads, 2 · block_size, head_size], keys first
        hd = two_hd // 2
        k = cache.view(nb, heads, 2 * block_size, hd)[blocks, :, :block_size]  # [b, H, bs, hd] storage of the keys
        if _cpu_key_layout(getattr(attn, "isa", "vec"), cache.dtype, block_size, hd) == "transposed":
            k = k.reshape(-1, heads, hd, block_size).transpose(-1, -2)
        return k.permute(1, 0, 2, 3).reshape(heads, -1, hd)[:, :n]
    # FlashAttention-style layout: [2, blocks, block_size, kv_heads, head_size]
    k = cache[0][blocks]  # [b, bs, H, hd]
    return k.permute(2, 0, 1, 3).reshape(k.shape[2], -1, k.shape[3])[:, :n]


class ScoringModel:
    """What ``ridgefill.select.AttentionScores`` reads of a model (the reference's adapter interface), for vLLM's
    decoder layers (``model.family`` says where their parts are, :class:`ridgefill_vllm.adapters.Family`): the query
    rows' queries at a late layer, the keys a row sees, head counts and the scale.

    ``num_heads``, ``num_kv_heads`` are the model's (every rank's heads: the kept heads are chosen among all of them,
    and ``num_heads // num_kv_heads`` maps a query head to its K/V head); :meth:`queries` returns this rank's
    ``local_heads``, whose indices the tensor-parallel code gives the scorers (:func:`ridgefill_vllm.tp.local_heads`).
    """

    def __init__(self, model, q_weights: dict[int, tuple[Tensor, Tensor | None]]):
        self.model, self.family = model, model.family
        attn = self.family.attention(model.layers[model.late_attn[0]])
        cfg = model.config
        self.num_layers = len(model.layers)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.local_heads = attn.num_heads
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.q_weights = q_weights

    def queries(self, layer: int, x: Tensor, positions: Tensor) -> Tensor:
        """``x`` ``[1, q, d]``: layer ``layer``'s input of rows at ``positions`` (passed where the reference passes its
        RoPE tables); returns ``[1, H, q, hd]`` for this rank's ``H`` heads: the Q rows of the QKV projection (and
        bias), the family's query transform (:meth:`Family.queries`), RoPE."""
        mod = self.model.layers[layer]
        attn = self.family.attention(mod)
        w, b = self.q_weights[layer]
        q = self.family.queries(attn, F.linear(self.family.input_norm(mod)(x[0]), w, b))
        q, _ = self.family.rope(attn)(positions, q.contiguous(), None)
        return q.view(1, q.shape[0], self.local_heads, self.head_dim).transpose(1, 2)

    def _window(self, layer: int) -> int | None:
        return getattr(self.family.attention(self.model.layers[layer]).attn, "sliding_window", None) or None

    def visible_keys(self, layer: int, positions: Tensor, n: int, visible, first_key: int = 0) -> Tensor | None:
        """``None`` (causal) in a full-attention layer; in a sliding-window layer (window ``w``) the mask ``[q, n]``
        over the keys at ``first_key .. first_key + n - 1`` that a row at position ``p`` sees: ``p - w < j ≤ p``."""
        window = self._window(layer)
        if not window:
            return None
        keys = torch.arange(first_key, first_key + n, device=positions.device)[None, :]
        return (keys <= positions[:, None]) & (keys > positions[:, None] - window)

    def key_range(self, layer: int, positions: np.ndarray, n: int) -> tuple[int, int]:
        """``(lo, hi)``: the keys rows at the sorted host ``positions`` can see among ``n``: ``0 .. max + 1``, in a
        sliding-window layer (window ``w``) from ``min − w + 1``."""
        window = self._window(layer)
        lo = max(int(positions[0]) - window + 1, 0) if window else 0
        return lo, min(n, int(positions[-1]) + 1)


@torch.inference_mode()
def induction_scores(model, length: int = INDUCTION_PROBE[0], seed: int = INDUCTION_PROBE[1]) -> Tensor:
    """Per layer and head, the induction score of the vLLM model body ``model`` (a :class:`~.llama.FillModel`,
    read through ``model.family``), ``[layers, H]`` float32 (this rank's heads): the reference's rule
    (``ridgefill.select.induction_scores``, the probe ``ridgefill.select.INDUCTION_PROBE``), for maps that do not hold
    the scores (format version 1): a seeded random sequence of ``length`` ids, repeated once, runs
    through the exact model: each layer's own forward, with its attention (vLLM's ``Attention``, which reads the
    paged cache) replaced by dense causal attention over the sequence (within the layer's sliding window, if any);
    a head's score is the mean attention each token of the second copy pays to the token after its first
    occurrence."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(vocab // 8, vocab, (length,), generator=g)
    device = model.embed_tokens.weight.device
    ids = torch.cat([base, base]).to(device)
    n = ids.numel()
    pos = torch.arange(n, device=device)
    second = torch.arange(length, n - 1, device=device)
    target = second - length + 1
    out = []

    def dense(attn, window):
        causal = torch.arange(n, device=device)[None, :] <= pos[:, None]
        if window:
            causal &= torch.arange(n, device=device)[None, :] > pos[:, None] - window

        def forward(q, k, v, *args, **kwargs):
            heads, kv_heads, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
            qh = q.view(n, heads, hd).transpose(0, 1)
            kh = k.view(n, kv_heads, hd).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
            vh = v.reshape(n, kv_heads, hd).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
            p = ((qh @ kh.transpose(-1, -2)).float() * attn.scaling).masked_fill(~causal, float("-inf")).softmax(-1)
            out.append(p[:, second, target].mean(-1).cpu())
            return (p.to(vh.dtype) @ vh).transpose(0, 1).reshape(n, heads * hd)

        return forward

    x, residual = model.embed_input_ids(ids), None
    for layer in model.layers:
        attn = model.family.attention(layer)
        a = attn.attn
        a.forward = dense(attn, getattr(a, "sliding_window", None))  # this instance only, until restored below
        try:
            x, residual = layer(pos, x, residual)
        finally:
            del a.forward
    return torch.stack(out)
