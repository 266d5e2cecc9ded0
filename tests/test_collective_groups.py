"""One group of devices, one price: a collective over neighbouring mesh axes ``(a, b)`` is the
collective over one axis of ``a x b`` devices on the mesh with them merged (devices are row
major over the mesh, so the group holds the same devices in the same order). Every shipped
hardware profile, every mesh shape the planner tries, every run of neighbouring axes, every
collective kind.

Found by merging a plan's axes (``search/final.py::_merge``): on tpu-v5e-8 (a 2 x 4 torus,
no wraparound below 16 chips) the group ``fsdp x fsdp2`` of mesh ``2 x 4`` was priced as a
closed ring of 4 along y, the one axis of 8 as the open ring it is: the search chose the
two-axis mesh for a bandwidth the slice does not have (the README MLP's ``fsdp=2 x fsdp2=4``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import autolayout as al
from autolayout.cost_models.collectives import KINDS, collective_time, group_segments, place_mesh
from autolayout.search.meshes import mesh_shapes

# every profile, small and large slices, open and closed tori, one and several GPU nodes
HARDWARE = ["cpu-8", "tpu-v2-32", "tpu-v3-32", "tpu-v4-8", "tpu-v4-32", "tpu-v4-256",
            "tpu-v4-1024", "tpu-v5e-8", "tpu-v5e-32", "tpu-v5e-256", "tpu-v5p-16", "tpu-v5p-128",
            "tpu-v6e-8", "tpu-v6e-64", "h100-8", "h100-64", "h200-16", "a100-80gb-32",
            "b200-16", "gb200-nvl72-144"]  # fmt: skip
MiB = 2**20


def _merged(mesh: dict[str, int], i: int, j: int) -> dict[str, int]:
    """``mesh`` with axes ``i..j`` (neighbours) made one, named after the first."""
    names = list(mesh)
    out = {}
    for k, a in enumerate(names):
        if k == i:
            out[a] = 1
            for b in names[i : j + 1]:
                out[a] *= mesh[b]
        elif not i < k <= j:
            out[a] = mesh[a]
    return out


@pytest.mark.parametrize("name", HARDWARE)
def test_a_group_of_neighbouring_axes_costs_what_its_merged_axis_costs(name):
    hw = al.hardware(name)
    checked = 0
    for mesh in mesh_shapes(hw):
        names = list(mesh)
        placed = place_mesh(hw, mesh)
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                one = _merged(mesh, i, j)
                try:
                    merged = place_mesh(hw, one)
                except al.core.MeshError:  # not every product tiles the machine
                    continue
                group = group_segments(placed, tuple(names[i : j + 1]))
                single = group_segments(merged, (names[i],))
                for kind in KINDS:
                    for nbytes in (4 * 1024, 64 * MiB):
                        a = collective_time(hw, kind, group, nbytes)
                        b = collective_time(hw, kind, single, nbytes)
                        assert a == pytest.approx(b, rel=1e-12), (
                            name,
                            mesh,
                            one,
                            kind,
                            group,
                            single,
                        )
                checked += 1
    assert checked, f"{name}: no mesh with two axes to merge"


def test_every_shipped_profile_is_checked():
    families = {p.stem for p in (Path(al.__file__).parent.parent / "hw_profiles").glob("*.toml")}
    covered = {al.hardware(n).name.rsplit("-", 1)[0] for n in HARDWARE}
    assert families <= covered | {"cpu"}, families - covered
