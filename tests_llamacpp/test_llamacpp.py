"""RidgeFill in llama.cpp (engines/llamacpp, docs/llamacpp.md), on the bundled SmolLM2 Q4_1 GGUF.

Checked here:
- with the tail as long as the prompt (no filled token), and with RIDGEFILL_MAPS unset, the patched build's
  logits and greedy tokens equal stock llama.cpp's bit for bit;
- with fitted context maps and a tail shorter than the prompt, the first-token logits are close to
  ``ridgefill.prefill`` on the float32 copy of the same GGUF, as close as the two engines' exact prefills
  are to each other (both run the Q4_1 weights, dequantised; llama.cpp also rounds activations to 8 bits
  in its quantised matrix products and stores the KV cache in float16);
- along the PyTorch fill's greedy continuation (fed to llama.cpp token by token: teacher forcing), llama.cpp's
  argmax equals the reference's token at every step whose top-two logit margin in the reference exceeds
  twice the exact engines' logit gap on that prompt (half the range of their first-token logit difference:
  the largest difference up to a common shift, which does not move the argmax); closer steps may flip with
  the engines' rounding and are not judged;
- several ubatches (with ubatch boundaries inside the filled region, so the context maps carry the
  previous token's split state across them) give the same result as one.

Each build runs once, in one engines/llamacpp/driver.py process serving all its runs (the model loaded
once). The builds come from engines/llamacpp/build.sh (cached by the hash of the script and the patch);
.ci/test-llamacpp runs it first and passes its folder in RIDGEFILL_LLAMACPP.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engines" / "llamacpp"
N = 600          # prompt tokens
TAIL = 64        # exact tokens at its end
GEN = 12         # greedy tokens compared
OFFSETS = (20000, 60000)  # where the held-out prompts start in Persuasion (tokens)
UBATCHES = ((100, 100), (128, 256))  # (n_ubatch, n_batch) against one ubatch of 1,024
MIN_STEPS_COMPARED = 8  # greedy steps judged over both prompts, at least (measured: 7 + 4)


@pytest.fixture(scope="module")
def smollm2():
    from ridgefill.data.models import load_model

    model, tok, _ = load_model("smollm2")
    return model.eval(), tok


@pytest.fixture(scope="module")
def prompts(smollm2):
    from ridgefill.data.texts import load_texts

    ids = smollm2[1](load_texts()["Persuasion"], add_special_tokens=False)["input_ids"]
    return [ids[o:o + N] for o in OFFSETS]


@pytest.fixture(scope="module")
def maps(smollm2, build, tmp_path_factory):
    """Context maps at S = 15 fitted on 4,096 calibration tokens (chunks of 512), and their GGUF export for
    the bundled GGUF model."""
    from ridgefill.calibration import calibrate
    from ridgefill.export_gguf import export_gguf

    model, tok = smollm2
    m = calibrate(model, tok, split=15, tokens=4096, chunk=512, progress=False)
    assert m.context == 1 and m.split == 15
    path = export_gguf(m, tmp_path_factory.mktemp("maps") / "maps.gguf",
                       model=build / "SmolLM2-135M-Instruct.Q4_1.gguf", tail=TAIL)
    return m, path


def drive(build: Path, which: str, prompts, tmp: Path, runs: list[dict],
          force: list[list[int]] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Run ``runs`` (each ``{"name", "env", "n_ubatch", "n_batch"}``) in one driver process of build ``which``,
    decoding the tokens ``force`` (``GEN - 1`` per prompt) after each prompt, or greedily when ``None``.

    The process gets no ``RIDGEFILL_*`` variable but RIDGEFILL_CACHE and no LD_LIBRARY_PATH or LD_PRELOAD:
    the libraries must load through their own RUNPATH. Returns ``{name: {"logits", "tokens", "seconds"}}``.
    """
    req = {"build": str(build / which), "model": str(build / "SmolLM2-135M-Instruct.Q4_1.gguf"),
           "prompts": prompts, "n_ubatch": 1024, "n_batch": 1024, "gen": GEN, "threads": 2, "runs": runs}
    if force is not None:
        req["force"] = force
    (tmp / f"{which}.json").write_text(json.dumps(req))
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("RIDGEFILL_") or k == "RIDGEFILL_CACHE") and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    proc = subprocess.run([sys.executable, str(ENGINE / "driver.py"), str(tmp / f"{which}.json"),
                           str(tmp / f"{which}.npz")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(tmp / f"{which}.npz") as z:
        for key in z.files:
            name, field = key.split("/")
            out.setdefault(name, {})[field] = z[key]
    assert sorted(out) == sorted(r["name"] for r in runs)
    return out


@pytest.fixture(scope="module")
def engines(build, prompts, maps, reference, tmp_path_factory):
    """Every llama.cpp run the tests compare: stock exact, and the patched build off, with a tail as long as
    the prompt, with the fill (tail from the file: TAIL) in one ubatch and in several. Each decodes the
    reference fill's greedy tokens (teacher forcing); ``tokens`` is llama.cpp's argmax at each step."""
    tmp = tmp_path_factory.mktemp("llamacpp")
    fill_env = {"RIDGEFILL_MAPS": str(maps[1])}
    force = reference["tokens"][:, :-1].tolist()
    stock = drive(build, "stock", prompts, tmp, [{"name": "exact"}], force)
    patched = drive(build, "ridgefill", prompts, tmp, force=force, runs=[
        {"name": "off"},
        {"name": "full_tail", "env": {**fill_env, "RIDGEFILL_TAIL": N}},
        {"name": "fill", "env": fill_env},
        *({"name": f"fill_ub{ub}_b{nb}", "env": fill_env, "n_ubatch": ub, "n_batch": nb} for ub, nb in UBATCHES),
    ])
    return {"stock": stock["exact"], **patched}


def test_no_filled_token_is_stock_llamacpp(engines, prompts):
    stock = engines["stock"]
    for got in (engines["full_tail"], engines["off"]):
        assert np.array_equal(got["logits"], stock["logits"])
        assert np.array_equal(got["tokens"], stock["tokens"])
    assert stock["logits"].shape == (len(prompts), 49152) and np.isfinite(stock["logits"]).all()


def greedy_with_logits(model, ids: torch.Tensor, result, gen: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy continuation from ``result``'s cache (every decoding step exact, as ``generate_after``), with the
    logits each step chose from: ``([gen] int64 tokens, [gen, vocab] float32 logits)``."""
    cache, lg = result.cache, result.logits[0, -1]
    tokens, logits = [], []
    with torch.inference_mode():
        for g in range(gen):
            logits.append(lg.float().numpy().copy())
            tokens.append(int(lg.argmax()))
            if g + 1 < gen:
                assert cache.get_seq_length() == ids.shape[1] + g  # the next position follows the cache
                lg = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    return np.array(tokens, dtype=np.int64), np.stack(logits)


@pytest.fixture(scope="module")
def reference(smollm2, prompts, maps):
    """ridgefill.prefill (PyTorch, float32 copy of the GGUF): exact and fill logits of the last prompt token;
    the fill's greedy tokens and the logits of every greedy step."""
    from ridgefill import prefill

    model = smollm2[0]
    out = {"exact": [], "fill": [], "tokens": [], "step_logits": []}
    for p in prompts:
        ids = torch.tensor([p])
        out["exact"].append(prefill(model, ids, mode="exact").logits[0, -1].numpy())
        res = prefill(model, ids, maps[0], tail=TAIL, select="off")
        out["fill"].append(res.logits[0, -1].numpy())
        tokens, logits = greedy_with_logits(model, ids, res, GEN)
        out["tokens"].append(tokens)
        out["step_logits"].append(logits)
    return {k: np.stack(v) for k, v in out.items()}


def judged_steps(ref_logits: np.ndarray, gap: float) -> np.ndarray:
    """The greedy steps whose top-two logit margin in ``ref_logits`` ``[steps, vocab]`` exceeds ``2 * gap``:
    there an engine whose logits differ from these by at most ``gap`` (up to a common shift) has the same
    argmax. Returns a ``[steps]`` bool mask."""
    top2 = np.sort(ref_logits, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0] > 2 * gap


def centred_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Half the range of ``a - b`` over the last axis: the largest difference once a common shift is removed."""
    d = a - b
    return (d.max(axis=-1) - d.min(axis=-1)) / 2


def test_fill_matches_the_pytorch_reference(engines, reference):
    stock, fill = engines["stock"], engines["fill"]
    exact_gap = np.abs(stock["logits"] - reference["exact"]).max(axis=1)
    fill_gap = np.abs(fill["logits"] - reference["fill"]).max(axis=1)
    # the fill changed the logits (filled tokens are not exact), by more than the engines differ
    fill_effect = np.abs(reference["fill"] - reference["exact"]).max(axis=1)
    print(f"max |logit| gaps: exact llama.cpp vs PyTorch {exact_gap}, fill {fill_gap}, fill vs exact {fill_effect}")
    assert (fill_effect > 0.05).all()
    assert (fill_gap <= 1.5 * exact_gap + 0.05).all()
    assert (fill_gap < 1.0).all()
    assert np.array_equal(fill["logits"].argmax(1), reference["fill"].argmax(1))
    # greedy steps along the reference's continuation: where its margin exceeds twice the exact engines' gap,
    # llama.cpp's argmax must be the reference's token (measured: 7 of 12 and 4 of 12 steps judged, all agree)
    gap = centred_gap(stock["logits"], reference["exact"])
    judged = np.stack([judged_steps(rl, g) for rl, g in zip(reference["step_logits"], gap)])
    agree = fill["tokens"] == reference["tokens"]
    print(f"exact engines' centred gap {gap}; greedy steps judged (margin > 2 x gap), of {GEN}: "
          f"{judged.sum(axis=1).tolist()}; agreeing at every step: {agree.astype(int).tolist()}")
    assert agree[judged].all()
    assert judged.sum() >= MIN_STEPS_COMPARED


def test_several_ubatches_equal_one(engines):
    one = engines["fill"]
    for ub, nb in UBATCHES:
        many = engines[f"fill_ub{ub}_b{nb}"]
        assert np.abs(many["logits"] - one["logits"]).max() < 1e-3
        assert np.array_equal(many["tokens"], one["tokens"])
