"""Evaluation of the fill (paper, "Evaluation"): the measurements that show where its error is.

- :mod:`.documents`: the evaluation documents (held-out and novel-text); :mod:`.stats`: bootstrap and
  Wilson intervals.
- :mod:`.needles`: filled-region needle retrieval, RULER-style (single and multi-key).
- :mod:`.loss`: ΔNLL vs exact on all, key (context-dependent) and novel-text tokens, with bootstrap CIs.
- :mod:`.splice`: splice tests (exact K, V or key scale in the filled rows' late layers; in hybrid models the
  exact recurrent state, and the filled state's error per layer).
- :mod:`.depth`: the seed's table by split depth, and maps for several splits from one calibration pass.
- :mod:`.report`: JSON -> markdown + PNG; :mod:`ridgefill.cli.eval`: ``ridgefill eval ...`` and ``ridgefill report``.
- :mod:`.harness`: the lm-evaluation-harness model (``pip install -e '.[eval]'``; RULER through the fill).
"""

from .loss import key_token_mask, local_window_nll
from .needles import NeedleCase, make_case, score_answer
from .splice import COMPONENTS, components_for, splice_hook, state_errors
from .stats import Estimate, bootstrap_ci, wilson_interval

__all__ = ["COMPONENTS", "Estimate", "NeedleCase", "bootstrap_ci", "components_for", "key_token_mask",
           "local_window_nll", "make_case", "score_answer", "splice_hook", "state_errors", "wilson_interval"]
