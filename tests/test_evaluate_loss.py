"""Key-token loss machinery: bootstrap CIs, local-window NLL, key tokens, novel documents, ordering."""

import math

import numpy as np
import pytest
import torch

from ridgefill import InputError, RidgeMaps
from ridgefill.evaluate.documents import novel_documents, proper_names, renamed_texts
from ridgefill.evaluate.loss import (DocScores, fill_variants, key_token_mask, key_token_stats, local_window_nll,
                                     score_documents, summarise, tail_nll, token_nll)
from ridgefill.evaluate.stats import bootstrap_ci, wilson_interval
from conftest import tiny_llama
from evaluate_helpers import ByteTokenizer, damp_late_layers

S = 2


def test_bootstrap_ci_ratio_of_sums_and_interval():
    est = bootstrap_ci([1.0, 2.0, 3.0], [1, 1, 2], resamples=4000, seed=3)
    assert est.mean == pytest.approx(6.0 / 4.0) and est.docs == 3 and est.tokens == 4
    assert est.lo < est.mean < est.hi and 1.0 <= est.lo and est.hi <= 2.0
    again = bootstrap_ci([1.0, 2.0, 3.0], [1, 1, 2], resamples=4000, seed=3)
    assert (again.lo, again.hi) == (est.lo, est.hi)  # seeded: reproducible
    # every document has the same per-token value: the interval collapses onto it
    same = bootstrap_ci([0.5, 1.5, 0.25], [1, 3, 0.5], resamples=500)
    assert same.mean == pytest.approx(0.5) and same.lo == pytest.approx(0.5) and same.hi == pytest.approx(0.5)


def test_bootstrap_ci_matches_normal_theory_for_many_documents():
    rng = np.random.default_rng(0)
    values = rng.normal(0.3, 1.0, size=400)
    est = bootstrap_ci(values, np.ones(400), resamples=4000, seed=1)
    half = 1.96 * values.std(ddof=1) / math.sqrt(400)
    assert est.mean == pytest.approx(values.mean())
    assert est.hi - est.lo == pytest.approx(2 * half, rel=0.1)


def test_bootstrap_ci_bad_input():
    with pytest.raises(InputError, match="equal-length"):
        bootstrap_ci([1.0], [1, 2])
    with pytest.raises(InputError, match="no token"):
        bootstrap_ci([0.0, 0.0], [0, 0])
    with pytest.raises(InputError, match="finite"):
        bootstrap_ci([float("nan")], [1])
    with pytest.raises(InputError, match="resamples"):
        bootstrap_ci([1.0], [1], resamples=0)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(10, 10)
    assert hi == pytest.approx(100.0) and lo == pytest.approx(72.25, abs=0.01)
    lo, hi = wilson_interval(0, 10)
    assert lo == pytest.approx(0.0) and hi == pytest.approx(27.75, abs=0.01)
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(23.66, abs=0.01) and hi == pytest.approx(76.34, abs=0.01)
    with pytest.raises(InputError):
        wilson_interval(3, 2)


