"""One quick check on the real default model (SmolLM2-135M-Instruct, cached after the first fetch):
exact prefill retrieves a filled-region needle, and splicing the exact K and V into an identity
fill reproduces the exact NLL."""

import torch

from ridgefill.data.texts import EVALUATION_BOOKS, load_texts
from ridgefill.data.models import load_model
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


def test_real_model_induction_heads():
    """SmolLM2's strongest copy heads, found from weights alone, lie in its late layers (17-23): those
    row selection listens to (measured: (17, 3) 0.83, (18, 6) 0.89)."""
    from ridgefill.adapters import adapter_for
    from ridgefill.select import induction_scores

    model, _, _ = load_model()
    scores = induction_scores(adapter_for(model))
    assert scores.shape == (30, 9) and bool(((scores >= 0) & (scores <= 1)).all())
    top = torch.topk(scores.flatten(), 2).indices.tolist()
    assert {divmod(i, 9) for i in top} == {(17, 3), (18, 6)}
    assert float(scores[17, 3]) > 0.7 and float(scores[18, 6]) > 0.7
    assert float(scores[:8].max()) < 0.3  # the first layers copy nothing
    assert induction_scores(adapter_for(model)) is scores  # computed once per model
