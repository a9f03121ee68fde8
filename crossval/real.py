"""Maps fitted on the real default model (SmolLM2-135M-Instruct) and real calibration text, through
the project's own :func:`ridgefill.calibration.calibrate`: small, so that crossval stays quick, and fixed,
so that the statistics slices in ``KvaLean/CertExamples.lean`` can be recomputed and compared."""

from __future__ import annotations

import functools

from ridgefill import RidgeMaps

#: The real calibration: book, characters of it, tokens, chunk length, split and λ.
REAL = {"book": "Emma", "chars": 20000, "tokens": 512, "chunk": 128, "split": 27, "lam": "auto"}


@functools.cache
def real_maps() -> RidgeMaps:
    """Maps (with their float64 statistics) for the default model at ``REAL["split"]``."""
    from ridgefill.data.models import load_model
    from ridgefill.data.texts import load_texts
    from ridgefill.calibration import calibrate

    model, tok, name = load_model()
    text = load_texts()[REAL["book"]][: REAL["chars"]]
    return calibrate(model, tok, [text], split=REAL["split"], tokens=REAL["tokens"], chunk=REAL["chunk"],
                     lam=REAL["lam"], model_name=name, progress=False, context=0)