def test_local_window_nll_matches_one_forward_per_token():
    model = tiny_llama(seed=4)
    doc = torch.randint(0, 101, (61,), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(21, 60)
    window = 8
    got = local_window_nll(model, doc, pos, window, batch=3)
    for i, p in enumerate(pos.tolist()):
        start = max(0, (p // window - 1) * window)
        assert window + 1 <= p - start + 1 <= 2 * window  # the stated local context
        with torch.no_grad():
            want = token_nll(model(doc[None, start:p + 1]).logits[0, -1:], doc[p + 1:p + 2])[0]
        assert got[i].item() == pytest.approx(want.item(), abs=1e-5)
    # a window covering the whole document gives the full-context NLL of the exact prefill
    full, full_pos, _ = tail_nll(model, doc, tail=20, mode="exact")
    wide = local_window_nll(model, doc, full_pos, 64)
    torch.testing.assert_close(wide, full, rtol=0, atol=1e-5)
    with pytest.raises(InputError, match="window"):
        local_window_nll(model, doc, pos, 0)
    with pytest.raises(InputError, match="positions"):
        local_window_nll(model, doc, torch.tensor([60]), 8)


def test_local_window_nll_puts_the_special_prefix_before_each_window():
    """With ``prefix_tokens=1`` a window that starts after row 0 sees the document's first token (the
    BOS) and then its own local tokens; windows starting at row 0 already begin with it."""
    model = tiny_llama(seed=5)
    doc = torch.randint(1, 101, (41,), generator=torch.Generator().manual_seed(3))
    doc[0] = 0  # the "BOS"
    pos = torch.arange(4, 40)
    window = 8
    got = local_window_nll(model, doc, pos, window, batch=2, prefix_tokens=1)
    plain = local_window_nll(model, doc, pos, window, batch=2)
    for i, p in enumerate(pos.tolist()):
        start = max(0, (p // window - 1) * window)
        ctx = doc[start:p + 1] if start == 0 else torch.cat([doc[:1], doc[start:p + 1]])
        with torch.no_grad():
            want = token_nll(model(ctx[None]).logits[0, -1:], doc[p + 1:p + 2])[0]
        assert got[i].item() == pytest.approx(want.item(), abs=1e-5)
        if start == 0:
            assert got[i].item() == pytest.approx(plain[i].item(), abs=1e-6)
    assert not torch.allclose(got[pos >= 2 * window], plain[pos >= 2 * window])  # the prefix is really there


def test_key_token_mask():
    full = torch.tensor([1.0, 2.0, 0.5, 3.0])
    local = torch.tensor([1.2, 3.5, 0.5, 2.0])
    assert key_token_mask(full, local, 1.0).tolist() == [False, True, False, False]
    assert key_token_mask(full, local, 0.0).tolist() == [True, True, True, False]
    with pytest.raises(InputError, match="τ"):
        key_token_mask(full, local, -1.0)


def test_renamed_texts_replace_names_consistently():
    text = ("Anne walked to Lyme. " * 6 + "Mrs Smith met Anne and the Musgroves. " * 9
            + "The Musgrove house was full. " * 10 + "the end of the day.")
    assert proper_names(text, min_count=8) == ["Anne", "Musgrove", "Smith", "Musgroves"]
    renamed, mappings = renamed_texts({"b": text}, seed=1)
    out, mapping = renamed["b"], mappings["b"]
    assert "Anne" not in out and "Smith" not in out and "Musgrove" not in out and "Mrs" in out  # titles kept
    assert "Lyme" in out  # 6 occurrences: below min_count
    assert out.count(mapping["Anne"]) == text.count("Anne")
    assert mapping["Musgroves"] == mapping["Musgrove"] + "s"  # plurals follow their stem
    assert len(set(mapping.values())) == len(mapping)
    assert renamed_texts({"b": text}, seed=1)[0]["b"] == out  # seeded
    assert renamed_texts({"b": text}, seed=2)[0]["b"] != out


def test_novel_documents_come_from_the_other_half():
    tok = ByteTokenizer()
    texts = {"b": "".join(f"paragraph {i}: Anne met Wentworth near Lyme.\n\n" for i in range(200))}
    docs, mapping = novel_documents(tok, texts, 2, 100, seed=0)
    assert len(docs) == 2 and all(d.numel() == 101 for d in docs)
    first = tok.decode(docs[0])
    assert first.startswith("paragraph ") and 95 <= int(first.split()[1].rstrip(":")) <= 105  # the middle
    assert "Anne" not in first and mapping["b"]["Anne"] in first


def _records():
    a = DocScores("plain", [0, 1, 2], exact=[1.0, 1.0, 1.0], local=[3.0, 1.0, 1.0], fill={"2/x": [2.0, 1.0, 1.5]})
    b = DocScores("novel", [0, 1], exact=[2.0, 2.0], local=[2.0, 4.0], fill={"2/x": [2.0, 3.0]})
    return [a, b]


def test_summarise_known_values():
    rows = summarise(_records(), tau=1.0, resamples=200)
    get = {(r["set"], r["tokens"]): r for r in rows}
    assert get[("plain", "all")]["delta_nll"]["mean"] == pytest.approx(1.5 / 3)
    assert get[("plain", "key")]["delta_nll"]["mean"] == pytest.approx(1.0)  # token 0 only
    assert get[("novel", "key")]["delta_nll"]["mean"] == pytest.approx(1.0)  # token 1 only
    assert get[("all", "key")]["delta_nll"]["mean"] == pytest.approx(1.0)
    assert get[("all", "all")]["delta_nll"]["tokens"] == 5
    stats = key_token_stats(_records(), 1.0)
    assert stats["all"] == {"documents": 2, "tokens": 5, "key_tokens": 2, "key_fraction": 0.4}


def test_ordering_ridge_identity_none_on_a_constructed_model():
    """Late layers damped by ε: identity's error is O(ε²), no fill's O(ε); oracle maps (fitted on the
    document itself, exact for fewer rows than the hidden size) make ridge exact."""
    model = damp_late_layers(tiny_llama(seed=11), S, 0.1)
    doc = torch.randint(0, 101, (49,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hs = model(doc[None, :-1], output_hidden_states=True).hidden_states
    h = torch.cat([hs[S + 1][0].double(), torch.ones(48, 1, dtype=torch.float64)], 1)
    sols = [torch.linalg.lstsq(h, hs[l][0].double()).solution for l in range(S + 1, 6)]
    maps = RidgeMaps(S, torch.stack([s[:-1] for s in sols]).float(), torch.stack([s[-1] for s in sols]).float(),
                     [0.0] * len(sols))
    recs = score_documents(model, [doc], ["plain"], tail=8, window=4,
                           variants=fill_variants(model, {S: maps}, ["ridge", "identity", "none"], tail=8))
    delta = {r["variant"]: abs(r["delta_nll"]["mean"]) for r in summarise(recs, tau=0.0, resamples=10)
             if r["tokens"] == "all"}
    err = {k: max(abs(a - b) for a, b in zip(recs[0].fill[k], recs[0].exact)) for k in recs[0].fill}
    assert err["2/ridge"] < 1e-3 < err["2/identity"] < err["2/none"] / 3
    assert delta["2/ridge"] < delta["2/none"]


def test_selection_variants_score_the_tail_only():
    """A selection whose budget covers every filled row makes the identity fill exact; the tail is still
    the only scored part (the chosen rows add no scored tokens)."""
    from ridgefill.select import Select

    model = tiny_llama(seed=11)
    doc = torch.randint(0, 101, (49,), generator=torch.Generator().manual_seed(5))
    variants = fill_variants(model, {S: None}, ["identity"], tail=8, selects=[Select(budget=1000), Select(budget=4)],
                             select_modes=["identity"])
    assert list(variants) == ["2/identity", "2/identity+sel0", "2/identity+sel1"]
    recs = score_documents(model, [doc], ["plain"], tail=8, window=4, variants=variants)
    fill, exact = recs[0].fill, recs[0].exact
    assert all(len(v) == 8 for v in fill.values())
    assert max(abs(a - b) for a, b in zip(fill["2/identity+sel0"], exact)) < 1e-4
    assert max(abs(a - b) for a, b in zip(fill["2/identity"], exact)) > 1e-3
