"""A plan's status in words (issue 38: ``TIMEOUT`` on a plan within 0.8% of its bound read as a
failure). ``plan.status`` keeps its code (the plan file's contract); :func:`status_text` says
what it means for the user: proven, found within a stated gap, cut by the time limit, not
fitting, or interrupted, with ``plan.solver["stopped"]`` (why the search ended) after it."""

from __future__ import annotations

from typing import Any


def status_text(plan: Any) -> str:
    """One sentence: what the plan is worth, then why the search ended.

    >>> from types import SimpleNamespace as P
    >>> s = {"gap": 0.016, "stopped": "the time limit ended the search"}
    >>> status_text(P(status="TIMEOUT", solver=s))
    'found, within 1.6% of the best possible on its mesh; the time limit ended the search'
    >>> status_text(P(status="OPTIMAL", solver={"gap": 0.012, "gap_limit": 0.02}))
    'proven within 2% of the best possible (1.2% on its mesh)'

    ``OPTIMAL`` is proven within the call's ``gap_limit`` (``al.plan(gap=)``, 2% by default:
    a MIP solver's relative gap); "proven optimal" where the plan's own gap is nil.
    """
    s = getattr(plan, "solver", None) or {}
    code = plan.status
    if s.get("interrupted"):
        head = "interrupted: the best plan found before the signal"
    elif code == "OPTIMAL" and s.get("gap_limit") and (s.get("gap") or 0.0) >= 5e-4:
        head = (f"proven within {s['gap_limit'] * 100:g}% of the best possible "
                f"({s['gap']:.1%} on its mesh)")  # fmt: skip
    elif code == "OPTIMAL":
        head = "proven optimal (for the cost model)"
    elif code == "INFEASIBLE":
        head = "does not fit: the layout found that needs least memory"
    elif code == "EVALUATED":
        head = "evaluated: the layout given, priced"
    elif s.get("gap") is not None:
        head = f"found, within {s['gap']:.1%} of the best possible on its mesh"
    else:
        head = "found (no lower bound computed for its mesh)"
    stopped = s.get("stopped")
    if stopped and not s.get("interrupted") and code != "EVALUATED":
        head += f"; {stopped}"
    return head
