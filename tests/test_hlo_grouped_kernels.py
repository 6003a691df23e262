"""A TPU program's grouped-matmul kernels (MaxText's megablox `gmm` and `tgmm` Pallas calls) count their matrix
work from their shapes, as the experts' matmuls they are: 2·m·k·n each, m × k the token rows, n the output
width. The modules are hand-written in the TPU compiler's own spelling of such calls."""

from __future__ import annotations

from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile

# 6144 token rows of width 2048 through 64 experts of 2048 → 1408 (`gmm`), and the weights' gradient from the
# same rows and a [6144, 1408] output gradient (`tgmm`).
ROWS, WIDTH, HIDDEN, EXPERTS = 6144, 2048, 1408, 64
LHS, WEIGHTS, GRAD = f"bf16[{ROWS},{WIDTH}]", f"bf16[{EXPERTS},{WIDTH},{HIDDEN}]", f"bf16[{ROWS},{HIDDEN}]"
SIZES = f"s32[{EXPERTS}]"
PALLAS = 'custom_call_target="tpu_custom_call"'
STEP = "jit(train_step)"
MODULE = "\n".join(
    [
        f"HloModule jit_train_step, entry_computation_layout={{()->{GRAD}}}",
        "",
        f"ENTRY %main (p0: {LHS}, p1: {WEIGHTS}, p2: {SIZES}, p3: {GRAD}) -> ({GRAD}, {WEIGHTS}) {{",
        f"  %p0 = {LHS}{{1,0}} parameter(0)",
        f"  %p1 = {WEIGHTS}{{2,1,0}} parameter(1)",
        f"  %p2 = {SIZES}{{0}} parameter(2)",
        f"  %p3 = {GRAD}{{1,0}} parameter(3)",
        f"  %gmm.9 = {GRAD}{{1,0:T(8,128)(2,1)}} custom-call({SIZES}{{0}} %p2, {LHS}{{1,0}} %p0, "
        f'{WEIGHTS}{{2,1,0}} %p1), {PALLAS}, metadata={{op_name="{STEP}/jvp()/while/body/gmm/pallas_call"}}',
        f"  %tgmm.1 = {WEIGHTS}{{2,1,0}} custom-call({SIZES}{{0}} %p2, {LHS}{{1,0}} %p0, {GRAD}{{1,0}} %p3), "
        f'{PALLAS}, metadata={{op_name="{STEP}/transpose(jvp())/while/body/tgmm/pallas_call"}}',
        f"  ROOT %t = ({GRAD}, {WEIGHTS}) tuple(%gmm.9, %tgmm.1)",
        "}",
        "",
    ]
)


def test_gmm_and_tgmm_count_each_token_rows_matmul_once():
    bins = work_profile(read_module(MODULE))
    grouped = {b.pass_: b for b in bins if b.kind == "grouped"}
    one_product = 2 * ROWS * WIDTH * HIDDEN  # every row through one expert's [WIDTH, HIDDEN]
    assert grouped["forward"].flops == one_product
    assert grouped["backward"].flops == one_product
    assert grouped["forward"].bytes >= 2 * (ROWS * WIDTH + EXPERTS * WIDTH * HIDDEN + ROWS * HIDDEN)
    assert not [b for b in bins if b.kind == "memory" and b.flops]


def test_another_pallas_kernel_is_not_taken_for_a_grouped_matmul():
    renamed = MODULE.replace("%gmm.9", "%rms_norm.9").replace("/gmm/", "/rms_norm/").replace("gmm.9)", "rms_norm.9)")
    grouped = [b for b in work_profile(read_module(renamed)) if b.kind == "grouped" and b.pass_ == "forward"]
    assert grouped == []


