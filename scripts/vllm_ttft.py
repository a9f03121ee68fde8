"""Time to first token through vLLM's own API: vLLM's own class (exact) against the RidgeFill plugin.

Runs in the vLLM environment (``bash scripts/install_vllm.sh``). Two engines live in this process,
vLLM's class of the model folder's architecture (``config.json``: ``LlamaForCausalLM``, ``Qwen3NextForCausalLM``,
or any other the plugin serves, ``ridgefill_vllm.SERVED``) and its RidgeFill class with the given maps and row selection
(``--select``, ``on`` by default), on the same model folder and engine settings: chunked prefill on (vLLM's
default; ``--max-num-batched-tokens`` sets its step size, vLLM's default when not given; ``--no-chunked``
prefills each prompt in one step) and prefix caching off (``--prefix-caching`` turns it on; each timed prompt
is another window of the text, so a request finds at most a shared first block). For each prompt length, after one warm-up request per engine, the two are timed
alternately (exact, fill, exact, fill, ...): one ``LLM.generate`` call per request with
``max_tokens=1``, wall time from the call to its return (prefill + the first token). Prompts are token
ids of the held-out novel *Persuasion* when ``ridgefill`` is importable (``python/`` of this checkout),
else fixed pseudo-random ids; each timed request uses another window of the text.

The table gives the median times, their ratio and the FLOP bound of an ideal fill path
(``ridgefill.costs.ideal_ratio``: exact FLOPs / fill FLOPs at that length, split and tail; with selection, the
rows it chose in the last timed request, read from the plugin's step log, its second pass and the scoring
rows of its attention parts), and the measured ratio as a share of the bound.

Usage (CPU)::

    python scripts/vllm_ttft.py --model MODEL_DIR --maps maps-S15.safetensors --lengths 2k,4k,8k \
        --tail 256 --repeats 3 --threads 2 [--json ttft.json]

``--dtype`` sets the engines' dtype (default float32; bfloat16 for a hybrid model, whose CPU kernel needs it).
For a hybrid model (Qwen3-Next) use ``--select off`` and no ``--prefix-caching`` (the plugin refuses both).

On a GPU: add ``--device-args '{"dtype": "bfloat16", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.4}'``
(the JSON is passed to ``vllm.LLM``; see ``scripts/gpu_vllm.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]


def portable_argv(argv: list[str]) -> list[str]:
    """``argv`` with every path argument reduced to its last two parts (``model/`` folder and file name), so a
    result file names no folder of the machine it ran on."""
    out = []
    for a in argv:
        out.append("/".join(Path(a).parts[-2:]) if os.sep in a and not a.lstrip().startswith("{") else a)
    return out


def parse_lengths(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
    return out


def import_ridgefill():
    """``(ridgefill.assets, ridgefill.costs)`` from ``python/`` of this checkout, or ``None``. The folder is on
    ``sys.path`` only during the import: it also holds the plugin's project folder, which would shadow an
    editable install of the plugin in vLLM's own processes."""
    sys.path.insert(0, str(REPO / "python"))
    try:
        import ridgefill.data.texts
        import ridgefill.costs

        return ridgefill.data.texts, ridgefill.costs
    except Exception as e:  # said in the output: synthetic prompts, no bound
        print(f"(ridgefill unavailable: {type(e).__name__}: {e})")
        return None
    finally:
        sys.path.remove(str(REPO / "python"))


def prompt_source(model_dir: str, need: int, rf):
    """``take(n, i)``: ``n`` token ids for the ``i``-th request; real text when ``ridgefill`` and a
    tokenizer are available, else pseudo-random ids (same for both engines)."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        texts = rf[0].load_texts()
        text = "\n\n".join(texts[b] for b in rf[0].EVALUATION_BOOKS)
        ids = tok(text[: 8 * need])["input_ids"]
        if len(ids) >= need:
            def take(n, i):
                start = (i * 977) % (len(ids) - n)
                return ids[start:start + n]
            return take, " + ".join(rf[0].EVALUATION_BOOKS)
    except Exception as e:  # no ridgefill or tokenizer here: synthetic prompts, said in the output
        print(f"(real text unavailable: {type(e).__name__}: {e}; using pseudo-random token ids)")
    import random

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    return (lambda n, i: random.Random(i).choices(range(100, vocab), k=n)), "pseudo-random ids"


def flop_bound(rf, model_dir: str, n: int, split: int, tail: int, context: int = 0, chosen=(),
               queries: int = 1) -> float | None:
    """The FLOP bound of the fill at ``n`` tokens; with ``chosen`` rows (row selection), one scoring pass of
    ``queries`` rows and a second pass of the tail and the chosen rows (``ridgefill.costs.fill_cost``)."""
    if rf is None:
        return None
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return rf[1].ideal_ratio(rf[1].ModelShape.from_config(SimpleNamespace(**cfg)), n, split, min(tail, n),
                             context=context, selected=chosen, rounds=1, queries=queries)


def last_selected(step_log: Path) -> list[int]:
    """The rows the plugin's selection chose for the last request that selected (its step log), or ``[]``."""
    if not step_log.exists():
        return []
    found = [json.loads(line) for line in step_log.read_text().splitlines() if '"selected"' in line]
    return next(iter(found[-1]["selected"].values())) if found else []


