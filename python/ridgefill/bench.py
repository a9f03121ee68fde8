"""``ridgefill bench``: time exact and fill prefill in one process and compare with the cost model.

For each prompt length ``N`` the bench runs, in the same process and on the same token ids:

1. ``warmup`` untimed rounds of exact then fill prefill (allocator, kernel selection, caches);
2. one untimed round per mode that measures peak memory (CUDA: ``torch.cuda.max_memory_allocated``
   above what was allocated before the call; CPU: peak resident set size above the RSS before the
   call, sampled every 2 ms from ``/proc/self/statm``, so approximate);
3. ``repeats`` timed pairs, interleaved, alternating which mode goes first; the ratio
   ``exact / fill`` is taken per pair (both ran under nearly the same machine load) and its median
   reported, next to the median times.
4. the filled rows' map-plus-K/V step alone (:func:`bench_map_step`, the fast path's
   :meth:`~ridgefill.adapters.LlamaAdapter.fill_kv`), to show its share of the fill.

With row selection (``--select``, repeatable: e.g. ``--select on --select one-pass``) each setting is a further
path timed in the same interleaved rounds, with its peak memory, its chosen rows and its own FLOP bound.

Both paths keep last-row logits only (the LM head runs on one row), so they are compared on equal
terms. The fill path is :func:`ridgefill.fill.prefill` in mode ``"ridge"``; the exact path is the same
function in mode ``"exact"`` (the plain ``transformers`` forward).

Quality is not the bench's job: the maps are random (``W_l = I + ε·R``, ``b_l = 0``, made on the device
in the model's dtype), which costs exactly what fitted maps cost. Likewise ``--model llama3-8b-random``
is a ``LlamaForCausalLM`` with random weights and the Llama-3.1-8B shape, built on the device: dense
matmuls and attention take the same time whatever the weights' values.

With ``--calibration`` it also measures calibration (:func:`ridgefill.calibration.collect_stats`, the
forward through layers ``0..L-2`` plus the float64 statistics): tokens/s relative to a plain forward
over the same chunks, and peak memory for two text lengths (it should not grow with the text).

Printed per length: ideal ratio (:func:`ridgefill.costs.ideal_ratio`), measured ratio, measured/ideal,
median seconds, peak memory of each path, and the machine's 1-minute load average; the header gives
the model, device, dtype, threads and CPU count. ``--json`` writes the whole report.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import defaults
from .adapters import adapter_for
from .costs import ModelShape, exact_cost, fill_cost, ideal_ratio
from .errors import InputError
from .validate import check_context
from .fill import prefill, prefill_instrumented
from .maps import RidgeMaps
from .select import as_select, as_selection, parse_setting

__all__ = ["BenchConfig", "PRESETS", "bench", "format_table", "random_model", "timing_maps"]

#: Random-weight model shapes by name (``LlamaConfig`` keyword arguments).
PRESETS: dict[str, dict] = {
    # Llama-3.1-8B: 32 layers, hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocabulary 128256.
    "llama3-8b-random": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                             intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
                             rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    # SmolLM2-135M's shape with random weights (no download needed).
    "smollm2-random": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                           intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                           rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # A tiny model for smoke tests of the bench itself.
    "tiny-random": dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, vocab_size=101, max_position_embeddings=4096,
                        rope_theta=10000.0, tie_word_embeddings=False),
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_LENGTHS = (1024, 2048, 4096, 8192)
_GPU_LENGTHS = (8192, 32768, 131072)


@dataclass
class BenchConfig:
    """What ``ridgefill bench`` runs. ``None`` fields take a default for the device:

    CPU: model ``"smollm2"`` (the real SmolLM2-135M), float32, lengths 1K-8K, tail 256.
    CUDA: model ``"llama3-8b-random"``, bfloat16, lengths 8K/32K/128K, tail 2048.
    The split defaults to :func:`ridgefill.defaults.default_split` (12 for SmolLM2, ``L // 2`` otherwise: 16
    for the 8B shape).
    """

    model: str | None = None
    device: str = "auto"
    dtype: str | None = None
    lengths: tuple[int, ...] | None = None
    split: int | None = None
    tail: int | None = None
    repeats: int = 3
    warmup: int = 1
    threads: int | None = None
    seed: int = 0
    calibration: bool = False
    calib_chunk: int = 512
    calib_lengths: tuple[int, int] = (4096, 16384)
    #: also time the fill with each of these row selections (named settings of
    #: :func:`ridgefill.select.parse_setting` such as ``"auto"``, ``"one-pass"``, ``"on,budget=0.1"``, or
    #: Select / Selection objects; ``None`` or ``"off"`` entries are left out; ``"auto"`` is ``"on"`` here: the
    #: bench's random maps record no setting)
    selects: tuple = (defaults.SELECT,)
    context: int = 1  # the maps' input: 1, [h_S(t), h_S(t-1)] (context maps, the default); 0, h_S(t)
    json: str | None = None
    command: str = ""


# --------------------------------------------------------------------------------------------------
# Models and maps for timing
# --------------------------------------------------------------------------------------------------

def random_model(preset: str | dict, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> torch.nn.Module:
    """A ``LlamaForCausalLM`` with random weights of a given shape, built directly on ``device`` in ``dtype``.

    Args:
        preset: a name in :data:`PRESETS` or a dict of ``LlamaConfig`` arguments.
        device, dtype: where and in what precision the weights are created (no float32 copy on the CPU first).
        seed: ``torch.manual_seed`` for the weights.

    Returns:
        The model in eval mode (SDPA attention).

    Raises:
        InputError: an unknown preset name.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if isinstance(preset, str):
        if preset not in PRESETS:
            raise InputError(f"unknown random model {preset!r}; choose one of {sorted(PRESETS)}")
        preset = PRESETS[preset]
    cfg = LlamaConfig(**preset, attn_implementation="sdpa")
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.to(dtype).eval()