# tokamax's grouped matmul (MaxText's `use_tokamax_gmm=True`), as the TPU compiler spells its Pallas calls: the
# group metadata first (scalars and per-tile tables), then the token rows and the experts' weights. The tokens'
# gradient multiplies by the weights transposed ([experts, HIDDEN, WIDTH] read as [WIDTH, HIDDEN] per expert).
TILES = "s32[1]{0} %p2, s32[65]{0} %p2, s32[112]{0} %p2, s32[112]{0} %p2, s32[1]{0} %p2"
SCOPE = 'tokamax:{\\"op\\":{\\"__type\\":\\"tokamax._src.ops.ragged_dot.pallas_mosaic_tpu.PallasMosaicTpuRaggedDot\\"}}'
TOKAMAX = "\n".join(
    [
        f"HloModule jit_train_step, entry_computation_layout={{()->{GRAD}}}",
        "",
        f"ENTRY %main (p0: {LHS}, p1: {WEIGHTS}, p2: {SIZES}, p3: {GRAD}) -> ({GRAD}, {LHS}, {WEIGHTS}) {{",
        f"  %p0 = {LHS}{{1,0}} parameter(0)",
        f"  %p1 = {WEIGHTS}{{2,1,0}} parameter(1)",
        f"  %p2 = {SIZES}{{0}} parameter(2)",
        f"  %p3 = {GRAD}{{1,0}} parameter(3)",
        f"  %gmm_megablox.3 = {GRAD}{{1,0:T(8,128)(2,1)}} custom-call({TILES}, {LHS}{{1,0}} %p0, {WEIGHTS}{{2,1,0}} "
        f'%p1), {PALLAS}, metadata={{op_name="{STEP}/jvp()/while/body/shard_map/{SCOPE}/gmm_megablox"}}',
        f"  %gmm_megablox_transpose_rhs.2 = {LHS}{{1,0:T(8,128)(2,1)}} custom-call({TILES}, {GRAD}{{1,0}} %p3, "
        f"{WEIGHTS}{{2,1,0}} %p1), {PALLAS}, "
        f'metadata={{op_name="{STEP}/transpose(jvp())/while/body/shard_map/{SCOPE}/gmm_megablox_transpose_rhs"}}',
        f"  %tgmm_megablox.4 = {WEIGHTS}{{2,1,0:T(8,128)(2,1)}} custom-call({TILES}, {LHS}{{1,0}} %p0, {GRAD}{{1,0}} "
        f'%p3), {PALLAS}, metadata={{op_name="{STEP}/transpose(jvp())/while/body/shard_map/{SCOPE}/tgmm_megablox"}}',
        f"  ROOT %t = ({GRAD}, {LHS}, {WEIGHTS}) "
        "tuple(%gmm_megablox.3, %gmm_megablox_transpose_rhs.2, %tgmm_megablox.4)",
        "}",
        "",
    ]
)


def test_tokamax_grouped_matmuls_count_each_token_rows_matmul_once():
    """Forward: one product; backward: the tokens' gradient (weights transposed) and the weights' gradient."""
    bins = work_profile(read_module(TOKAMAX))
    grouped = {b.pass_: b for b in bins if b.kind == "grouped"}
    one_product = 2 * ROWS * WIDTH * HIDDEN
    assert grouped["forward"].flops == one_product
    assert grouped["backward"].flops == 2 * one_product
    assert not [b for b in bins if b.kind != "grouped" and b.flops]


def test_the_tpu_compilers_ragged_dot_kernel_counts_as_grouped_and_its_group_table_not():
    """`jax.lax.ragged_dot` (MaxText with neither megablox nor tokamax) runs on the TPU as the compiler's own
    Mosaic kernel `ragged-dot-none`, beside a `ragged-dot-metadata` call that tabulates the groups."""
    metadata = f"(s32[1]{{0}}, s32[65]{{0}}, s32[112]{{0}}) custom-call({SIZES}{{0}} %p2), {PALLAS}"
    text = (
        TOKAMAX.replace("%gmm_megablox.3", "%ragged-dot-none.7")
        .replace('/gmm_megablox"', '/ragged_dot_general/ragged-dot-none"')
        .replace("  ROOT %t", f"  %ragged-dot-metadata.1 = {metadata}\n  ROOT %t")
    )
    assert "%ragged-dot-none.7 = " in text and 'ragged-dot-none"' in text
    bins = work_profile(read_module(text))
    grouped = {b.pass_: b for b in bins if b.kind == "grouped"}
    assert grouped["forward"].flops == 2 * ROWS * WIDTH * HIDDEN
    assert sum(b.flops for b in bins) == 3 * 2 * ROWS * WIDTH * HIDDEN


def test_later_tokamax_kernel_names_count_as_the_same_grouped_matmuls():
    """tokamax 0.0.17 (MaxText 0.2.5's) names its three kernels `pallas_tpu_ragged_dot_gmm`, `…_gmm_transpose_rhs`
    and `…_tgmm`, and prints their kernel metadata over several lines: the same work as under the older names."""
    text = TOKAMAX
    for old, new in (
        ("gmm_megablox_transpose_rhs", "pallas_tpu_ragged_dot_gmm_transpose_rhs"),
        ("tgmm_megablox", "pallas_tpu_ragged_dot_tgmm"),
        ("gmm_megablox.3", "pallas_tpu_ragged_dot_gmm.3"),
        ('/gmm_megablox"', '/pallas_tpu_ragged_dot_gmm/pallas_call"'),
    ):
        text = text.replace(old, new)
    metadata = 'frontend_attributes={kernel_metadata={\n"xprof_metadata":"{\\"transpose_rhs\\": false}"\n}}, metadata='
    text = text.replace("metadata=", metadata)
    assert "megablox" not in text and text.count("kernel_metadata") == 3
    grouped = {b.pass_: b for b in work_profile(read_module(text)) if b.kind == "grouped"}
    one_product = 2 * ROWS * WIDTH * HIDDEN
    assert grouped["forward"].flops == one_product
    assert grouped["backward"].flops == 2 * one_product
