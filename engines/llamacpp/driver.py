"""Run token prompts through one llama.cpp build (stock or RidgeFill) with llama-cpp-python's ctypes binding.

    python driver.py REQUEST.json OUT.npz

REQUEST.json: ``{"build": DIR, "model": GGUF, "prompts": [[ids...], ...], "n_ubatch": 512, "n_batch": 2048,
"gen": 12, "threads": 2, "repeats": 1}``. ``DIR`` is a folder that ``build.sh`` wrote (``lib/`` with the
shared libraries, ``python/llama_cpp`` with the binding). ``"texts": ["...", ...]`` instead of ``prompts``:
texts tokenised with the model's own vocabulary (``llama_tokenize``, special tokens added). The fill is on
when ``RIDGEFILL_MAPS`` is set in the environment (and ``RIDGEFILL_TAIL`` when given); this driver sets
``RIDGEFILL_N_PROMPT`` to each prompt's length before processing it (``"set_n_prompt": false`` leaves the
variable as the environment has it). Prints one line per run and prompt on stdout: its length, the time
and the greedy tokens.

Several runs in one process (the model loaded once): ``"runs": [{"name": NAME, "env": {"RIDGEFILL_MAPS":
PATH, "RIDGEFILL_TAIL": "64"}, "n_ubatch": 100, ...}, ...]``; each run takes the top-level settings it does
not give, sets the ``RIDGEFILL_*`` variables of its ``env`` and unsets the others (``RIDGEFILL_N_PROMPT``
excepted), and gets a context of its own.

OUT.npz: ``logits`` ``[prompts, vocab]`` float32, the last prompt token's logits; ``tokens`` ``[prompts, gen]``
int64, the greedy continuation; ``lengths`` ``[prompts]`` int64, the prompt lengths (with ``"force": [[ids...], ...]``, a run's ``gen - 1`` tokens per prompt
fed after it instead of the greedy ones: teacher forcing, ``tokens`` then holds the argmax at each step); ``seconds`` ``[prompts, repeats]`` float64, the prompt-processing times
(one ``llama_decode`` per batch of ``n_batch`` tokens, the KV cache cleared before each repeat); with ``"step_logits": true``,
``step_logits`` ``[prompts, gen, vocab]`` float32, the logits each greedy step chose from. With
``runs``, each key is prefixed by the run's name and a slash (``NAME/logits``).

Errors: exits with status 2 and a message on stderr when the model does not load, a run has no name or
two runs share one, or ``llama_decode`` fails. The patched build stops the process itself (exit status 1,
one ``ridgefill: ...`` line on stderr) on a bad maps file or a missing or bad ``RIDGEFILL_N_PROMPT`` or
``RIDGEFILL_TAIL`` (docs/llamacpp.md).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np


def _binding(build: Path):
    """llama-cpp-python's low-level module, loaded without its high-level package (no extra dependencies)."""
    os.environ["LLAMA_CPP_LIB_PATH"] = str(build / "lib")
    pkg = types.ModuleType("llama_cpp")
    pkg.__path__ = [str(build / "python" / "llama_cpp")]
    sys.modules["llama_cpp"] = pkg
    return importlib.import_module("llama_cpp.llama_cpp")


def main(request: str, out: str) -> int:
    req = json.loads(Path(request).read_text())
    multi = "runs" in req
    runs = req["runs"] if multi else [{}]
    names = [r.get("name") for r in runs]
    if multi and (not runs or None in names or len(set(names)) != len(names)):
        print(f"error: every run needs a name of its own; got {names}", file=sys.stderr)
        return 2
    C = _binding(Path(req["build"]))
    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.use_extra_bufts = False  # no AMX or repacked weight buffers: the weights as stored in the GGUF
    model = C.llama_model_load_from_file(str(req["model"]).encode(), mp)
    if not model:
        print(f"error: llama.cpp cannot load the model {req['model']!r}", file=sys.stderr)
        return 2
    result = {}
    try:
        for run in runs:
            if multi:  # the run's own RIDGEFILL_* variables only
                for k in [k for k in os.environ if k.startswith("RIDGEFILL_") and k != "RIDGEFILL_N_PROMPT"]:
                    del os.environ[k]
                os.environ.update({k: str(v) for k, v in run.get("env", {}).items()})
            got = _run(C, model, {**{k: v for k, v in req.items() if k != "runs"}, **run})
            prefix = f"{run['name']}/" if multi else ""
            for i, (n, secs, toks) in enumerate(zip(got["lengths"], got["seconds"], got["tokens"])):
                print(f"{prefix}prompt {i}: {n} tokens in {min(secs):.2f} s; greedy tokens {toks.tolist()}")
            result.update({prefix + k: v for k, v in got.items()})
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        C.llama_model_free(model)
    np.savez(out, **result)
    return 0