def timing_maps(model: torch.nn.Module, split: int, *, seed: int = 0, scale: float = 0.02,
                context: int = 0) -> RidgeMaps:
    """Random maps ``W_l = I + scale·R/√d``, ``b_l = 0`` for every late layer (means 0, covariance ``I``),
    on the model's device: the shapes and cost of fitted maps, not their quality (for timing only). With
    ``context = 1``, context maps ``[I + scale·R/√d; scale·R'/√d]`` ``[2d, d]`` (:func:`ridgefill.fill.context_features`).

    Raises:
        InputError: ``split`` outside ``0..L-2``, or ``context`` not 0 or 1.
    """
    context = check_context(context)
    cfg = model.config
    L, d = cfg.num_hidden_layers, cfg.hidden_size
    if not 0 <= split <= L - 2:
        raise InputError(f"split S={split} is out of range: this model has {L} layers, so 0 ≤ S ≤ {L - 2}")
    p = next(model.parameters())
    g = torch.Generator(device=p.device).manual_seed(seed)
    late = L - split - 1
    w = torch.randn(late, d * (1 + context), d, generator=g, device=p.device, dtype=torch.float32) * (scale / d ** 0.5)
    w[:, :d] += torch.eye(d, device=p.device)
    b = torch.zeros(late, d, device=p.device)
    # zero means, an identity covariance and a token count: the centred fill and query-agnostic selection
    # can be timed
    meta = {"purpose": "timing only (random)", "kind": "inputs", "calibration_tokens": 65536, "lambda_spec": "auto",
            "context": context}
    return RidgeMaps(split, w.to(p.dtype), b.to(p.dtype), [1.0] * late, meta,
                     mean_h=torch.zeros(d, device=p.device), mean_x=torch.zeros(late, d, device=p.device),
                     cov_h=torch.eye(d, device=p.device))


# --------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------

