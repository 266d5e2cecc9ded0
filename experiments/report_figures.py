"""The figures ``plan.figures()`` draws, for the README: the example GPT (GPT-3 Small's widths,
2 layers, batch 32) planned on tpu-v4-16, as in ``experiments/notebooks/inspect_plan.ipynb``.

    python experiments/report_figures.py --out experiments/results  # report_{name}.png, report_plan.json
    python experiments/report_figures.py --plot   # redraws the figures from the committed report_plan.json
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)


def main(replot: bool = False) -> None:
    OUT.mkdir(exist_ok=True)
    if replot:  # the figures of the committed plan file
        p = al.Plan.load(RESULTS / "report_plan.json")
    else:
        wl = al.load_workload(ROOT / "models" / "gpt.py", size="gpt3-small", layers=2, batch=32,
                              attention="naive")  # fmt: skip
        p = al.plan(wl, "tpu-v4-16", time_limit_s=20)
        p.to_json(OUT / "report_plan.json")
    for name, fig in p.figures().items():
        fig.savefig(OUT / f"report_{name}.png", dpi=110)
    print(p)
    print(p.report(by="layer").to_string())


if __name__ == "__main__":
    import sys

    OUT = take_out()
    main(replot=sys.argv[1:] == ["--plot"])
