"""crossval's Hypothesis profiles and the summary table printed after ``pytest crossval``.

Profiles (choose with ``HYPOTHESIS_PROFILE``): ``ci`` (the default: derandomized, so every run draws
the same examples, and sized so that the whole of ``pytest crossval`` takes about a minute on two
cores) and ``thorough`` (random, ten times the examples, for local hunting).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_COMMON = {"deadline": None, "print_blob": True,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]}
# ci: no shrinking phase, so that a failing run reports its first failing example at once (shrinking
# a failure of the model tests can take minutes); "thorough" shrinks.
settings.register_profile("ci", derandomize=True, max_examples=40, database=None,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate], **_COMMON)
settings.register_profile("thorough", max_examples=400, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print theorem → property tests → examples run → certificates checked, from :mod:`crossval.tally`.

    One row per main theorem; the supporting lemmas of a file that share their tests share a row."""
    import textwrap

    from crossval import tally
    from crossval.registry import REGISTRY

    if not tally.examples and not tally.certificates_total:
        return  # crossval did not run
    rows: dict[tuple, list] = {}
    for e in REGISTRY:
        name = e.theorem.removeprefix("KvaLean.")
        key = (e.file, e.tests) if e.note.startswith("supporting lemma") else (e.theorem,)
        row = rows.setdefault(key, [[], e.tests, sum(tally.examples[t] for t in e.tests), 0])
        row[0].append(name)
        row[3] = max(row[3], tally.certificates[e.theorem])
    tr = terminalreporter
    tr.section("crossval: KvaLean theorems checked")
    w0, w1 = 34, 58
    tr.write_line(f"{'theorem (KvaLean.)':<{w0}}  {'property tests':<{w1}}  {'examples':>8}  {'certificates':>12}")
    for key, (names, tests, ex, certs) in rows.items():
        label = names[0] if len(names) == 1 else f"{len(names)} lemmas in {key[0].split('/')[-1]}"
        lines = textwrap.wrap(", ".join(t.split("::")[1] for t in tests), w1) or ["-"]
        tr.write_line(f"{label:<{w0}}  {lines[0]:<{w1}}  {ex:>8}  {certs:>12}")
        for line in lines[1:]:
            tr.write_line(f"{'':<{w0}}  {line}")
    tr.write_line(f"{'total (each test once)':<{w0}}  {'':<{w1}}  {sum(tally.examples.values()):>8}  "
                  f"{tally.certificates_total:>12}")
