"""MaxText's remat policies by name change what the backward pass keeps, as their definitions say.

(That every policy leaves the loss unchanged is in test_loss.py.)"""

from __future__ import annotations

import pytest

import shardscope
from shardscope.case.resolve import get_model
from shardscope.case.tpu import libtpu_version

# The quick lane (`-m "not slow"`) leaves these out: whole steps compiled for TPU.
pytestmark = pytest.mark.slow


def _temp(policy: str, topology: str = "cpu-8") -> dict[str, int]:
    plan = shardscope.plan_case(
        "deepseek-tiny", "default", topology, settings={"model.remat": policy, "model.seq_len": "128"}, use_cache=False
    )
    return dict(plan.memory)


def test_policies_keep_more_the_more_names_they_save():
    # full saves a layer's input only; save_qkv_proj adds q/k/v; minimal adds out_proj and the MLPs; none
    # keeps everything.
    temp = {p: _temp(p)["temp_bytes"] for p in ("full", "save_qkv_proj", "minimal", "none")}
    assert temp["full"] < temp["save_qkv_proj"] < temp["minimal"] < temp["none"], temp


@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_an_offloading_policy_moves_activations_to_host_memory_on_tpu():
    offloaded, kept = _temp("minimal_offloaded", "v5p-8"), _temp("minimal", "v5p-8")
    assert offloaded.get("host_temp_bytes", 0) > 0
    assert "host_temp_bytes" not in kept


@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_a_layer_input_offloaded_leaves_the_device_for_host_memory():
    # MaxText's `decoder_layer_input=offload`: the one value `full` keeps per layer moves to the host.
    def plan(place: str) -> shardscope.Plan:
        settings = {
            "model.remat": "custom",
            "model.remat_custom": f"decoder_layer_input:{place}",
            "model.seq_len": "128",
        }
        return shardscope.plan_case("deepseek-tiny", "default", "v5p-8", settings=settings, use_cache=False)

    offloaded, kept = plan("offload"), plan("device")
    assert "host_temp_bytes" not in dict(kept.memory)
    # Every layer's input is in host memory (on a model this small the device's own temporaries are mostly
    # the transfers' staging buffers, so the device side is not compared).
    layer_input = offloaded.tensor_map["activations/decoder/moe_layers/inputs"].bytes_per_device
    assert dict(offloaded.memory)["host_temp_bytes"] >= get_model("deepseek-tiny").num_layers * layer_input