def _tokenize(C, model, text: str) -> list[int]:
    """``text``'s token ids in the model's vocabulary (special tokens such as BOS added as the model asks)."""
    vocab = C.llama_model_get_vocab(model)
    data = text.encode()
    n_max = len(data) + 16
    ids = (C.llama_token * n_max)()
    n = C.llama_tokenize(vocab, data, len(data), ids, n_max, True, False)
    if n < 0:
        raise RuntimeError(f"llama_tokenize needs {-n} tokens, more than {n_max}")
    return list(ids[:n])


def _run(C, model, req: dict) -> dict:
    """One run: a context with the run's ubatch and batch sizes; logits, greedy tokens and times per prompt."""
    if "texts" in req:
        prompts = [_tokenize(C, model, t) for t in req["texts"]]
    else:
        prompts = [list(map(int, p)) for p in req["prompts"]]
    gen = int(req.get("gen", 0))
    n_batch = int(req.get("n_batch", 2048))
    cp = C.llama_context_default_params()
    cp.n_ctx = max(len(p) for p in prompts) + gen + 16
    cp.n_batch = n_batch
    cp.n_ubatch = int(req.get("n_ubatch", 512))
    cp.n_threads = cp.n_threads_batch = int(req.get("threads", 2))
    cp.no_perf = True
    ctx = C.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
    batch = C.llama_batch_init(n_batch, 0, 1)
    mem = C.llama_get_memory(ctx)

    def decode(tokens: list[int], start: int, last_logits: bool) -> None:
        for off in range(0, len(tokens), n_batch):
            part = tokens[off:off + n_batch]
            batch.n_tokens = len(part)
            for i, t in enumerate(part):
                batch.token[i] = t
                batch.pos[i] = start + off + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = last_logits and off + i == len(tokens) - 1
            rc = C.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

    def last() -> np.ndarray:
        ptr = C.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(vocab,)).astype(np.float32).copy()

    repeats = int(req.get("repeats", 1))
    logits, tokens, seconds, step_logits = [], [], [], []
    force = req.get("force")
    if force is not None and (len(force) != len(prompts) or any(len(f) < gen - 1 for f in force)):
        raise RuntimeError(f"force needs {gen - 1} tokens for each of the {len(prompts)} prompts")
    try:
        for i, p in enumerate(prompts):
            if req.get("set_n_prompt", True):
                os.environ["RIDGEFILL_N_PROMPT"] = str(len(p))
            times = []
            for _ in range(repeats):
                C.llama_memory_clear(mem, True)
                t0 = time.perf_counter()
                decode(p, 0, True)
                C.llama_synchronize(ctx)
                times.append(time.perf_counter() - t0)
            seconds.append(times)
            lg = last()
            logits.append(lg)
            new, steps = [], []
            for g in range(gen):
                tok = int(np.argmax(lg))
                new.append(tok)
                steps.append(lg)
                if g + 1 < gen:
                    decode([tok if force is None else int(force[i][g])], len(p) + g, True)
                    lg = last()
            tokens.append(new)
            step_logits.append(steps)
    finally:
        C.llama_batch_free(batch)
        C.llama_free(ctx)
    out = {"logits": np.stack(logits), "tokens": np.array(tokens, dtype=np.int64).reshape(len(prompts), gen),
           "seconds": np.array(seconds, dtype=np.float64), "lengths": np.array([len(p) for p in prompts])}
    if req.get("step_logits"):
        out["step_logits"] = np.array(step_logits, dtype=np.float32).reshape(len(prompts), gen, -1)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
