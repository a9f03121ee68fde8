"""The fill in vLLM: :class:`FillModel` (every family) and ``RidgeFillLlamaForCausalLM``.

A RidgeFill class is vLLM's own ``...ForCausalLM`` (``LlamaForCausalLM`` here; the other families in
:mod:`ridgefill_vllm.families`) with a different prefill of the late layers ``l > S`` (paper,
"Approach"; the reference is :func:`ridgefill.prefill` with ``mode="ridge"``). In a step with filled
tokens (:mod:`ridgefill_vllm.plan`):

1. Layers ``0..S`` run exactly for every token (vLLM's own layers); ``h_S`` is the input of layer
   ``S+1`` (vLLM keeps it as ``hidden + residual``).
2. For each late layer ``l``, the filled tokens' keys and values are computed from the prediction
   ``x̂_l = h_S W_l + b_l``, through the layer's own input norm, K/V projection (the K/V rows of
   its fused QKV weight and bias), per-head key norm where the family has one, and RoPE at the token's
   position (what differs per family: :mod:`ridgefill_vllm.adapters`), and written to vLLM's paged KV cache with
   the attention backend's own cache write. Filled tokens compute no query, no attention, no output
   projection and no MLP in the late layers.
3. The exact tokens (the last ``tail`` positions of each prompt, every decoding token; chunked
   prefill schedules the same positions as exact, :mod:`ridgefill_vllm.plan`) run every late layer in
   full, with attention metadata for their queries only (:mod:`ridgefill_vllm.backend`), attending
   to the paged cache that holds the filled tokens' predicted K/V (of this and earlier chunks) and the
   exact tokens' own K/V.

4. Row selection (``select``, ``auto`` by default: the maps' recorded setting, else ``on``;
   :mod:`ridgefill_vllm.selection`): in the step that schedules a request's last prompt token, the reference's
   selection chooses more exact rows on the host (the lexical part from the token ids; one-pass parts from the
   tail's predicted queries over the predicted keys, before the late layers; the attention parts from pass 1's
   attention over the paged cache), and the tail and the chosen rows run the late layers again from their kept split
   states (pass 2; once, after the choice, without attention parts). With tensor parallelism the ranks exchange head
   and row scores so that all choose the same rows (:mod:`ridgefill_vllm.tp`).

5. Hybrid models (Qwen3-Next, :meth:`FillModel._late_layers`): a late linear-attention layer runs its input
   norm and mixer over every token of the step, on ``x̂_l`` for filled tokens and on the true input for exact
   tokens, so the filled tokens advance its conv and recurrent states and the exact tokens continue from them;
   its output, residual and MLP are computed for the exact tokens only.

The step's output hidden states are those of the exact tokens; filled rows are zero (the sampler
reads the last token of each request, which is exact once the prompt is complete; what it samples after
a partial prefill, vLLM discards). Decoding steps and steps without filled tokens
run vLLM's plain forward. Without maps the model is vLLM's own.

Settings (the ``ridgefill`` entry of the model config, e.g. through ``hf_overrides``): ``maps``, the
path of a maps file from ``ridgefill calibrate``; ``tail``, exact tokens per prompt (default 256);
``select``, row selection as ``ridgefill.prefill`` takes it (``"auto"``, the default: the setting the maps record,
else ``"on"``; ``"two-pass"``, ``"one-pass"``, ``"off"``: the plain fill; or a spec string).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from collections.abc import Iterable
from itertools import islice

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm.compilation.decorators import ignore_torch_compile
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel

from .adapters import FAMILIES, LLAMA, Family
from .backend import fill_backend
from .errors import InputError
from .maps import SAMPLE_VALUES, FillMaps, load_fill_maps, resolve_maps_path
from .plan import CarriedStates, carried_states, install_runner_hook, runs_metadata, slots_of
from .prefix import DEFAULT_TAIL
from .selection import (DEFAULT_SELECT, ChosenRows, ScoringModel, SplitStates, induction_scores, is_auto,
                        parse_select, read_keys, read_scores, selecting_requests, spans)
from .tp import combine_layer, gather_heads, local_heads

logger = init_logger(f"vllm.{__name__}")  # under vLLM's logger: its handler, format and VLLM_LOGGING_LEVEL

#: Environment variable naming a file to which each step with filled tokens appends one JSON line
#: (``{"query_lens": [...], "filled": F, "exact": E, "num_filled": [...], "num_computed": [...], "carried": C,
#: "written": [...]}``): how vLLM batched the requests, where each request's scheduled tokens start, how many
#: chunks read a carried split state, and how many filled tokens each late layer wrote (fewer in sliding-window
#: layers); a step in which requests select adds a line ``{"selected": {request id: rows}, "reused": [request ids],
#: "passes": P}``: the rows each chose beyond its tail, the requests recomputed with the rows chosen before, and the
#: passes of the late layers (tests, debugging).
STEP_LOG_ENV = "RIDGEFILL_VLLM_STEP_LOG"


def fill_settings(hf_config) -> tuple[str, int, str] | None:
    """``(maps path, tail, select)`` from ``hf_config.ridgefill`` (a dict), or ``None`` without maps.

    Raises:
        InputError: ``ridgefill`` is not a dict, has unknown keys, ``tail`` is not an integer ``≥ 1``, or
            ``select`` is not a string.
    """
    cfg = getattr(hf_config, "ridgefill", None)
    if cfg is None:
        return None
    if not isinstance(cfg, dict) or set(cfg) - {"maps", "tail", "select"}:
        raise InputError(f"the model config's 'ridgefill' entry must be a dict with keys 'maps' (a maps file from "
                         f"`ridgefill calibrate`), 'tail' (exact tokens per prompt) and 'select' (row selection, "
                         f"'auto', 'on', 'two-pass', 'one-pass' or 'off'); got {cfg!r}")
    tail = cfg.get("tail", DEFAULT_TAIL)
    if not isinstance(tail, int) or isinstance(tail, bool) or tail < 1:
        raise InputError(f"ridgefill tail={tail!r} must be an integer ≥ 1 (exact tokens at the end of each prompt)")
    select = cfg.get("select", DEFAULT_SELECT)
    if not isinstance(select, str):
        raise InputError(f"ridgefill select={select!r} must be a string: 'auto' (the default), 'on', 'two-pass', "
                         "'one-pass', 'off', or a spec")
    if cfg.get("maps") is None:
        return None
    return str(cfg["maps"]), tail, select


def check_engine(vllm_config: VllmConfig, family: Family = LLAMA) -> None:
    """Refuse engine settings the fill cannot serve, naming the setting to change.

    Raises:
        InputError: chunked prefill or prefix caching with the model runner V2, LoRA, full CUDA graphs for
            steps that prefill (``cudagraph_mode`` ``FULL``), data parallelism with expert parallelism, a KV
            connector, speculative decoding, pipeline or decode-context parallelism, quantized weights, sliding-window layers in a family whose windows are
            not served, or what ``family`` refuses of this model (:meth:`ridgefill_vllm.adapters.Family.check`).
    """
    sched, par = vllm_config.scheduler_config, vllm_config.parallel_config
    problems = []
    if getattr(vllm_config, "use_v2_model_runner", False):
        if sched.enable_chunked_prefill:
            problems.append("chunked prefill is on with vLLM's model runner V2, whose prompt lengths the plugin does "
                            "not read yet: set VLLM_USE_V2_MODEL_RUNNER=0, or pass enable_chunked_prefill=False "
                            "(`--no-enable-chunked-prefill`) and max_num_batched_tokens ≥ max_model_len")
        if vllm_config.cache_config.enable_prefix_caching:
            problems.append("prefix caching is on with vLLM's model runner V2, whose computed-token counts the plugin "
                            "does not read yet (a prefix-cache hit starts a prompt past position 0): set "
                            "VLLM_USE_V2_MODEL_RUNNER=0, or pass enable_prefix_caching=False "
                            "(`--no-enable-prefix-caching`)")
    if getattr(vllm_config, "lora_config", None) is not None:
        problems.append("LoRA adapters are enabled (enable_lora): the late layers run on subsets of the step's rows "
                        "and on pseudo-requests, which vLLM's LoRA batching would map to other requests' adapters, and "
                        "the filled K/V use the base weights: serve without enable_lora (`--enable-lora`), or without "
                        "the ridgefill maps")
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    if mode is not None and hasattr(mode, "mixed_mode") and mode.mixed_mode().name == "FULL":
        problems.append(f"cudagraph_mode is {mode.name}, which replays full CUDA graphs for steps that prefill, "
                        "captured without a row plan: pass compilation_config={'cudagraph_mode': 'FULL_AND_PIECEWISE'} "
                        "(or 'FULL_DECODE_ONLY'), or enforce_eager=True (`--enforce-eager`)")
    if getattr(par, "data_parallel_size", 1) > 1 and getattr(par, "enable_expert_parallel", False):
        problems.append(f"data parallelism ({par.data_parallel_size} ranks) with expert parallelism: the MoE layers' "
                        "collectives need every rank to run each layer the same number of times, and a step with "
                        "filled tokens runs the late layers for its exact rows only (and again for row selection): "
                        "pass enable_expert_parallel=False, or data_parallel_size=1")
    kv_transfer = getattr(vllm_config, "kv_transfer_config", None)
    if kv_transfer is not None and getattr(kv_transfer, "kv_connector", None):
        problems.append(f"the KV connector {kv_transfer.kv_connector} is configured (kv_transfer_config, or "
                        "kv_offloading_size): KV blocks it loads or saves carry no split states, and its prefix hashes "
                        "do not carry the fill's block key: remove kv_transfer_config and kv_offloading_size")
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding is configured: remove speculative_config")
    if par.pipeline_parallel_size > 1:
        problems.append(f"pipeline parallelism ({par.pipeline_parallel_size} stages): use tensor parallelism only")
    if getattr(par, "decode_context_parallel_size", 1) > 1 or getattr(par, "prefill_context_parallel_size", 1) > 1:
        problems.append("context parallelism is configured: turn it off")
    if vllm_config.quant_config is not None:
        problems.append("the weights are quantized: serve unquantized (float32, bfloat16 or float16) weights")
    hf_config = vllm_config.model_config.hf_config
    served_types = {"full_attention"} | ({"linear_attention"} if family.recurrent else set())
    if not family.sliding_windows and getattr(hf_config, "layer_types", None) and any(
            t not in served_types for t in hf_config.layer_types):
        problems.append(f"the model has sliding-window layers, which this plugin does not fill for {family.name} "
                        "models yet (it does for Gemma 3)")
    problems += family.check(vllm_config)
    if problems:
        raise InputError("RidgeFill cannot serve with these engine settings: " + "; ".join(problems))


def served_selection(selection, family: Family, vllm_config: VllmConfig):
    """``selection`` (a ``ridgefill.select.Selection``, or ``None``: the plain fill) when ``family`` serves it for this
    model.

    Raises:
        InputError: row selection the family refuses for this model
            (:meth:`~ridgefill_vllm.adapters.Family.check_selection`).
    """
    refused = family.check_selection(vllm_config) if selection is not None else []
    if refused:
        raise InputError(f"RidgeFill cannot serve row selection for this {family.name} model: " + "; ".join(refused))
    return selection


#: Attention backends whose paged key layout row selection's key reader knows (:func:`~.selection.read_keys`).
SELECTION_BACKENDS = ("CPU_ATTN", "FLASH_ATTN")


def check_selection_cache(backend: str, cache_dtype: str) -> list[str]:
    """What of the KV cache row selection cannot read (empty: all of it), each naming the setting to change: a
    backend whose key layout the key reader does not know (:data:`SELECTION_BACKENDS`), an fp8 KV cache (its keys would
    be read without their scale)."""
    out = []
    if backend not in SELECTION_BACKENDS:
        out.append(f"the attention backend {backend} stores keys in a layout row selection's key reader does not read "
                   f"(it reads {', '.join(SELECTION_BACKENDS)}): pass attention_backend='FLASH_ATTN' "
                   "(`--attention-backend FLASH_ATTN`), or set 'select': 'off' in the ridgefill config")
    if str(cache_dtype).startswith("fp8"):
        out.append(f"the KV cache is {cache_dtype}, whose keys row selection would read without their scale: pass "
                   "kv_cache_dtype='auto' (`--kv-cache-dtype auto`), or set 'select': 'off' in the ridgefill config")
    return out


class FillModel:
    """The fill prefill of the late layers (module docstring), mixed into a vLLM model body (``LlamaModel``,
    ``Qwen2Model``, ``Qwen3Model``, ``Qwen3MoeModel``, ``MistralModel``, ``Gemma3Model``, ``Qwen3NextModel``:
    ``embed_input_ids``, ``layers``, ``norm``, ``config``, layers called through ``family.call`` returning
    ``(hidden, residual)`` with the layer input ``hidden + residual``). What differs per family is read through
    ``self.family`` (:class:`ridgefill_vllm.adapters.Family`). :func:`attach_fill`
    gives a built body this mixin and calls :meth:`init_fill`."""

    def init_fill(self, vllm_config: VllmConfig, family) -> None:
        """Read the ``ridgefill`` settings and the maps, check the engine and the family, and give the late
        layers the fill's attention backend. Without maps, leaves the body as vLLM's.

        Raises:
            InputError: bad settings, engine settings the fill cannot serve (:func:`check_engine`), a model
                the family cannot fill (:meth:`ridgefill_vllm.adapters.Family.check`), row selection the family
                refuses for this model (:meth:`~ridgefill_vllm.adapters.Family.check_selection`), row selection on a KV
                cache its key reader cannot read (:func:`check_selection_cache`).
            MapsMismatchError, MapsFormatError: maps of another model, or a bad maps file.
        """
        self.family = family
        settings = fill_settings(self.config)
        self.fill_maps: FillMaps | None = None
        self.tail = settings[1] if settings else DEFAULT_TAIL
        self.selection = None
        if settings is None:
            return
        check_engine(vllm_config, family)
        setting = settings[2]
        if not is_auto(setting):  # before the maps load: a bad setting fails fast ("auto" reads the maps)
            self.selection = served_selection(parse_select(setting), family, vllm_config)
        install_runner_hook()  # each step records its prompt lengths for the row plan (ridgefill_vllm.plan)
        maps_path = resolve_maps_path(settings[0], getattr(vllm_config.model_config, "model", None))
        maps = load_fill_maps(maps_path)
        maps.check_shape(self.config.num_hidden_layers, self.config.hidden_size, self.config.num_attention_heads)
        if is_auto(setting):
            self.selection = served_selection(parse_select(setting, maps.select), family, vllm_config)
        self.fill_maps = maps
        self.split = maps.split
        logger.info("RidgeFill: maps %s (split S=%d, %s maps), tail %d, row selection %s%s", maps_path, maps.split,
                    "context" if maps.context else "plain", self.tail, self.selection or "off",
                    f" (select 'auto': the maps' setting {maps.select!r})" if is_auto(setting) and maps.select
                    else " (select 'auto': 'on')" if is_auto(setting) else "")
        dtype, device = vllm_config.model_config.dtype, vllm_config.device_config.device
        # plain attributes, not parameters: the checkpoint loader must not look for them
        self._w = maps.weights.to(device=device, dtype=dtype)
        self._b = maps.biases.to(device=device, dtype=dtype)
        self._kv: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # late layers' K/V weights, set at load
        # context maps, plain fill: h_S of tokens a later step reads (a chunk's last token, a filled block's last
        # token), one d-vector per KV block (FillPlan.carry_out / carry_in); with row selection, self._states
        self._carry = CarriedStates()
        self._q: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}  # late layers' Q rows (selection)
        self._states = SplitStates()  # h_S by KV slot (selection reruns rows of earlier chunks)
        self._chosen = ChosenRows()  # each request's exact rows, reused when a preempted request is recomputed
        self._scoring: ScoringModel | None = None
        self._induction: torch.Tensor | None = None  # [L, H] induction scores of every head (selection's kept heads)
        self.late = list(range(self.split + 1, self.config.num_hidden_layers))
        # the late layers with attention (all of them but a hybrid model's linear-attention layers)
        self.late_attn = [i for i in self.late if not family.is_recurrent(self.layers[i])]
        if not self.late_attn:
            raise InputError(f"the maps' split S={self.split} leaves no full-attention layer after it (layers "
                             f"{self.late} are linear-attention layers): fit maps at a smaller split")
        self.late_names = [family.attention(self.layers[i]).attn.layer_name for i in self.late_attn]
        # each late layer's sliding window (None: full attention): the filled rows no exact row sees get no K/V
        self._windows = [getattr(family.attention(self.layers[i]).attn, "sliding_window", None) for i in self.late_attn]
        for i in self.late_attn:
            attn = family.attention(self.layers[i]).attn
            refused = check_selection_cache(attn.attn_backend.get_name(), vllm_config.cache_config.cache_dtype) \
                if self.selection is not None else []
            if refused:
                raise InputError("RidgeFill cannot serve row selection with these engine settings: " + "; ".join(refused))
            if attn.attn_backend.forward_includes_kv_cache_update:
                raise InputError(f"the attention backend {attn.attn_backend.get_name()} writes the KV cache inside "
                                 "its forward; RidgeFill needs a backend with a separate cache write (vLLM's CPU, "
                                 "FlashAttention, FlashInfer and Triton backends have one)")
            attn.attn_backend = fill_backend(attn.attn_backend, self.tail, self.selection is not None)

    def capture_kv_weights(self) -> None:
        """Keep the K/V rows of each late layer's fused QKV weight (and bias): vLLM's CPU build may repack
        the weights for its GEMM kernels after loading, so they are copied right after loading (or, with
        ``load_format="dummy"``, which skips ``load_weights``, at the first fill step).

        Raises:
            InputError: the QKV weights were already repacked (CPU build with ``load_format="dummy"``).
        """
        self._kv = []
        for i in self.late_attn:
            attn = self.family.attention(self.layers[i])
            w = self.family.qkv(attn).weight
            q_rows = self.family.q_rows(attn)  # Q rows (and a hybrid model's output-gate rows) before K, V
            if w.ndim != 2 or w.shape[0] != q_rows + 2 * attn.kv_size:
                raise InputError("the late layers' QKV weights were repacked before RidgeFill could copy their K/V "
                                 "rows; load real weights (not load_format='dummy') on this platform")
            bias = getattr(self.family.qkv(attn), "bias", None)
            if self.selection is not None:  # the query rows' queries, for the attention parts' scores
                self._q[i] = (w[:attn.q_size].detach().clone(), None if bias is None else bias[:attn.q_size].detach().clone())
            w = w[q_rows:].detach().clone()  # [2·kv_size (this rank), d]
            self._kv.append((w, None if bias is None else bias[q_rows:].detach().clone()))

    def _filled_kv(self, j: int, h: torch.Tensor, positions: torch.Tensor,
                   m: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Late attention layer ``self.late_attn[j]``: the predicted keys (after RoPE) and values ``[F, kv_size]`` of
        tokens at ``positions`` from ``x̂ = h W + b`` (the maps of late layer ``m``, default ``j``: the same layer in a
        model without linear-attention layers; ``h`` ``[F, f]``: the tokens' ``h_S``, beside the previous token's for
        context maps), through the layer's input norm, K/V projection, key norm and RoPE."""
        layer = self.layers[self.late_attn[j]]
        family = self.family
        attn = family.attention(layer)
        m = j if m is None else m
        x_hat = torch.addmm(self._b[m], h, self._w[m])  # [F, d]
        w, bias = self._kv[j]
        k, v = F.linear(family.input_norm(layer)(x_hat), w, bias).split([attn.kv_size, attn.kv_size], dim=-1)
        k = family.keys(attn, k)  # per-head k-norm before RoPE where the family has one (Qwen3, Gemma 3)
        k, _ = family.rope(attn)(positions, k.contiguous(), None)  # RoPE on the keys (passed as the query)
        return k, v

    def _write_filled(self, j: int, h: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      m: int | None = None) -> None:
        """Late attention layer ``self.late_attn[j]``: K/V of the filled tokens (:meth:`_filled_kv`) into the paged
        cache at ``slots``."""
        if h.shape[0] == 0:
            return
        k, v = self._filled_kv(j, h, positions, m)
        a = self.family.attention(self.layers[self.late_attn[j]]).attn
        a.impl.do_kv_cache_update(a, k.view(-1, a.num_kv_heads, a.head_size), v.reshape(-1, a.num_kv_heads,
                                  a.head_size_v), a.kv_cache, slots)

    def _allocate_states(self, plan, like: torch.Tensor) -> None:
        """Allocate, at the first step with filled tokens, what the fill keeps for the whole KV pool (its size:
        :func:`ridgefill_vllm.memory.fill_bytes_per_block`, reserved when vLLM sized the pool): with row selection
        every token's ``h_S`` (one ``d``-vector per KV slot, :class:`~ridgefill_vllm.selection.SplitStates`), for the
        plain fill with context maps the carried states (one per KV block, :class:`~ridgefill_vllm.plan.CarriedStates`).
        """
        if self._states.h is not None or self._carry.h is not None:
            return
        a = self.family.attention(self.layers[self.late_attn[0]]).attn
        slots = a.kv_cache.numel() // (2 * a.num_kv_heads * a.head_size)
        if self.selection is not None:
            self._states.allocate(slots, like)
        elif self.fill_maps.context:
            self._carry.allocate(slots // plan.block_size, plan.block_size, like)

    def fill_state_bytes(self) -> int:
        """Bytes of what the fill keeps for the KV pool (:meth:`_allocate_states`; 0 before the first fill step)."""
        return sum(t.numel() * t.element_size() for t in (self._states.h, self._carry.h, self._carry.slot)
                   if t is not None)

    def _plan(self):
        if self.fill_maps is None:
            return None
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):  # micro-batches: not filled
            return None
        entry = metadata.get(self.late_names[0]) if isinstance(metadata, dict) else None
        return getattr(entry, "ridgefill_plan", None)

    def _layer_plans(self, plan) -> list:
        """Each late layer's row plan: the same rows, but the slots of the layer's own KV-cache group (a model
        with sliding-window and full layers, Gemma 3, has one block table per group)."""
        metadata = get_forward_context().attn_metadata
        return [getattr(metadata.get(name), "ridgefill_plan", None) or plan for name in self.late_names]

    def _seen_filled(self, plan, pos_f: torch.Tensor):
        """A function of a layer's sliding window ``w`` (``None``: full attention) giving the mask ``[F]`` of the
        filled tokens some exact row of their request sees in that layer (``None``: all of them). The exact rows
        of a prompt of ``P`` tokens are positions ``≥ P − tail``, and the row at ``q`` sees keys in
        ``(q − w, q]``, so a filled row at ``p`` is seen when ``p > P − tail − w`` (as the reference's
        ``needed_filled_rows``)."""
        if plan.num_prompt is None or not any(w for w in self._windows):
            return lambda w: None
        prompt = torch.repeat_interleave(plan.num_prompt[:plan.num_filled.numel()], plan.num_filled).to(pos_f.device)
        masks: dict[int, torch.Tensor] = {}

        def seen(w):
            if not w:
                return None
            if w not in masks:
                masks[w] = pos_f > prompt - self.tail - w
            return masks[w]

        return seen

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        plan = self._plan()
        if plan is None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
        for layer in islice(self.layers, 0, self.split + 1):
            hidden, residual = self.family.call(layer, positions, hidden, residual)
        if not self._kv:
            self.capture_kv_weights()
        seen = self._seen_filled(plan, positions[plan.filled])
        if os.environ.get(STEP_LOG_ENV):
            written = [plan.filled.numel() if m is None else int(m.sum()) for m in map(seen, self._windows)]
            with open(os.environ[STEP_LOG_ENV], "a") as f:
                f.write(json.dumps({"query_lens": plan.query_lens.tolist(), "filled": plan.filled.numel(),
                                    "exact": plan.exact.numel(), "num_filled": plan.num_filled.tolist(),
                                    "num_computed": plan.num_computed.tolist(),
                                    "carried": plan.carry_in.numel(), "written": written}) + "\n")
        h = hidden + residual if residual is not None else hidden  # h_S, the input of layer S+1: [tokens, d]
        ctx = get_forward_context()
        self._allocate_states(plan, h)
        if self.selection is not None:  # every scheduled token's h_S, by slot: selection may rerun its row later
            self._states.write(ctx.slot_mapping[self.late_names[0]][:plan.num_tokens], h[:plan.num_tokens])
        h_f, pos_f = h[plan.filled], positions[plan.filled]
        if self.fill_maps.context:  # context maps read the previous token's h_S too (zeros before a request's first)
            prev = plan.filled_prev
            h_prev = h[prev.clamp_min(0)] * (prev >= 0)[:, None].to(h.dtype)
            if plan.carry_in.numel():  # the previous token was computed in an earlier step (or by another request)
                if self.selection is not None:  # every token's h_S is kept, this step's written above
                    h_prev[plan.carry_in] = self._states.read(plan.carry_in_slots)
                else:
                    h_prev[plan.carry_in] = carried_states(plan, h, self._carry.read)
            if self.selection is None and plan.carry_out.numel():
                self._carry.write(plan.carry_out_slots, h[plan.carry_out])
            h_f = torch.cat([h_f, h_prev], -1)
        plans = self._layer_plans(plan)
        selecting = selecting_requests(plan, self.tail) if self.selection is not None else []
        if selecting:
            for j in range(len(self.late)):
                self._write_filled(j, h_f, pos_f, plans[j].filled_slots)
            out, chosen, seconds = self._forward_selecting(plan, positions, h, selecting)
        else:
            out, chosen, seconds = self._late_layers(plan, positions, h, h_f, pos_f, plans, seen), {}, None
        self._log_prompts_done(plan, chosen, seconds)
        return out

    def _late_layers(self, plan, positions: torch.Tensor, h: torch.Tensor, h_f: torch.Tensor, pos_f: torch.Tensor,
                     plans: list, seen) -> torch.Tensor:
        """The late layers of a step with filled tokens (no request selecting in it). Attention layers: the filled
        tokens' K/V from ``x̂_l`` (in a sliding-window layer only the rows an exact row sees, ``seen``), then the exact
        tokens run the layer with attention metadata for their queries. A hybrid model's linear-attention layer ``l``
        (:meth:`_recurrent_layer`): the layer's input norm and Gated DeltaNet mixer run over every token of the step,
        in the step's order, on ``x̂_l`` for filled tokens and on the exact tokens' own layer input, with vLLM's own
        metadata for the layer (its recurrence is causal per request: the exact tokens continue from the conv and
        recurrent states the filled tokens advanced, and a later chunk from those of earlier chunks, kept in vLLM's
        state cache); the mixer's output, residual, post-attention norm and MLP are computed for the exact tokens
        only. ``h`` ``[tokens, d]`` is ``h_S``, ``h_f`` ``[F, f]`` the filled tokens' map features, ``plans`` each
        late attention layer's row plan (:meth:`_layer_plans`). Returns the step's output hidden states (filled rows
        zero); a chunk of filled tokens only runs no late layer in full."""
        x, pos_e, residual = h[plan.exact], positions[plan.exact], None
        has_exact = plan.exact.numel() > 0
        slots = get_forward_context().slot_mapping
        saved = {name: slots.get(name) for name in self.late_names}
        try:
            for name, p in zip(self.late_names, plans):  # the exact tokens' own K/V go to their slots
                slots[name] = p.exact_slots
            j = 0  # index among the late attention layers
            for m, i in enumerate(self.late):  # m: index among the late layers (the maps')
                layer = self.layers[i]
                if self.family.is_recurrent(layer):
                    x, residual = self._recurrent_layer(m, layer, plan, positions, h_f, x, pos_e, residual)
                    continue
                keep = seen(self._windows[j])
                if keep is None:
                    self._write_filled(j, h_f, pos_f, plans[j].filled_slots, m)
                else:
                    self._write_filled(j, h_f[keep], pos_f[keep], plans[j].filled_slots[keep], m)
                j += 1
                if has_exact:
                    x, residual = self.family.call(layer, pos_e, x, residual)
        finally:
            _restore(slots, saved)
        out = h.new_zeros((positions.shape[0], h.shape[-1]))
        if has_exact:
            x, _ = self.norm(x, residual)
            out[plan.exact] = x
        return out

    def _log_prompts_done(self, plan, chosen: dict[int, int], seconds: float | None) -> None:
        """One line in vLLM's log (INFO) per request whose last prompt token this step schedules and whose prompt
        has filled rows: its prompt length, filled and exact rows (the tail and the rows selection chose, ``chosen``
        by request row), and the time of the step's selection (``seconds``: the lexical part, both passes and the
        scoring of every request selecting in the step; ``None`` without selection)."""
        if plan.req_ids is None or plan.num_prompt is None or not logger.isEnabledFor(logging.INFO):
            return
        computed, q, prompt = plan.num_computed.tolist(), plan.query_lens.tolist(), plan.num_prompt.tolist()
        for r in range(len(q)):
            if computed[r] < prompt[r] <= computed[r] + q[r] and prompt[r] > self.tail:
                k = chosen.get(r, 0)
                logger.info("RidgeFill: request %s: prompt %d tokens, %d filled rows, %d exact rows (tail %d, chosen "
                            "%d)%s", plan.req_ids[r], prompt[r], prompt[r] - self.tail - k, self.tail + k, self.tail, k,
                            "" if seconds is None else f", selection {1000 * seconds:.1f} ms")

    def _recurrent_layer(self, m: int, layer, plan, positions: torch.Tensor, h_f: torch.Tensor, x: torch.Tensor,
                         pos_e: torch.Tensor, residual: torch.Tensor | None):
        """Late linear-attention layer ``self.late[m]`` (:meth:`_late_layers`): advances its states over the
        step's tokens (filled: ``x̂ = h_f W + b``; exact: ``x + residual``, ``[E, d]``) and returns the exact
        tokens' ``(hidden, residual)`` after the layer, computed by vLLM's own decoder layer whose mixer call
        returns the mixer's exact rows."""
        la = layer.linear_attn
        exact = plan.exact
        normed = h_f.new_zeros((positions.shape[0], x.shape[-1]))
        if h_f.shape[0]:
            normed[plan.filled] = layer.input_layernorm(torch.addmm(self._b[m], h_f, self._w[m]))
        if exact.numel():  # the norm the layer applies below (on copies: vLLM's fused add-norm may work in place)
            normed[exact] = (layer.input_layernorm(x.clone()) if residual is None
                             else layer.input_layernorm(x.clone(), residual.clone())[0])
        project = la._output_projection  # gated norm + out_proj: the exact tokens' rows only

        def exact_rows(core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            if not exact.numel():
                return core.new_zeros((0, x.shape[-1]))
            return project(core[exact], z[exact])

        la._output_projection = exact_rows
        try:
            mixed = la(hidden_states=normed)
        finally:
            del la._output_projection
        if not exact.numel():
            return x, residual
        if mixed.shape[0] != exact.numel():  # a platform path that projected every row
            mixed = mixed[exact]
        la.forward = lambda hidden_states: mixed  # the decoder layer's mixer call returns the exact rows' output
        try:
            return self.family.call(layer, pos_e, x, residual)
        finally:
            del la.forward

    def _scoring_model(self, device) -> tuple[ScoringModel, torch.Tensor | None]:
        """What the attention and one-pass parts score with, made at the first step that selects: the
        :class:`~ridgefill_vllm.selection.ScoringModel` and the induction scores ``[L, H]`` of every head (the maps'
        when they hold them, else scored from the served weights once and gathered over the tensor-parallel ranks;
        ``None`` when no part keeps heads by them)."""
        if self._scoring is None:
            self._scoring = ScoringModel(self, self._q)
            by_induction = any(p.heads == "induction" for p in self.selection.parts if p.by in ("attention", "predicted"))
            if by_induction:
                ind = self.fill_maps.induction
                self._induction = ind if ind is not None else gather_heads(induction_scores(self), device)
        return self._scoring, self._induction

    def _forward_selecting(self, plan, positions: torch.Tensor, h: torch.Tensor, selecting):
        """The late layers of a step in which requests select (:mod:`ridgefill_vllm.selection`): the filled
        tokens' K/V are written; each selecting request runs the parts chosen up front (the lexical part; one-pass
        parts, :meth:`_predicted_scores`), pass 1 with the attention parts' scoring and, where they add rows, pass 2
        (as ``ridgefill.prefill``); the step's other requests run their exact tokens in pass 1. The row plan is
        host NumPy: the device is read once for the step's one-pass scores and once per round of attention scores,
        for all selecting requests together. Returns the step's output hidden states, the rows each selecting request
        made exact beyond its tail (by request row) and the selection's wall time in seconds."""
        from ridgefill.select import Planner

        started = time.perf_counter()
        device = h.device
        scoring, induction = self._scoring_model(device)
        q_lens, n_filled, computed = plan.query_lens.tolist(), plan.num_filled.tolist(), plan.num_computed.tolist()
        exact: dict[int, np.ndarray] = {}  # request row -> sorted host positions that run the late layers
        for r in range(len(q_lens)):
            if q_lens[r] > n_filled[r]:
                exact[r] = np.arange(computed[r] + n_filled[r], computed[r] + q_lens[r])
        planners, prompt = {}, {}
        for s in selecting:
            prompt[s.req] = s.prompt
            chosen = self._chosen.get(s.req_id, s.prompt)
            if chosen is not None:  # a recomputed request (preemption) runs the rows it chose before
                exact[s.req] = chosen
                continue
            planners[s.req] = Planner(self.selection, s.prompt)
            exact[s.req] = np.arange(s.prompt - self.tail, s.prompt)
        for s in selecting:  # sliding-window layers: a chosen row sees filled rows the tail does not
            self._write_windowed(plan, s)
        up_front = read_scores(self._predicted_scores(plan, planners, exact, prompt, scoring, induction))  # one read
        for s in selecting:
            if s.req in planners:
                pl = planners[s.req]
                exact[s.req] = pl.up_front(s.token_ids[None], self.tail, exact[s.req],
                                           {i: up_front[(s.req, i)] for i in pl.device_parts()})
        rounds = self.selection.rounds
        ran: dict[int, np.ndarray] = {}
        scorers: dict[int, dict] = {}
        outputs: dict[int, torch.Tensor] = {}
        passes = 0  # passes of the late layers
        for rnd in range(rounds + 1):
            run = [r for r in sorted(exact) if r not in ran or (r in planners and not np.array_equal(ran[r], exact[r]))]
            if run:
                passes += 1
                for r in run:
                    if r in planners:
                        scorers[r] = planners[r].scorers(scoring, rnd, induction)
                out = self._late_run(plan, {r: exact[r] for r in run}, prompt,
                                     {r: _scored(scorers[r].values()) for r in run if r in planners and scorers[r]})
                for r in run:
                    ran[r], outputs[r] = exact[r], out[r]
            if rnd < rounds:  # every selecting request's scores of this round, read at once
                got = read_scores({(r, i): sc.scores for r in planners for i, sc in scorers[r].items()})
                for r, planner in planners.items():
                    exact[r] = planner.after_pass(rnd, {i: got[(r, i)] for i in scorers[r]}, exact[r])
        for s in selecting:
            if s.req in planners:
                self._chosen.put(s.req_id, s.prompt, ran[s.req])
        # a preempted request recomputed after it generated tokens schedules them beside its last prompt chunk:
        # they run the late layers after selection, attending to the cache it left (as a decoding step would)
        generated = {s.req: np.arange(s.prompt, computed[s.req] + q_lens[s.req])
                     for s in selecting if computed[s.req] + q_lens[s.req] > s.prompt}
        if generated:
            out = self._late_run(plan, generated, prompt, {})
            for r, pos in generated.items():
                ran[r], outputs[r] = np.concatenate([ran[r], pos]), torch.cat([outputs[r], out[r]])
        if os.environ.get(STEP_LOG_ENV):
            with open(os.environ[STEP_LOG_ENV], "a") as f:
                f.write(json.dumps({"selected": {s.req_id: ran[s.req][ran[s.req] < s.prompt - self.tail].tolist()
                                                 for s in selecting},
                                    "reused": [s.req_id for s in selecting if s.req not in planners],
                                    "passes": passes}) + "\n")
        # each request's exact tokens of the step (the last q - num_filled it schedules) take their rows' outputs
        starts = np.concatenate([[0], np.cumsum(q_lens)])
        dst, src, base = [], [], 0
        for r in sorted(ran):
            pos = np.arange(computed[r] + n_filled[r], computed[r] + q_lens[r])
            dst.append(starts[r] + n_filled[r] + np.arange(pos.size))
            src.append(base + np.searchsorted(ran[r], pos))
            base += ran[r].size
        out = h.new_zeros((positions.shape[0], h.shape[-1]))
        if dst:
            rows = torch.cat([outputs[r] for r in sorted(ran)])
            out[_on(device, np.concatenate(dst))] = rows[_on(device, np.concatenate(src))]
        chosen = {s.req: int((ran[s.req] < s.prompt - self.tail).sum()) for s in selecting}
        return out, chosen, time.perf_counter() - started

    def _predicted_scores(self, plan, planners: dict, exact: dict, prompt: dict, scoring,
                          induction) -> dict[tuple[int, int], torch.Tensor]:
        """The one-pass parts' scores (``by="predicted"``, ``ridgefill.select.ONE_PASS_SELECT``), before any late layer
        runs, as the reference's ``up_front_scores``: in each late layer with a kept head, the attention of the last
        exact rows' (the tail's) *predicted* queries (``x̂ = h_S W + b`` through the layer's input norm, query projection
        and RoPE) over every row's predicted keys (the filled rows' from the paged cache, where they were written; the
        tail's computed from their kept ``h_S``, not written). ``{(request row, part index): [prompt] float32}`` on the
        device, for every request in ``planners``."""
        from ridgefill.select import AttentionScores

        out: dict[tuple[int, int], torch.Tensor] = {}
        table, bs, device = plan.common.block_table_tensor, plan.block_size, self._w.device
        for r, planner in planners.items():
            parts = planner.parts
            mine = {i: AttentionScores(scoring, prompt[r], parts[i], induction) for i in planner.device_parts()
                    if parts[i].by == "predicted"}
            if not mine:
                continue
            scored = dict(zip(mine, _scored(mine.values())))
            n, t = prompt[r], self.tail
            rows = exact[r][-max(sc.rows for sc in mine.values()):]  # the query rows: the tail's last
            tail = torch.arange(n - t, n, device=device)
            h = self._states.read(slots_of(table[r], tail, bs))  # [t, d]: the tail's kept h_S
            if self.fill_maps.context:  # beside the previous token's (the row before the tail is filled: n > t)
                h = torch.cat([h, torch.cat([self._states.read(slots_of(table[r], tail[:1] - 1, bs)), h[:-1]])], -1)
            for j, i in enumerate(self.late_attn):  # one map per late attention layer: selection has no other kind
                here = [(sc, layers) for sc, layers in scored.values() if i in layers]
                if not here:
                    continue
                attn = self.family.attention(self.layers[i]).attn
                k_tail, _ = self._filled_kv(j, h, tail)
                keys = read_keys(attn, table[r], n, bs)  # [kv_heads, n, hd]: the filled rows' predicted keys
                keys = torch.cat([keys[:, :n - t], k_tail.view(t, attn.num_kv_heads, attn.head_size).transpose(0, 1)
                                  .to(keys.dtype)], 1)[None]
                x_hat = torch.addmm(self._b[j], h[-rows.size:], self._w[j])[None]  # the query rows' predicted inputs
                for sc, _ in here:
                    q = min(sc.rows, rows.size)
                    before = sc.scores.clone()
                    sc.add(i, x_hat[:, -q:], tail[-q:], tail[-q:], keys, None, host=rows[-q:])
                    combine_layer(sc, before)  # tensor parallel: the scores of every rank's heads
            out.update({(r, i): sc.scores for i, sc in mine.items()})
        return out

    def _write_windowed(self, plan, s) -> None:
        """The predicted K/V of every filled row of selecting request ``s`` (positions ``0..prompt-tail-1``, from
        their kept ``h_S``) in each late sliding-window layer, which wrote only the rows its tail sees; rows
        that run exact overwrite theirs. Needs one block table for all layers (Gemma 3's ``check_selection``)."""
        if not any(self._windows):
            return
        pos = torch.arange(s.prompt - self.tail, device=self._w.device)
        slots = slots_of(plan.common.block_table_tensor[s.req], pos, plan.block_size)
        h = self._states.read(slots)
        if self.fill_maps.context:  # the previous token's h_S beside each (zeros before the first)
            h = torch.cat([h, torch.cat([torch.zeros_like(h[:1]), h[:-1]])], -1)
        for j, w in enumerate(self._windows):
            if w:
                self._write_filled(j, h, pos, slots)

    def _late_run(self, plan, rows: dict[int, np.ndarray], prompt: dict[int, int],
                  scorers: dict[int, list]) -> dict[int, torch.Tensor]:
        """Run the late layers for ``rows`` (request row -> sorted host positions), from their kept ``h_S``, as
        pseudo-requests (one per run of consecutive positions; :func:`~ridgefill_vllm.plan.runs_metadata`),
        writing their K/V to their slots. ``scorers[r]`` (``(ridgefill.select.AttentionScores, the layers it
        scores)`` pairs, :func:`_scored`) record the attention of request ``r``'s last rows over its ``prompt[r]``
        keys in those late layers. Returns each request's final hidden states ``[len(rows[r]), d]``."""
        table, bs, device = plan.common.block_table_tensor, plan.block_size, self._w.device
        reqs, runs, bounds, start = [], [], {}, 0
        for r, pos in rows.items():
            for a, b in spans(pos):
                reqs.append(r)
                runs.append((a, b))
            bounds[r] = (start, start + pos.size)
            start += pos.size
        host = np.concatenate(list(rows.values()))
        pos = _on(device, host)
        slots = slots_of(table, pos, bs, _on(device, np.repeat(list(rows), [p.size for p in rows.values()])))
        starts, ends = torch.tensor(runs, dtype=torch.int64).view(-1, 2).unbind(1)
        metadata = plan.build(runs_metadata(plan.common, torch.tensor(reqs, dtype=torch.int64), starts, ends, slots,
                                            pos))
        x, residual = self._states.read(slots), None
        ctx = get_forward_context()
        saved_meta = {name: ctx.attn_metadata[name] for name in self.late_names}
        saved_slots = {name: ctx.slot_mapping.get(name) for name in self.late_names}
        try:
            for name in self.late_names:
                ctx.attn_metadata[name] = metadata
                ctx.slot_mapping[name] = slots
            for i in self.late:
                here = {r: [(sc, layers) for sc, layers in recs if i in layers] for r, recs in scorers.items()}
                here = {r: recs for r, recs in here.items() if recs}
                queries = {}
                for r, recs in here.items():  # the scored rows' layer input, before the layer runs
                    a, b = bounds[r]
                    q0 = b - min(max(sc.rows for sc, _ in recs), b - a)
                    queries[r] = (x[q0:b] + residual[q0:b]) if residual is not None else x[q0:b].clone()
                x, residual = self.layers[i](pos, x, residual)
                attn = self.family.attention(self.layers[i]).attn
                for r, recs in here.items():
                    a, b = bounds[r]
                    keys = read_keys(attn, table[r], prompt[r], bs)[None]
                    for sc, _ in recs:
                        k = min(sc.rows, b - a)
                        p = pos[b - k:b]
                        before = sc.scores.clone()
                        sc.add(i, queries[r][-k:][None], p, p, keys, None, host=host[b - k:b])
                        combine_layer(sc, before)  # tensor parallel: the scores of every rank's heads
        finally:
            _restore(ctx.attn_metadata, saved_meta)
            _restore(ctx.slot_mapping, saved_slots)
        x, _ = self.norm(x, residual)
        return {r: x[a:b] for r, (a, b) in bounds.items()}


def _scored(scorers) -> list[tuple[object, frozenset[int]]]:
    """Each ``ridgefill.select.AttentionScores`` of ``scorers`` with the layers it scores on some rank (where its
    scores are combined over the ranks), then given this rank's kept heads (:func:`ridgefill_vllm.tp.local_heads`)."""
    scorers = list(scorers)
    layers = [frozenset(sc.layers()) for sc in scorers]
    local_heads(scorers)
    return list(zip(scorers, layers))


def _on(device, rows: np.ndarray) -> torch.Tensor:
    """Host ``int64`` rows as a device index tensor (copied without waiting where the device is an accelerator)."""
    t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    return t if torch.device(device).type == "cpu" else t.to(device, non_blocking=True)


def _restore(mapping: dict, saved: dict) -> None:
    for name, value in saved.items():
        if value is None:
            mapping.pop(name, None)
        else:
            mapping[name] = value


def attach_fill(model: nn.Module, vllm_config: VllmConfig, family) -> nn.Module:
    """Give vLLM's built model body ``model`` the fill when the model config has maps: its class becomes a
    subclass of its own class with :class:`FillModel` mixed in (run eagerly, like vLLM's ``enforce_eager``),
    and :meth:`FillModel.init_fill` reads the settings and maps. Without maps ``model`` stays vLLM's. Returns
    ``model``.

    Raises:
        InputError: the checkpoint's ``model_type`` is not one of ``family.model_types``, or see
            :meth:`FillModel.init_fill`.
    """
    if fill_settings(model.config) is None:
        return model
    model_type = getattr(model.config, "model_type", None)
    if model_type not in family.model_types:
        own = [f.architecture for f in FAMILIES if model_type in f.model_types]
        raise InputError(f"the checkpoint's model_type is {model_type!r}, but the architecture selects RidgeFill's "
                         f"{family.name} class (model_type {', '.join(family.model_types)}): "
                         + (f"select {own[0]}" if own else "RidgeFill has no vLLM class for this model_type "
                            "(docs/vllm.md, support table)"))
    model.__class__ = _fill_class(type(model))
    model.do_not_compile = True  # the fill's forward branches on the step's row plan
    model.init_fill(vllm_config, family)
    return model


@functools.cache
def _fill_class(base: type) -> type:
    return ignore_torch_compile(type(f"RidgeFill{base.__name__}", (FillModel, base), {"__module__": __name__}))


class FillCausalLM:
    """Mixed in before a vLLM ``...ForCausalLM`` class (attribute ``family``, a
    :class:`ridgefill_vllm.adapters.Family`): gives its model body the fill (:func:`attach_fill`) and checks at
    load time that the maps were fitted on these weights."""

    family = None

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs):  # vLLM reads these two names
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        attach_fill(self.model, vllm_config, self.family)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        body = self.model
        if getattr(body, "fill_maps", None) is None:
            return super().load_weights(weights)
        sample: list[float] = []
        fused: list[float] = []  # the same, with each MoE layer's experts as transformers 5 holds them
        tied = getattr(self.config, "tie_word_embeddings", False)

        def sampled(items):
            for name, t in items:
                if "rotary_emb.inv_freq" not in name and not (tied and name.startswith("lm_head.")):
                    values = t.detach().flatten()[:SAMPLE_VALUES].to(device="cpu", dtype=torch.float64).tolist()
                    sample.extend(values)
                    expert = _EXPERT.search(name)
                    if expert is None or (expert[1] == "0" and expert[2] != "up_proj"):
                        fused.extend(values)
                yield name, t

        loaded = super().load_weights(sampled(weights))
        want = len(body.fill_maps.meta.get("weight_sample") or [])
        body.fill_maps.check_weight_sample(fused if len(sample) != want == len(fused) else sample,
                                           body.embed_tokens.weight.dtype)
        body.capture_kv_weights()
        return loaded


#: A checkpoint's per-expert MoE weight (``...mlp.experts.<e>.<gate_proj|up_proj|down_proj>.weight``). Maps fitted
#: with ``transformers`` 5 sample each MoE layer's fused ``gate_up_proj`` ``[E, 2I, d]`` and ``down_proj``
#: ``[E, d, I]``, whose first values are expert 0's ``gate_proj`` and ``down_proj`` rows.
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")

#: vLLM's ``LlamaModel`` with the fill (the class a Llama body gets from :func:`attach_fill`).
RidgeFillLlamaModel = _fill_class(LlamaModel)


class RidgeFillLlamaForCausalLM(FillCausalLM, LlamaForCausalLM):
    """vLLM's ``LlamaForCausalLM`` with the fill (register name ``RidgeFillLlamaForCausalLM``)."""

    family = LLAMA