def main() -> None:
    ap = argparse.ArgumentParser(description="vLLM time to first token: exact vs RidgeFill")
    ap.add_argument("--model", required=True, help="Hugging Face model folder of a family the plugin serves")
    ap.add_argument("--dtype", default=None, help="engine dtype (default float32; bfloat16 for hybrid models)")
    ap.add_argument("--maps", required=True, help="maps file from `ridgefill calibrate` for that model")
    ap.add_argument("--lengths", default="2k,4k,8k")
    ap.add_argument("--tail", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="CPU: OpenMP threads of each engine's worker")
    ap.add_argument("--kv-cache-gb", type=int, default=2, help="CPU: VLLM_CPU_KVCACHE_SPACE per engine")
    ap.add_argument("--device-args", default="{}", help="JSON of extra vllm.LLM arguments (GPU: dtype, TP, memory)")
    ap.add_argument("--select", default="on", help="the plugin's row selection: 'on' (default: one pass), 'two-pass', 'off' or a spec")
    ap.add_argument("--no-chunked", action="store_true", help="chunked prefill off: each prompt in one step")
    ap.add_argument("--prefix-caching", action="store_true", help="prefix caching on (each timed prompt is new text)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per step (chunked prefill)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    lengths = parse_lengths(args.lengths)
    if args.threads:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gb))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from ridgefill_vllm import SERVED

    config = json.loads((Path(args.model) / "config.json").read_text())
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in SERVED:
        raise SystemExit(f"{args.model}: architecture {arch} has no RidgeFill class (served: {', '.join(sorted(SERVED))})")
    hybrid = "linear_attention" in (config.get("layer_types") or [])

    maps_meta = json.loads(__import__("safetensors").safe_open(args.maps, "pt").metadata()["ridgefill"])
    split, context = maps_meta["split"], maps_meta.get("context", 0)
    max_len = max(lengths) + 16
    common = dict(dtype=args.dtype or ("bfloat16" if hybrid else "float32"), enforce_eager=True, max_model_len=max_len, enable_prefix_caching=args.prefix_caching,
                  seed=0)
    if args.no_chunked:
        common.update(enable_chunked_prefill=False, max_num_batched_tokens=max_len)
    elif args.max_num_batched_tokens:
        common.update(max_num_batched_tokens=args.max_num_batched_tokens)
    step_log = Path(args.json or "vllm-ttft").with_suffix(".steps.jsonl").resolve()
    step_log.unlink(missing_ok=True)
    os.environ["RIDGEFILL_VLLM_STEP_LOG"] = str(step_log)  # the plugin logs the rows selection chose
    common.update(json.loads(args.device_args))
    rf = import_ridgefill()
    queries = 1
    if rf is not None and args.select != "off":  # scoring rows of the selection's attention parts
        sys.path.insert(0, str(REPO / "python"))
        import ridgefill.select

        sys.path.remove(str(REPO / "python"))
        queries = ridgefill.select.as_selection(ridgefill.select.as_select(args.select)).queries
    take, source = prompt_source(args.model, max(lengths), rf)
    engines = {
        "exact": LLM(args.model, hf_overrides={"architectures": [arch]}, **common),
        "fill": LLM(args.model, hf_overrides={"architectures": [SERVED[arch]],
                                              "ridgefill": {"maps": args.maps, "tail": args.tail,
                                                            "select": args.select}}, **common),
    }
    params = SamplingParams(max_tokens=1, temperature=0.0)
    rows = []
    for n in lengths:
        times = {k: [] for k in engines}
        for k, llm in engines.items():  # warm-up at this length
            llm.generate([TokensPrompt(prompt_token_ids=take(n, 10_000))], params, use_tqdm=False)
        for r in range(args.repeats):
            for k, llm in engines.items():
                prompt = TokensPrompt(prompt_token_ids=take(n, r))
                t0 = time.perf_counter()
                llm.generate([prompt], params, use_tqdm=False)
                times[k].append(time.perf_counter() - t0)
        exact, fill = statistics.median(times["exact"]), statistics.median(times["fill"])
        chosen = last_selected(step_log)
        bound = flop_bound(rf, args.model, n, split, args.tail, context, chosen, queries)
        rows.append({"tokens": n, "exact_s": exact, "fill_s": fill, "ratio": exact / fill, "bound": bound,
                     "chosen_rows": len(chosen), "exact_all": times["exact"], "fill_all": times["fill"]})
        print(f"{n:>7} tokens  exact {exact:8.3f} s  fill {fill:8.3f} s  ratio {exact / fill:5.2f}x", flush=True)
    print(f"\nvLLM TTFT, {args.model.rstrip('/').split('/')[-1]}, S={split}, tail={args.tail}, {args.repeats} "
          f"interleaved repeats (median), prompts: {source}, engine: {json.dumps(common, sort_keys=True)}")
    print(f"select={args.select}; bound: ridgefill.costs.ideal_ratio with the chosen rows of the last timed request")
    print("| tokens | chosen rows | exact s | fill s | exact/fill | FLOP bound | of bound |\n"
          "|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bound = f"{r['bound']:.2f}x" if r["bound"] else "n/a"
        share = f"{r['ratio'] / r['bound']:.2f}" if r["bound"] else "n/a"
        print(f"| {r['tokens']} | {r['chosen_rows']} | {r['exact_s']:.3f} | {r['fill_s']:.3f} | {r['ratio']:.2f}x | "
              f"{bound} | {share} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "split": split, "tail": args.tail, "engine": common,
                                               "prompts": source, "argv": portable_argv(sys.argv[1:])}, indent=1))


if __name__ == "__main__":
    main()
