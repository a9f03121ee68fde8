"""A load test of vLLM's OpenAI-compatible server with the ``openai`` client: exact against the RidgeFill plugin.

Runs in the vLLM environment (``bash scripts/install_vllm.sh``). For each configuration of ``--configs`` (``exact``:
vLLM's own class of the model folder's architecture; ``select-on`` / ``select-off``: the RidgeFill class with the
maps, tail and that row selection) it starts a server (``python -m vllm.entrypoints.openai.api_server``: chunked
prefill and prefix caching on, vLLM's defaults; ``VLLM_SERVER_DEV_MODE=1`` for its ``/reset_prefix_cache``), sends one
warm-up request, empties the prefix cache, then

1. sends ``--requests`` completion requests at a fixed rate (``--rate`` per second, one every ``1/rate`` s whether or
   not earlier ones finished), streamed, greedy, ``--gen`` tokens each (EOS ignored): prompts of ``--tokens`` token
   ids of the held-out novels, every second one opening with the same ``--shared`` tokens (a system prompt), the rest
   of each prompt its own window of the text;
2. empties the prefix cache and sends the same requests one at a time (the next after the last finished);

and records per request the time to first token (TTFT: from sending to the first streamed text), the completion,
the prompt tokens vLLM found in its prefix cache (``usage.prompt_tokens_details.cached_tokens``), and errors. It
prints one row per configuration: requests answered without error, completions equal to the one-at-a-time ones,
throughput (requests and prompt tokens per second, from the first request sent to the last completed), TTFT
median and 99th percentile, and the prefix-cache hit rate under load; ``--json`` keeps every figure.

Usage::

    .venv-vllm/bin/python scripts/vllm_load.py --model MODEL_DIR --maps maps-S15.safetensors --tail 256 \\
        --requests 32 --tokens 2048 --shared 1024 --rate 0.25 --threads 2 --json load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_server  # noqa: E402  (scripts/vllm_server.py)

MODEL_NAME = "served"


def prompts(model_dir: str, requests: int, tokens: int, shared: int) -> list[list[int]]:
    """``requests`` prompts of ``tokens`` token ids of the held-out novels (``ridgefill.data.texts``): the even ones
    open with the same ``shared`` tokens (the first of the text), each then takes its own window."""
    from ridgefill.data.texts import EVALUATION_BOOKS, load_texts
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = load_texts()
    ids = tok("\n\n".join(texts[b] for b in EVALUATION_BOOKS))["input_ids"]
    need = shared + requests * tokens
    if len(ids) < need:
        raise SystemExit(f"the held-out text has {len(ids)} tokens, fewer than the {need} the prompts take")
    system, start, out = ids[:shared], shared, []
    for i in range(requests):
        own = tokens - shared if i % 2 == 0 else tokens
        out.append((system if i % 2 == 0 else []) + ids[start:start + own])
        start += own
    return out


def serve(config: str, args, port: int, log: Path):
    """Start the server of ``config`` (``exact``, ``select-on``, ``select-off``) and wait until it answers."""
    from ridgefill.export_vllm import VLLM_ARCHITECTURES, vllm_class

    hf = json.loads((Path(args.model) / "config.json").read_text())
    arch = (hf.get("architectures") or [a for a, types in VLLM_ARCHITECTURES.items() if hf.get("model_type") in types])[0]
    overrides = {"architectures": [arch]}  # a config saved from a GGUF file names none
    if config != "exact":
        overrides = {"architectures": [vllm_class(arch)],
                     "ridgefill": {"maps": str(Path(args.maps).resolve()), "tail": args.tail,
                                   "select": config.removeprefix("select-")}}
    cmd = ["--model", args.model, "--served-model-name", MODEL_NAME, "--dtype", args.dtype, "--enforce-eager",
           "--max-model-len", str(args.max_model_len), "--seed", "0", "--enable-prompt-tokens-details",
           "--hf-overrides", json.dumps(overrides)]
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(args.kv_space),
           "OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_OMP_THREADS_BIND": args.bind}
    return vllm_server.start(cmd, port, log, env)


def reset_prefix_cache(port: int) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        if r.status != 200:
            raise SystemExit(f"/reset_prefix_cache answered {r.status}")


async def one(client, ids: list[int], gen: int) -> dict:
    """One streamed greedy completion: its text, TTFT, end time, cached prompt tokens, or its error."""
    sent = time.perf_counter()
    out = {"sent": sent, "text": "", "ttft": None, "cached": None, "error": None}
    try:
        stream = await client.completions.create(
            model=MODEL_NAME, prompt=ids, max_tokens=gen, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                if out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - sent
                out["text"] += chunk.choices[0].text
            if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
                out["cached"] = chunk.usage.prompt_tokens_details.cached_tokens
    except Exception as e:  # counted in the table
        out["error"] = f"{type(e).__name__}: {e}"
    out["done"] = time.perf_counter()
    return out


async def at_rate(port: int, batch: list[list[int]], gen: int, rate: float) -> list[dict]:
    import openai

    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=3600) as client:
        tasks = []
        for i, ids in enumerate(batch):
            tasks.append(asyncio.create_task(one(client, ids, gen)))
            if i + 1 < len(batch):
                await asyncio.sleep(1 / rate)
        return list(await asyncio.gather(*tasks))


async def one_at_a_time(port: int, batch: list[list[int]], gen: int) -> list[dict]:
    import openai

    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=3600) as client:
        return [await one(client, ids, gen) for ids in batch]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` by nearest rank (of 32 values, the 99th is the largest)."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summary(load: list[dict], alone: list[dict], batch: list[list[int]]) -> dict:
    ok = [r for r in load if r["error"] is None]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    span = max(r["done"] for r in load) - min(r["sent"] for r in load)
    cached = sum(r["cached"] or 0 for r in ok)
    return {"requests": len(load), "answered": len(ok),
            "equal_to_one_at_a_time": sum(a["error"] is None and b["error"] is None and a["text"] == b["text"]
                                          for a, b in zip(load, alone)),
            "requests_per_s": len(ok) / span, "prompt_tokens_per_s": sum(len(batch[i]) for i, r in enumerate(load)
                                                                          if r["error"] is None) / span,
            "ttft_p50_s": statistics.median(ttft) if ttft else None,
            "ttft_p99_s": percentile(ttft, 99) if ttft else None,
            "cache_hit_rate": cached / sum(len(ids) for ids in batch),
            "errors": [r["error"] for r in load + alone if r["error"]][:5]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model folder (`ridgefill convert` prints it)")
    ap.add_argument("--maps", required=True, help="maps file for the RidgeFill configurations")
    ap.add_argument("--configs", default="exact,select-on,select-off")
    ap.add_argument("--tail", type=int, default=256)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=2048, help="prompt tokens per request")
    ap.add_argument("--shared", type=int, default=1024, help="tokens of the system prompt every second request opens with")
    ap.add_argument("--rate", type=float, default=0.25, help="requests sent per second")
    ap.add_argument("--gen", type=int, default=16, help="completion tokens per request")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--kv-space", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE, GiB (CPU)")
    ap.add_argument("--threads", type=int, default=2, help="OpenMP threads of the server's worker (CPU)")
    ap.add_argument("--bind", default="nobind", help="VLLM_CPU_OMP_THREADS_BIND (CPU)")
    ap.add_argument("--json", default=None, help="file for every figure")
    ap.add_argument("--log-dir", default=".", help="folder for the servers' logs")
    args = ap.parse_args()
    batch = prompts(args.model, args.requests, args.tokens, args.shared)
    results = {"argv": [Path(a).name if os.sep in a else a for a in sys.argv[1:]], "configs": {}}
    print(f"{args.requests} requests of {args.tokens} tokens (every second opens with the same {args.shared}), "
          f"{args.rate}/s, {args.gen} tokens each")
    for config in args.configs.split(","):
        port = vllm_server.free_port()
        proc = serve(config, args, port, Path(args.log_dir) / f"load-{config}.log")
        try:
            asyncio.run(one_at_a_time(port, batch[:1], args.gen))  # warm-up
            reset_prefix_cache(port)
            load = asyncio.run(at_rate(port, batch, args.gen, args.rate))
            reset_prefix_cache(port)
            alone = asyncio.run(one_at_a_time(port, batch, args.gen))
        finally:
            vllm_server.stop(proc)
        results["configs"][config] = {"summary": summary(load, alone, batch), "load": load, "alone": alone}
        s = results["configs"][config]["summary"]
        print(f"{config:>10}: {s['answered']}/{s['requests']} answered, {s['equal_to_one_at_a_time']} equal to one at "
              f"a time, {s['requests_per_s']:.3f} req/s, {s['prompt_tokens_per_s']:.0f} prompt tok/s, TTFT p50 "
              f"{s['ttft_p50_s']:.2f} s p99 {s['ttft_p99_s']:.2f} s, prefix-cache hits {s['cache_hit_rate']:.3f}",
              flush=True)
    if args.json:
        from ridgefill.fileio import atomic_write

        atomic_write(args.json, json.dumps(results, indent=1).encode())


if __name__ == "__main__":
    main()
