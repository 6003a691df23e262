"""Mesh axes on the torus: the layout read from real libtpu topologies, the same layout derived without
devices, wraparound, slices, and the errors for meshes that do not fit."""

from __future__ import annotations

import pytest

from shardscope.case import topology
from shardscope.case.hardware import HardwareError, load_hardware
from shardscope.cost.layout import CORE, SLICE, Span, default_slice_shape, layout_for, layout_from_mesh
from shardscope.errors import MeshError, ShardscopeError
from shardscope.stages.devices import build_mesh, quiet_libtpu

MESHES = [
    ("v5p-16", (("data", 1), ("stage", 1), ("fsdp", 4), ("expert", 2))),
    ("tpu7x-8", (("data", 1), ("stage", 1), ("fsdp", 4), ("expert", 2))),
    ("v5p-128", (("fsdp", 16), ("expert", 4))),
    ("v6e-16", (("fsdp", 8), ("expert", 2))),
    ("v5e-16", (("fsdp", 4), ("expert", 4))),
    ("v5p-256", (("fsdp", 32), ("expert", 4))),
    ("2xv5p-16", (("data", 2), ("fsdp", 4), ("expert", 2))),
]


def _tpu_mesh(name, mesh):
    quiet_libtpu()
    return build_mesh(topology.get_topology(name), mesh, explicit=False)


def _signature(axis):
    """What prices an axis: its spans without the names of the torus dimensions (x/y/z are symmetric)."""
    return sorted((s.dim in (CORE, SLICE), s.extent, s.stride, s.length, s.wrap) for s in axis.spans)


@pytest.mark.parametrize(("name", "mesh"), MESHES)
def test_layout_without_devices_matches_the_libtpu_mesh(name, mesh):
    real = layout_from_mesh(_tpu_mesh(name, mesh))
    slices = topology.get_topology(name).slices
    derived = layout_for(real.hardware, mesh, slices=slices)
    assert derived.slice_shape == real.slice_shape and derived.slices == real.slices == slices
    assert [_signature(a) for a in derived.axes] == [_signature(a) for a in real.axes]


def test_v5p_16_axes_on_the_cube():
    layout = layout_from_mesh(_tpu_mesh(*MESHES[0]))
    assert layout.hardware == "v5p" and layout.slice_shape == (2, 2, 2) and layout.source == "devices"
    assert layout.axis("expert").spans == (Span("x", 2, 1, 2, False),)
    assert layout.axis("fsdp").spans == (Span("y", 2, 1, 2, False), Span("z", 2, 1, 2, False))
    assert layout.axis("data").spans == ()


def test_tpu7x_puts_the_last_axis_on_the_two_dies_of_a_chip():
    layout = layout_from_mesh(_tpu_mesh(*MESHES[1]))
    assert layout.hardware == "tpu7x" and layout.slice_shape == (2, 2, 1)
    assert layout.axis("expert").dims == (CORE,)
    assert layout.axis("fsdp").dims == ("x", "y")


def test_full_cubes_close_their_rings():
    layout = layout_from_mesh(_tpu_mesh(*MESHES[2]))
    assert layout.slice_shape == (4, 4, 4)
    assert all(span.closes for span in layout.group(["fsdp", "expert"]))


def test_a_split_dimension_has_a_stride():
    """v6e-16 (4x4): expert=2 takes the inner half of x, fsdp=8 the outer half (stride 2) and y."""
    layout = layout_from_mesh(_tpu_mesh(*MESHES[3]))
    assert layout.axis("expert").spans == (Span("x", 2, 1, 4, False),)
    assert layout.axis("fsdp").spans == (Span("x", 2, 2, 4, False), Span("y", 4, 1, 4, False))
    assert layout.group(["fsdp", "expert"]) == (Span("x", 4, 1, 4, False), Span("y", 4, 1, 4, False))


def test_the_data_axis_crosses_slices():
    layout = layout_from_mesh(_tpu_mesh(*MESHES[-1]))
    assert layout.slices == 2 and layout.axis("data").crosses_slices
    assert not layout.axis("fsdp").crosses_slices
    assert layout.group(["data", "fsdp"], within_slice=True) == layout.group(["fsdp"])


def test_layout_for_a_cpu_plan_uses_the_standard_slice_of_that_size():
    assert default_slice_shape(load_hardware("v5p"), 8) == (2, 2, 2)
    assert default_slice_shape(load_hardware("v6e"), 8) == (2, 4)
    assert default_slice_shape(load_hardware("tpu7x"), 8) == (2, 2, 1)
    # Between the listed sizes, whole 4x4x4 cubes: 768 v5p chips (12 cubes) price as 8x8x12.
    assert default_slice_shape(load_hardware("v5p"), 768) == (8, 8, 12)
    layout = layout_for("v5p", {"fsdp": 128, "expert": 2})  # v5p-512: 4x8x8, whole cubes
    assert layout.slice_shape == (4, 8, 8) and layout.source == "standard slice"
    assert all(span.closes for span in layout.group(["fsdp", "expert"]))


def test_a_mesh_larger_than_the_slice_is_one_line():
    with pytest.raises(MeshError) as err:
        layout_for("v5p", {"fsdp": 16, "expert": 2}, slice_shape=(2, 2, 2))
    assert str(err.value) == (
        "mesh fsdp=16,expert=2 needs 32 devices per slice, larger than the 2x2x2 v5p slice (8 devices); "
        "change --mesh or the topology"
    )


def test_a_mesh_no_standard_slice_holds_is_refused():
    with pytest.raises(HardwareError, match="12 devices are not a standard v5p slice"):
        layout_for("v5p", {"fsdp": 12})


def test_a_multi_slice_data_axis_must_divide():
    with pytest.raises(MeshError, match="mesh axis 'data', whose size 1 is not a multiple of 2"):
        layout_for("v5p", {"data": 1, "fsdp": 16}, slices=2)


def test_another_axis_may_span_the_slices():
    # MaxText's dcn_fsdp_parallelism: fsdp (32 = 16 in a slice × 2 slices) crosses them, data stays inside.
    layout = layout_for("v5p", {"data": 1, "fsdp": 32}, slices=2, dcn_axis="fsdp")
    assert layout.axis("fsdp").crosses_slices and not layout.axis("data").crosses_slices
    assert layout.group(["fsdp"], within_slice=True) == layout_for("v5p", {"data": 1, "fsdp": 16}).group(["fsdp"])
    with pytest.raises(MeshError, match="mesh axis 'fsdp', whose size 3 is not a multiple of 2"):
        layout_for("v5p", {"data": 32, "fsdp": 3}, slices=2, dcn_axis="fsdp")


def test_cpu_devices_have_no_torus():
    import jax

    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(ShardscopeError, match="needs TPU devices"):
        layout_from_mesh(mesh)
