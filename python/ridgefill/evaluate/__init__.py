"""Evaluation of the fill (paper, "Evaluation"): the measurements that show where its error is.

- :mod:`.needles`: filled-region needle retrieval, RULER-style (single and multi-key).
- :mod:`.loss`: ΔNLL vs exact on all, key (context-dependent) and novel-text tokens, with bootstrap CIs.
- :mod:`.splice`: splice tests (exact K, V or key scale in the filled rows' late layers; in hybrid models the
  exact recurrent state, and the filled state's error per layer).
- :mod:`.depth`: the seed's table by split depth, and maps for several splits from one calibration pass.
- :mod:`.report`: JSON -> markdown + PNG; :mod:`.cli`: ``ridgefill eval ...`` and ``ridgefill report``.
"""

from .loss import Estimate, bootstrap_ci, key_token_mask, local_window_nll, wilson_interval
from .needles import NeedleCase, make_case, score_answer
from .splice import COMPONENTS, components_for, splice_hook, state_errors

__all__ = ["COMPONENTS", "Estimate", "NeedleCase", "bootstrap_ci", "components_for", "key_token_mask",
           "local_window_nll", "make_case", "score_answer", "splice_hook", "state_errors", "wilson_interval"]