def _trim_heap() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``), so RSS measures what is in use."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PeakMemory:
    """Context manager measuring the peak memory a block adds, in bytes (:attr:`peak`).

    CUDA: ``max_memory_allocated - memory_allocated`` at entry (exact, tensors only). CPU: peak RSS
    minus RSS at entry (after returning freed heap memory to the OS), sampled every ``interval``
    seconds by a thread (approximate: spikes shorter than the interval can be missed). ``peak`` is ``None`` when
    the platform has no ``/proc/self/statm``.
    """

    def __init__(self, device: torch.device, interval: float = 0.002):
        self.device, self.interval, self.peak = torch.device(device), interval, None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        _trim_heap()
        self._base = _rss_bytes()
        self._max = self._base
        self._stop = threading.Event()
        if self._base is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(self.interval):
            rss = _rss_bytes()
            if rss is not None and rss > self._max:
                self._max = rss

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            return False
        if self._base is not None:
            self._stop.set()
            self._thread.join()
            rss = _rss_bytes()
            self.peak = max(self._max, rss or 0) - self._base
        return False


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> tuple[float, float]:
    """``(wall seconds, process CPU seconds)`` of ``fn()``, synchronising CUDA around it."""
    _sync(device)
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    _sync(device)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    del out
    return elapsed, cpu


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def bench_length(model, maps: RidgeMaps, n: int, *, tail: int, repeats: int = 3, warmup: int = 1,
                 seed: int = 0, selects: dict | None = None, progress: bool = False) -> dict:
    """Time exact and fill prefill of ``n`` random token ids (see the module docstring).

    With ``selects`` (``{name: Select or Selection}``) each is a further prefill, the fill with that row
    selection, timed in the same interleaved rounds; its bound counts its chosen rows, passes and scoring
    query rows (:func:`ridgefill.costs.fill_cost` with ``selected`` and
    :meth:`~ridgefill.select.Selection.cost_args`). A two-pass selection mixing parts chosen up front
    (n-gram) and attention parts is counted as if all its rows were chosen by attention (rows chosen up
    front are exact in both passes): its bound is then a little high. On the random token ids of the bench
    the n-gram part finds no match and the attention parts choose the rows.
    With ``progress`` one line per warm-up and timed round goes to stderr (seconds per prefill), and one
    after the untimed peak-memory round, so a long length shows where it is.

    Returns:
        A dict: ``n``, ``tail``, ``ideal``, ``exact_s``/``fill_s`` (medians) and ``*_all`` (every repeat),
        ``ratio`` (median of per-pair ``exact/fill``), ``ratios``, ``measured_over_ideal``,
        ``exact_peak_bytes``/``fill_peak_bytes``, ``load`` (1-minute load averages before and after);
        ``selects``: per name ``s``, ``s_all``, ``ratio``, ``ideal``, ``measured_over_ideal``, ``rows`` (rows
        chosen), ``peak_bytes``.

    Raises:
        InputError: ``tail`` not in ``1..n-1``, ``repeats < 1`` or ``warmup < 0``.
    """
    if not 1 <= tail < n:
        raise InputError(f"tail={tail} must be between 1 and N-1={n - 1} for N={n}; lower --tail or use longer --lengths")
    if repeats < 1 or warmup < 0:
        raise InputError(f"repeats={repeats} must be ≥ 1 and warmup={warmup} ≥ 0")
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed + n)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g).to(device)
    selects = selects or {}
    runs = {"exact": lambda: prefill(model, ids, tail=tail, mode="exact"),
            "fill": lambda: prefill(model, ids, maps, tail=tail, mode="ridge", select=None)}
    for name, sel in selects.items():
        runs[f"sel:{name}"] = lambda sel=sel: prefill(model, ids, maps, tail=tail, mode="ridge", select=sel)
    def report(what: str, values: dict, unit: str) -> None:
        if progress:
            done = ", ".join(f"{name} {v} {unit}" for name, v in values.items())
            print(f"  N={n} {what}: {done}", file=sys.stderr, flush=True)

    load_before = _load()
    for w in range(warmup):
        report(f"warm-up {w + 1}/{warmup}", {name: f"{_timed(fn, device)[0]:.2f}" for name, fn in runs.items()}, "s")
    peaks = {}
    for name, fn in runs.items():
        with PeakMemory(device) as pm:
            out = fn()
            _sync(device)
            del out
        peaks[name] = pm.peak
    report("peak memory (untimed)", {name: "?" if b is None else f"{b / 2**20:.0f}" for name, b in peaks.items()}, "MiB")
    times = {name: [] for name in runs}
    cpu = {name: [] for name in runs}
    for r in range(repeats):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            wall, used = _timed(runs[name], device)
            times[name].append(wall)
            cpu[name].append(used)
        report(f"round {r + 1}/{repeats}", {name: f"{times[name][-1]:.2f}" for name in runs}, "s")
    ratios = [e / f for e, f in zip(times["exact"], times["fill"])]
    cpu_ratios = [e / f for e, f in zip(cpu["exact"], cpu["fill"]) if f > 0]
    shape = dict(context=maps.context, kv_maps=maps.kind == "kv")  # what the maps read and predict
    ideal = ideal_ratio(model.config, n, maps.split, tail, **shape)
    ratio = statistics.median(ratios)
    extra = {}
    for name, sel in selects.items():
        chosen = prefill(model, ids, maps, tail=tail, mode="ridge", select=sel).selected.tolist()
        sel_ideal = ideal_ratio(model.config, n, maps.split, tail, selected=chosen,
                                **as_selection(sel).cost_args(tail), **shape)
        key = f"sel:{name}"
        sel_ratio = statistics.median(e / f for e, f in zip(times["exact"], times[key]))
        extra[name] = {"s": statistics.median(times[key]), "s_all": times[key], "ratio": sel_ratio, "ideal": sel_ideal,
                       "measured_over_ideal": sel_ratio / sel_ideal, "rows": len(chosen), "peak_bytes": peaks[key]}
    return {"selects": extra, "n": n, "tail": tail, "ideal": ideal, "ratio": ratio, "measured_over_ideal": ratio / ideal,
            "ratios": ratios, "exact_s": statistics.median(times["exact"]), "fill_s": statistics.median(times["fill"]),
            "exact_s_all": times["exact"], "fill_s_all": times["fill"],
            "cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
            "exact_cpu_s_all": cpu["exact"], "fill_cpu_s_all": cpu["fill"],
            "exact_peak_bytes": peaks["exact"], "fill_peak_bytes": peaks["fill"],
            "load": [load_before, _load()]}


