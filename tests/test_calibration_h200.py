"""The predictions against one real H200 (experiments/calibration_h200.py) are re-run from the
measured tables here, without a GPU, and must equal the committed results: a change to the
cost model that moves them is seen, and the committed figures stay the code's."""

import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import calibration_h200 as cal  # noqa: E402

RESULTS = json.loads((ROOT / "experiments" / "results" / "calibration_h200.json").read_text())


def test_the_attention_fit_holds_out_within_15_percent():
    fit = cal.fit_attention(cal.read("h200-attention.csv"))
    assert all(abs(r - 1) <= 0.15 for r in fit["leave_one_out_ratio"])
    assert fit["efficiency"] == pytest.approx(RESULTS["attention_fit"]["efficiency"], rel=1e-6)


@pytest.mark.parametrize("i", range(11))
def test_every_measured_row_is_predicted_as_committed(i):
    row = cal.read("h200-single-chip.csv")[i]
    got = cal.predict_row(row)
    want = RESULTS["rows"][i]
    assert got["options"] == want["options"]
    assert got["time_ratio"] == pytest.approx(want["time_ratio"], rel=1e-3)
    assert got["memory_ratio"] == pytest.approx(want["memory_ratio"], rel=1e-3)
