"""FLOPs of a grouped-matmul kernel of a TPU program, counted from the operands' and result's shapes: the Pallas
kernels of MaxText's dropless MoE (megablox `gmm` and `tgmm`; tokamax's `gmm_megablox`,
`gmm_megablox_transpose_rhs` and `tgmm_megablox`, which `use_tokamax_gmm` runs, named
`pallas_tpu_ragged_dot_…` by later tokamax), and the TPU compiler's own
Mosaic kernel for `jax.lax.ragged_dot` (`ragged-dot-none`, which MaxText runs with neither: the forward
product and the tokens' gradient; `ragged-dot-metadata` beside it only tabulates the groups).

A grouped matmul multiplies each row of its left operand [m, k] by the weights of the group the row belongs to:
`gmm` ([m, k] × [groups, k, n] → [m, n]) in the forward pass and for the tokens' gradient, `tgmm` ([m, k]ᵀ ×
[m, n] → [groups, k, n]) for the weights' gradient. Either way each of the m rows takes part in one k × n
product: 2·m·k·n FLOPs, whatever the group sizes (rows a group does not fill are padding the kernel skips,
counted here as the tiles it computes: m is the padded row count the kernel is given).

The TPU compiler does not lower a ragged dot's weights' gradient (ragged over the contracted rows) to a kernel:
it masks the rows and the output gradient once per group ([groups, m, k] and [groups, m, n]) and contracts
each group over all m rows in one base-dilated convolution. That is a dense matmul of the program, groups
times the work of `tgmm`, and counts as one (`matmul`), as the compiled program runs it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from shardscope.hlo.origins import op_name_of
from shardscope.hlo.records import Instruction
from shardscope.hlo.shapes import shape_info

__all__ = ["grouped_kernel_flops"]

# The kernel's name, as Pallas names the custom call (`gmm.9`, `tgmm.1`; tokamax's `gmm_megablox.3`,
# `gmm_megablox_transpose_rhs.2` for the tokens' gradient, `tgmm_megablox.4`; the TPU compiler's
# `ragged-dot-none.7`) or, called inside a shard_map or a vmap, as its op_name ends (`…/gmm/pallas_call`). The
# transposed-weights form multiplies [m, k] by [groups, n, k]: still one k × n product per row, 2·m·k·n.
# tokamax 0.0.17 (MaxText 0.2.5's) names the same three kernels `pallas_tpu_ragged_dot_gmm`,
# `pallas_tpu_ragged_dot_gmm_transpose_rhs` and `pallas_tpu_ragged_dot_tgmm`.
_GROUPED_KERNEL = re.compile(
    r"(?:^|/)(?:t?gmm(?:_megablox(?:_transpose_rhs)?)?|pallas_tpu_ragged_dot_(?:t?gmm|gmm_transpose_rhs)"
    r"|ragged-dot-none)(?:\.\d+)?(?:/|$)"
)


def grouped_kernel_flops(instruction: Instruction, operand_shapes: Sequence[str]) -> int | None:
    """FLOPs of one run of a grouped-matmul kernel (None: not one): 2·m·k·n, m and k the left operand's (its
    first float operand of rank 2), n the result's last dimension."""
    if instruction.opcode != "custom-call" or "tpu_custom_call" not in (
        instruction.attribute("custom_call_target") or ""
    ):
        return None
    if _GROUPED_KERNEL.search(instruction.name) is None and _GROUPED_KERNEL.search(op_name_of(instruction)) is None:
        return None
    floats = [dims for dtype, dims, _ in map(shape_info, operand_shapes) if dtype.startswith(("bfloat16", "float"))]
    lhs = next((dims for dims in floats if len(dims) == 2), None)
    _, result, _ = shape_info(instruction.shape)
    if lhs is None or not result:
        return None
    return 2 * math.prod(lhs) * result[-1]