def bench_map_step(model, maps: RidgeMaps, n: int, *, tail: int, repeats: int = 3, seed: int = 0) -> dict | None:
    """Time the filled rows' map-plus-K/V step alone (:meth:`ridgefill.adapters.LlamaAdapter.fill_kv`, the
    maps and K/V of every late layer for the ``n − tail`` filled rows of random split states, written into
    fresh ``[1, kv_heads, n, head_dim]`` buffers per layer). Returns ``{"map_step_s"}`` (the median of
    ``repeats`` after one warm-up), or ``None`` when the adapter has no fast path (e.g. Gemma 3).
    """
    adapter = adapter_for(model)
    if not (hasattr(adapter, "fill_kv") and adapter.supports_fill_kv()):
        return None
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    rows, d = n - tail, model.config.hidden_size
    g = torch.Generator().manual_seed(seed + 7 * n)
    h = torch.randn(1, n, d, generator=g).to(device=device, dtype=dtype)
    m = maps.to(dtype=dtype, device=device)
    late = range(maps.split + 1, adapter.num_layers)
    rope = adapter.rope(torch.arange(rows, device=device), h)
    shape = (1, adapter.num_kv_heads, n, adapter.head_dim)
    keys, values = [h.new_empty(shape) for _ in late], [h.new_empty(shape) for _ in late]

    def step():
        adapter.fill_kv(late, h, m.weights, m.biases, rope, keys, values, 0, rows)

    times = []
    with torch.inference_mode():
        _timed(step, device)
        for _ in range(repeats):
            times.append(_timed(step, device)[0])
    return {"map_step_s": statistics.median(times)}


