import dataclasses

import pytest

import autolayout as al
from autolayout.core._dim_rules import reshape_groups
from autolayout.core._ir import GraphInvariantError


def _tiny_graph(**changes) -> al.Graph:
    tensors = {
        "t0": al.Tensor("t0", (4, 8), "float32", ("batch", "d"), role="input", path="x"),
        "t1": al.Tensor("t1", (8, 16), "float32", ("d", "f"), role="input", path="w"),
        "t2": al.Tensor("t2", (4, 16), "float32", ("batch", "f")),
    }
    op = al.Op(
        "dot_general.0", "dot_general", ("t0", "t1"), ("t2",),
        links=((("t0", 1), ("t1", 0)), (("t0", 0), ("t2", 0)), (("t1", 1), ("t2", 1))),
    )  # fmt: skip
    dims = {n: al.Dim(n, s, n, True) for n, s in (("batch", 4), ("d", 8), ("f", 16))}
    fields = dict(
        name="tiny", ops=(op,), tensors=tensors, dim_info=dims, inputs=("t0", "t1"), outputs=("t2",)
    )
    fields.update(changes)
    return al.Graph(**fields)


def test_well_formed_graph_passes_and_is_frozen():
    g = _tiny_graph()
    al.check_graph(g)
    assert g.dims == {"batch": 4, "d": 8, "f": 16}
    assert g.opaque == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.ops = ()
    assert g.tensors["t1"].nbytes == 8 * 16 * 4


def test_check_graph_catches_a_dim_of_the_wrong_size():
    g = _tiny_graph()
    bad = dict(g.tensors)
    bad["t2"] = al.Tensor("t2", (4, 16), "float32", ("batch", "d"))
    with pytest.raises(GraphInvariantError, match="t2 axis 1 has size 16, dim 'd' has size 8"):
        al.check_graph(_tiny_graph(tensors=bad))


def test_check_graph_catches_a_dim_twice_in_one_tensor():
    dims = {
        "d": al.Dim("d", 8, "d"),
        "batch": al.Dim("batch", 4, "batch"),
        "f": al.Dim("f", 16, "f"),
    }
    bad = dict(_tiny_graph().tensors)
    bad["t1"] = al.Tensor("t1", (8, 8), "float32", ("d", "d"), role="input", path="w")
    with pytest.raises(GraphInvariantError, match="carries dim 'd' twice"):
        al.check_graph(_tiny_graph(tensors=bad, dim_info=dims))


def test_check_graph_catches_use_before_definition():
    g = _tiny_graph()
    with pytest.raises(GraphInvariantError, match="reads t0 before any op writes it"):
        al.check_graph(
            _tiny_graph(
                inputs=("t1",),
                tensors={
                    **g.tensors,
                    "t0": dataclasses.replace(g.tensors["t0"], role="intermediate"),
                },
            )
        )


def test_check_graph_catches_links_of_unequal_sizes():
    g = _tiny_graph()
    op = dataclasses.replace(g.ops[0], links=((("t0", 0), ("t1", 0)),))
    with pytest.raises(GraphInvariantError, match="links axes of sizes"):
        al.check_graph(_tiny_graph(ops=(op,)))


@pytest.mark.parametrize(
    "src, dst, groups",
    [
        ((8, 12, 64), (8, 768), [((0,), (0,)), ((1, 2), (1,))]),
        ((8, 768), (8, 12, 64), [((0,), (0,)), ((1,), (1, 2))]),
        ((2, 3, 1, 4), (6, 4), [((0, 1), (0,)), ((3,), (1,))]),
        ((4, 6), (6, 4), [((0, 1), (0, 1))]),
    ],
)
def test_reshape_groups(src, dst, groups):
    assert reshape_groups(src, dst) == groups
