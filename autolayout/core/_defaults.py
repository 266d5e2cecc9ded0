"""The defaults every face of autolayout shares, written once: ``al.plan``/``al.compare`` and
``autolayout plan``/``compare`` read them here, so the API and the command line answer one
question the same way (issue 38: ``al.plan`` planned the step as written and answered
INFEASIBLE where the command line chose a remat policy and fitted).

- ``DEFAULT_TIME_LIMIT_S``: seconds for the whole call, loading/tracing the model included.
- ``DEFAULT_REMAT``: ``"auto"``: the step as written where a plan of it fits, else the fastest remat
  policy that fits (``search.planner.remat_candidates``).
- ``DEFAULT_SCHEDULE``: the pipeline schedule priced where stages are tried (``"gpipe"``: what
  ``al.apply`` and ``autolayout run`` run).
- ``DEFAULT_GAP``: the search ends a shape, and the whole search, once its plan is proven within
  this fraction of the bound (as a MIP solver's relative gap: OPTIMAL means proven within it).
"""

from __future__ import annotations

DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_REMAT = "auto"
DEFAULT_SCHEDULE = "gpipe"
DEFAULT_GAP = 0.02
