"""What a plan costs on a target TPU: step time and memory, per mesh axis, op and pass.

`hardware` (the published figures of each generation, `hardware.yaml`), `layout` (mesh axes → torus
dimensions, wraparound, slices), and on top of them the collective, compute and memory models and the
`estimate` that puts them together. Importing this package imports no JAX.
"""

from shardscope.cost.hardware import Hardware, HardwareError, known_hardware, load_hardware
from shardscope.cost.layout import AxisLayout, Layout, Span, default_slice_shape, layout_for, layout_from_mesh

__all__ = [
    "AxisLayout",
    "Hardware",
    "HardwareError",
    "Layout",
    "Span",
    "default_slice_shape",
    "known_hardware",
    "layout_for",
    "layout_from_mesh",
    "load_hardware",
]
