"""The lm-evaluation-harness model (:mod:`ridgefill.evaluate.harness`) on a tiny random Llama with a byte-level
tokenizer: generation and log-likelihoods against exact prefill and the fill computed directly, the refusals."""

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from ridgefill import InputError, generate_after, prefill
from ridgefill.evaluate.harness import RidgeFillLM
from conftest import oracle_maps
from evaluate_helpers import save_byte_model

TEXT = "The keeper of the lighthouse wrote the number 4821 in the log, then climbed the stairs again. " * 3


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("harness") / "model", seed=3)


def _gen(context, **kwargs):
    return Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 12, **kwargs}), 0)


def _ll(context, continuation):
    return Instance("loglikelihood", {}, (context, continuation), 0)


def test_registered_with_lm_eval():
    assert get_model("ridgefill") is RidgeFillLM


def test_generate_until_is_prefill_then_generate_after(byte_model):
    model, tok = byte_model
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    maps = oracle_maps(model, ids, 2)
    for mode, select in (("exact", None), ("ridge", "off"), ("identity", "off")):
        lm = RidgeFillLM(model, maps if mode == "ridge" else None, tokenizer=tok, mode=mode, tail=16, split=2,
                         select=select)
        direct = generate_after(model, ids, prefill(model, ids, lm.maps, mode=mode, tail=16, split=2, select="off"),
                                max_new_tokens=12)[0]
        text = tok.decode(direct, skip_special_tokens=True)
        (got,) = lm.generate_until([_gen(TEXT)], disable_tqdm=True)
        assert got == text and len(direct) == 12
        cut = text[4:6]  # `until` cuts at its first occurrence
        (short,) = lm.generate_until([_gen(TEXT, until=[cut])], disable_tqdm=True)
        assert short == text[:text.index(cut)]
        assert lm.stats["requests"] == 2 and lm.stats["rows"] == 2 * ids.shape[1]
        assert lm.stats["exact_rows"] == (2 * ids.shape[1] if mode == "exact" else 32)


def test_loglikelihood_from_the_exact_tail(byte_model):
    model, tok = byte_model
    context, continuation = TEXT[:-20], TEXT[-20:]
    whole = tok(context + continuation)["input_ids"]
    n_cont = len(whole) - len(tok(context)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), -1)
    target = torch.tensor(whole[-n_cont:])
    exact = float(logp[-n_cont - 1:-1].gather(1, target[:, None]).sum())
    greedy = bool((logp[-n_cont - 1:-1].argmax(-1) == target).all())
    maps = oracle_maps(model, torch.tensor([whole[:-1]]), 2)  # interpolates these rows: the fill is exact
    for mode, want in (("exact", exact), ("ridge", exact)):
        lm = RidgeFillLM(model, maps if mode == "ridge" else None, tokenizer=tok, mode=mode, tail=24, split=2,
                         select="off")
        ((score, is_greedy),) = lm.loglikelihood([_ll(context, continuation)], disable_tqdm=True)
        assert score == pytest.approx(want, abs=2e-3) and is_greedy == greedy
    identity = RidgeFillLM(model, None, tokenizer=tok, mode="identity", tail=24, split=2, select="off")
    ((score, _),) = identity.loglikelihood([_ll(context, continuation)], disable_tqdm=True)
    assert abs(score - exact) > 0.05  # the filled rows' K/V reach the tail's logits


def test_refusals(byte_model, tmp_path):
    model, tok = byte_model
    lm = RidgeFillLM(model, None, tokenizer=tok, mode="identity", tail=8, split=2)
    with pytest.raises(InputError, match="longer than tail=8"):
        lm.loglikelihood([_ll(TEXT[:50], "a short one"), _ll(TEXT[:50], TEXT[50:90])], disable_tqdm=True)
    assert lm.stats["requests"] == 0  # checked before any request ran
    with pytest.raises(InputError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (TEXT,), 0)])
    with pytest.raises(InputError, match="greedily"):
        lm.generate_until([_gen(TEXT, do_sample=True)], disable_tqdm=True)
    with pytest.raises(InputError, match="not supported"):
        lm.generate_until([_gen(TEXT, top_p=0.9)], disable_tqdm=True)
    with pytest.raises(InputError, match="truncates nothing"):
        RidgeFillLM(model, None, tokenizer=tok, mode="exact", max_length=64).generate_until([_gen(TEXT)])
    for kwargs, match in ((dict(mode="ridge"), "needs maps"), (dict(mode="fast"), "not one of"),
                          (dict(mode="exact", batch_size=4), "one request at a time"),
                          (dict(mode="exact", tail="x"), "integer"), (dict(mode="exact", temperature=1), "unknown"),
                          (dict(maps=str(tmp_path / "missing.safetensors")), "does not exist"),
                          (dict(mode="exact", device="cuda"), "--device cpu")):
        with pytest.raises(InputError, match=match):  # all before a model loads (the spec does not exist)
            RidgeFillLM(str(tmp_path / "no-model"), **kwargs)
    with pytest.raises(InputError, match="own tokenizer"):
        RidgeFillLM(str(byte_model_folder(tmp_path)), None, mode="exact", tokenizer=str(tmp_path))


def byte_model_folder(tmp_path):
    folder = tmp_path / "folder-model"
    save_byte_model(folder, seed=1)
    return folder


# RULER's niah_single_1 at 1,024 tokens on the bundled SmolLM2 through lm-eval's own `simple_evaluate`, with maps
# fitted on 2,048 tokens of the shipped calibration text at the default split: per system, the samples answered
# (of RULER_SAMPLES; RULER scores the share of the needle's values found in the answer), as measured: exact prefill
# answers all four; with maps this small the plain fill answers none and the default selection one.
RULER_SAMPLES = 4
RULER_RECORDED = {"exact": 4, "fill, selection off": 0, "fill, default selection": 1}


def test_ruler_niah_through_lm_eval():
    import lm_eval

    from ridgefill import calibrate, load_model, model_folder

    model, tok, _ = load_model()
    maps = calibrate(model, tok, tokens=2048, chunk=1024, progress=False)
    systems = {"exact": dict(mode="exact"), "fill, selection off": dict(select="off"), "fill, default selection": {}}
    got, rows = {}, {}
    for name, settings in systems.items():
        lm = RidgeFillLM(model, maps, tokenizer=tok, **settings)
        out = lm_eval.simple_evaluate(model=lm, tasks=["niah_single_1"], limit=RULER_SAMPLES,
                                      gen_kwargs={"max_gen_toks": 12}, bootstrap_iters=0,
                                      metadata={"tokenizer": str(model_folder()), "max_seq_lengths": [1024]})
        scores = [s["1024"] for s in out["samples"]["niah_single_1"]]
        assert len(scores) == RULER_SAMPLES and set(scores) <= {0.0, 1.0}
        assert out["results"]["niah_single_1"]["1024,none"] == pytest.approx(sum(scores) / RULER_SAMPLES)
        got[name] = int(sum(scores))
        rows[name] = lm.stats["exact_rows"] / lm.stats["rows"]
    assert rows["exact"] == 1.0 and rows["fill, selection off"] < rows["fill, default selection"] < 1.0
    assert got == RULER_RECORDED