def check_fast_path(model, maps: RidgeMaps, n: int = 512, tail: int = 64, seed: int = 0) -> dict:
    """Check, on the bench's own device and dtype, that the fast fill path equals the reference path.

    Runs :func:`ridgefill.fill.prefill` in mode ``"ridge"`` with ``fast=True`` and ``fast=False`` on
    ``n`` random ids (``tail`` exact rows, logits of every exact row) and compares the K/V of every
    layer and the logits.

    Returns:
        ``{"n", "max_rel_kv", "max_rel_logits", "tolerance", "ok"}``: the largest ``max|a - b|`` over
        layers divided by ``max|b|`` of that tensor; tolerance ``1e-4`` in float32, ``5e-2`` in 16-bit
        (a few ulps: the two paths round differently).
    """
    device = next(model.parameters()).device
    n = min(n, getattr(model.config, "max_position_embeddings", n) or n)
    tail = max(1, min(tail, n - 1))
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed)).to(device)
    a = prefill_instrumented(model, ids, maps, tail=tail, mode="ridge", select=None, logits="exact")
    b = prefill_instrumented(model, ids, maps, tail=tail, mode="ridge", select=None, logits="exact", fast=False)

    def rel(x, y):
        return float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30))

    kv = max(max(rel(a.cache.layers[i].keys, b.cache.layers[i].keys), rel(a.cache.layers[i].values, b.cache.layers[i].values))
             for i in range(model.config.num_hidden_layers))
    logits = rel(a.logits, b.logits)
    tol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 5e-2
    return {"n": n, "max_rel_kv": kv, "max_rel_logits": logits, "tolerance": tol, "ok": kv <= tol and logits <= tol}


