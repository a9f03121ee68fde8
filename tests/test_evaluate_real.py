"""One quick check on the real default model (SmolLM2-135M-Instruct, cached after the first fetch):
exact prefill retrieves a filled-region needle, and splicing the exact K and V into an identity
fill reproduces the exact NLL."""

import torch

from ridgefill.assets import EVALUATION_BOOKS, load_model, load_texts
from ridgefill.evaluate.loss import tail_nll
from ridgefill.evaluate.needles import answer_case, case_rng, haystack_sentences, make_case, score_answer
from ridgefill.evaluate.splice import exact_kv, splice_hook


def test_real_model_needle_and_splice():
    model, tok, _ = load_model()
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    case = make_case(tok, sentences, length=512, tail=64, variant="single", rng=case_rng(0, "single", 512, 0),
                     depth=0.3)
    assert case.needle_in_filled_rows() and 0.2 < case.depth < 0.4
    answer = answer_case(model, tok, case, mode="exact", max_new_tokens=10)
    assert score_answer(answer, case.answer) == 100.0, answer
    doc = case.input_ids[:257]
    exact, _, res = tail_nll(model, doc, tail=32, mode="exact")
    fill, _, _ = tail_nll(model, doc, tail=32, mode="identity", split=15)
    assert (fill - exact).abs().max() > 0.05
    hook = splice_hook(exact_kv(res.cache, range(16, 30)), "kv")
    spliced, _, _ = tail_nll(model, doc, tail=32, mode="identity", split=15, kv_hook=hook)
    torch.testing.assert_close(spliced, exact, rtol=0, atol=1e-4)
