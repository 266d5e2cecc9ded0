"""Predicted collectives and FLOPs against what XLA compiles, on 8 CPU devices.

For every example model (tiny sizes, with heads or channels that 8 divides) under each
hand-written layout: the bytes of each collective kind within 10% of the compiled HLO's, no
compiled kind the plan did not predict, FLOPs within 10% of ``cost_analysis()``.
"""

import pytest

import autolayout as al
from autolayout.runtime import hlo_collectives
from autolayout.search.baselines import standard_layout
from conftest import MODEL_NAMES, load_model

OPTIONS = {
    "gpt": dict(heads=8),
    "moe": dict(heads=8),
    "t5": dict(heads=8),
    "mlp": {},
    "unet3d": dict(batch=8, channels=8),
}
LAYOUTS = ("dp", "fsdp", "megatron", "2d")
_graphs: dict[str, tuple] = {}


def _model(name):
    if name not in _graphs:
        wl = load_model(name, **OPTIONS[name])
        _graphs[name] = (wl, al.trace(wl))
    return _graphs[name]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_prediction_matches_xla(model, layout):
    wl, g = _model(model)
    mesh, rules = standard_layout(g, layout, 8)
    plan = al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g)
    v = al.validate(plan).set_index("quantity")
    kinds = [q for q in v.index if q not in ("flops", "memory")]
    for kind in kinds:  # a kind on one side only has ratio 0 or inf
        assert abs(v.loc[kind, "ratio"] - 1) <= 0.10, (kind, v)
    assert abs(v.loc["flops", "ratio"] - 1) <= 0.10, v
    assert v.loc[v["checked"], "ok"].all()
    if layout != "dp":  # every layout but DP moves more than the gradient all-reduce
        assert len(kinds) >= 1


def test_hlo_collectives_reads_groups_bytes_and_loop_trips():
    hlo = """HloModule m

%body (p: (s32[], f32[8,4])) -> (s32[], f32[8,4]) {
  %ar = f32[8,4]{1,0} all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add
  %ag = (f32[16,4]{1,0}, bf16[2]{0}) all-gather(%y, %z), replica_groups=[2,4]<=[8], dimensions={0}
}

ENTRY %main (a: f32[8,4]) -> f32[8,4] {
  %w = (s32[], f32[8,4]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %cp = f32[2,2]{1,0} collective-permute(%a), source_target_pairs={{0,1},{1,0}}
  ROOT %a2a = f32[8,4]{1,0} all-to-all(%a), replica_groups=mesh['x'=2,'y'=4] {'y'}, dimensions={0}
}
"""
    got = {(c.kind, c.bytes, c.group, c.count) for c in hlo_collectives(hlo)}
    assert got == {
        ("all-reduce", 128, 2, 3),
        ("all-gather", 16 * 4 * 4 + 2 * 2, 4, 3),
        ("collective-permute", 16, 2, 1),
        ("all-to-all", 128, 4, 1),
    }


def test_hlo_group_size_reads_every_replica_group_form():
    from autolayout.runtime.validate import _group_size

    assert _group_size("x = f32[4] all-reduce(y), replica_groups={{0,1,2,3},{4,5,6,7}}") == 4
    assert _group_size("x = f32[4] all-reduce(y), replica_groups=[4,2]<=[2,4]T(1,0)") == 2
    line = ("x = f32[64,16] all-reduce(y), replica_groups=mesh['axis_0'=1,'axis_1'=4,"
            "'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, use_global_device_ids=true")  # fmt: skip
    assert _group_size(line) == 4
    assert _group_size("x = f32[4] all-reduce(y), replica_groups=mesh['a'=2,'b'=4] {'a','b'}") == 8