def bench_calibration(model, lengths: tuple[int, ...], chunk: int, *, seed: int = 0, context: int = 0) -> list[dict]:
    """Calibration throughput and memory at several text lengths (random token ids).

    For each length ``n`` (a multiple of ``chunk``): a plain forward (``model(ids, logits_to_keep=1)``,
    one call per chunk) and :func:`ridgefill.calibration.collect_stats_many` over the same chunks (split
    ``L // 2``, the float64 statistics included, of context maps with ``context = 1``), each timed and its
    peak memory measured.

    Returns:
        One dict per length: ``tokens``, ``forward_tok_s``, ``calib_tok_s``, ``relative`` (calibration
        tokens/s over forward tokens/s), ``forward_peak_bytes``, ``calib_peak_bytes``.

    Raises:
        InputError: a length that is not a positive multiple of ``chunk``.
    """
    from .calibration import collect_stats_many

    device = next(model.parameters()).device
    split = model.config.num_hidden_layers // 2
    out = []
    for n in lengths:
        if n < chunk or n % chunk:
            raise InputError(f"calibration length {n} must be a positive multiple of the chunk {chunk}")
        g = torch.Generator().manual_seed(seed + n)
        chunks = [torch.randint(0, model.config.vocab_size, (chunk,), generator=g) for _ in range(n // chunk)]

        def plain():
            with torch.inference_mode():
                for c in chunks:
                    model(c[None].to(device), logits_to_keep=1, use_cache=False)

        def calib():
            return collect_stats_many(model, chunks, (split,), progress=False, context=context)

        plain()  # warm-up
        rec = {"tokens": n}
        for name, fn in (("forward", plain), ("calib", calib)):
            with PeakMemory(device) as pm:
                t, _ = _timed(fn, device)
            rec[f"{name}_tok_s"] = n / t
            rec[f"{name}_peak_bytes"] = pm.peak
        rec["relative"] = rec["calib_tok_s"] / rec["forward_tok_s"]
        out.append(rec)
    return out


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------

def _resolve(cfg: BenchConfig) -> tuple[torch.nn.Module, str, torch.device, torch.dtype]:
    if cfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(cfg.device)
        except RuntimeError as e:
            raise InputError(f"--device {cfg.device!r} is not a torch device ({e}); use auto, cpu or cuda") from e
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InputError("--device cuda was asked but torch sees no CUDA device; use --device cpu")
    dtype_name = cfg.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if dtype_name not in _DTYPES:
        raise InputError(f"--dtype {dtype_name!r} is not one of {sorted(_DTYPES)}")
    dtype = _DTYPES[dtype_name]
    name = cfg.model or ("llama3-8b-random" if device.type == "cuda" else "smollm2")
    if name in PRESETS:
        model = random_model(name, device, dtype, cfg.seed)
    else:
        from .data.models import load_model

        model, _, name = load_model(name, dtype=dtype, device=device)
    return model, name, device, dtype


def bench(cfg: BenchConfig, progress: bool = True) -> dict:
    """Run the benchmark described by ``cfg`` and return its report (see :func:`format_table`).

    Raises:
        InputError: bad sizes (split, tail, lengths, repeats), an unknown device or dtype.
        AssetError: the model cannot be loaded.
    """
    if cfg.repeats < 1 or cfg.warmup < 0:
        raise InputError(f"--repeats {cfg.repeats} must be ≥ 1 and --warmup {cfg.warmup} ≥ 0")
    if cfg.calibration and any(c < cfg.calib_chunk or c % cfg.calib_chunk for c in cfg.calib_lengths):
        raise InputError(f"--calib-lengths {tuple(cfg.calib_lengths)} must be positive multiples of the chunk "
                         f"{cfg.calib_chunk} (--calib-chunk)")
    if cfg.threads:
        if cfg.threads < 1:
            raise InputError(f"--threads {cfg.threads} must be ≥ 1")
        torch.set_num_threads(cfg.threads)
    selects = {}  # name -> selection; a bad spec fails before the model is built
    for value in cfg.selects or ():
        sel = parse_setting(value) if isinstance(value, str) else as_select(value)
        sel = as_select("on") if sel == "auto" else sel  # the random maps record no setting
        if sel is not None:
            selects[value if isinstance(value, str) else str(sel)] = sel
    model, name, device, dtype = _resolve(cfg)
    L = model.config.num_hidden_layers
    split = defaults.default_split(model) if cfg.split is None else cfg.split
    tail = cfg.tail or (2048 if device.type == "cuda" else 256)
    lengths = tuple(cfg.lengths or (_GPU_LENGTHS if device.type == "cuda" else _CPU_LENGTHS))
    if not lengths or any(n < 2 for n in lengths):
        raise InputError(f"--lengths {lengths} must be prompt lengths ≥ 2")
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and max(lengths) > max_pos:
        raise InputError(f"length {max(lengths)} exceeds the model's context of {max_pos} tokens; lower --lengths")
    for n in lengths:
        if not 1 <= tail < n:
            raise InputError(f"--tail {tail} must be shorter than every length; {n} is not longer")
    maps = timing_maps(model, split, seed=cfg.seed, context=cfg.context)
    shape = ModelShape.from_config(model.config)
    check = check_fast_path(model, maps, n=min(512, max(lengths)), tail=min(64, tail), seed=cfg.seed)
    if progress and not check["ok"]:
        print(f"WARNING: the fast fill path differs from the reference path: {check}", file=sys.stderr)
    report = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "command": cfg.command,
        "model": name, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "dtype": str(dtype).replace("torch.", ""), "layers": L, "split": split, "tail": tail,
        "repeats": cfg.repeats, "warmup": cfg.warmup, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "load_average": None, "maps": "random (timing only)",
        "fast_path_check": check, "rows": [], "calibration": None, "complete": False,
        "selects": {name: str(sel) for name, sel in selects.items()}, "context": cfg.context,
    }

    def save():
        report["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        if cfg.json:
            from .fileio import write_json

            write_json(Path(cfg.json), report)

    for n in lengths:
        if progress:
            print(f"bench N={n} ...", file=sys.stderr, flush=True)
        row = bench_length(model, maps, n, tail=tail, repeats=cfg.repeats, warmup=cfg.warmup, seed=cfg.seed,
                           selects=selects, progress=progress)
        e, f = exact_cost(shape, n), fill_cost(shape, n, split, tail, context=cfg.context)
        row.update(exact_tflop=e.flops / 1e12, fill_tflop=f.flops / 1e12,
                   exact_tflops_per_s=e.flops / 1e12 / row["exact_s"], fill_tflops_per_s=f.flops / 1e12 / row["fill_s"])
        row["map_step"] = bench_map_step(model, maps, n, tail=tail, repeats=cfg.repeats, seed=cfg.seed)
        report["rows"].append(row)
        save()  # a partial report survives an interrupted run
        if progress:
            print(_format_row(row, report["device"]), file=sys.stderr, flush=True)
    if cfg.calibration:
        if progress:
            print(f"calibration at {cfg.calib_lengths} tokens ...", file=sys.stderr, flush=True)
        report["calibration"] = bench_calibration(model, tuple(cfg.calib_lengths), cfg.calib_chunk, seed=cfg.seed,
                                                  context=cfg.context)
    report["complete"] = True
    save()
    return report


def _mib(b) -> str:
    return "n/a" if b is None else f"{b / 2 ** 20:.0f}"


def _format_row(r: dict, device: str) -> str:
    load = "/".join("?" if v is None else f"{v:.1f}" for v in r["load"])
    cpu = "" if r.get("cpu_ratio") is None or device != "cpu" else f"{r['cpu_ratio']:.2f}x"
    return (f"{r['n']:>7} {r['ideal']:>6.2f} {r['ratio']:>8.2f}x {r['measured_over_ideal']:>10.2f} "
            f"{r['exact_s']:>9.3f} {r['fill_s']:>9.3f} {_mib(r['exact_peak_bytes']):>10} "
            f"{_mib(r['fill_peak_bytes']):>9} {cpu:>9} {load:>10}")


def format_table(report: dict) -> str:
    """The report as the plain-text table ``ridgefill bench`` prints."""
    lines = [f"ridgefill bench  {report['date']}",
             f"model {report['model']} ({report['layers']} layers) on {report['device']} ({report['device_name']}), "
             f"{report['dtype']}, S={report['split']}, tail {report['tail']}, {report['repeats']} repeats after "
             f"{report['warmup']} warm-up, {report['threads']} threads / {report['cpus']} CPUs, maps {report['maps']}",
             f"{'N':>7} {'ideal':>6} {'measured':>9} {'meas/ideal':>10} {'exact s':>9} {'fill s':>9} "
             f"{'exact MiB':>10} {'fill MiB':>9} {'cpu-time':>9} {'load':>10}"]
    lines += [_format_row(r, report["device"]) for r in report["rows"]]
    lines.append("ideal: exact/fill FLOPs (ridgefill.costs); measured: median of per-pair exact/fill wall-time ratios; "
                 "MiB: peak memory above the model (CPU: RSS, approximate); cpu-time: median per-pair ratio of process "
                 "CPU seconds (CPU only; less sensitive to other processes); load: 1-min load average before/after")
    for name, spec in (report.get("selects") or {}).items():
        lines.append(f"with row selection {name} ({spec}):")
        lines.append(f"{'N':>7} {'rows':>6} {'ideal':>6} {'measured':>9} {'meas/ideal':>10} {'sel s':>9} "
                     f"{'sel MiB':>8} {'/ exact':>8}")
        for r in report["rows"]:
            s = r.get("selects", {}).get(name)
            if s:
                peak = (f"{s['peak_bytes'] / r['exact_peak_bytes']:>8.2f}" if s.get("peak_bytes")
                        and r.get("exact_peak_bytes") else f"{'n/a':>8}")
                lines.append(f"{r['n']:>7} {s['rows']:>6} {s['ideal']:>6.2f} {s['ratio']:>8.2f}x "
                             f"{s['measured_over_ideal']:>10.2f} {s['s']:>9.3f} {_mib(s['peak_bytes']):>8} {peak}")
    steps = [(r["n"], r["map_step"]) for r in report["rows"] if r.get("map_step")]
    if steps:
        lines.append("map+K/V step of the filled rows, all late layers (s): "
                     + "; ".join(f"N={n}: {m['map_step_s']:.3f}" for n, m in steps))
    c = report.get("fast_path_check")
    if c:
        lines.append(f"fast path vs reference path at N={c['n']}: max relative difference K/V {c['max_rel_kv']:.1e}, "
                     f"logits {c['max_rel_logits']:.1e} (tolerance {c['tolerance']:.0e}): {'ok' if c['ok'] else 'MISMATCH'}")
    if report.get("calibration"):
        lines.append(f"{'calib tokens':>12} {'forward tok/s':>14} {'calib tok/s':>12} {'relative':>9} "
                     f"{'forward MiB':>12} {'calib MiB':>10}")
        for c in report["calibration"]:
            lines.append(f"{c['tokens']:>12} {c['forward_tok_s']:>14.0f} {c['calib_tok_s']:>12.0f} {c['relative']:>9.2f} "
                         f"{_mib(c['forward_peak_bytes']):>12} {_mib(c['calib_peak_bytes']):>10}")
    return "\n".join(lines)
