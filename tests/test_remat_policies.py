"""MaxText's remat policies by name change what the backward pass keeps, as their definitions say.

(That every policy leaves the loss unchanged is in test_loss.py.)"""

from __future__ import annotations

import pytest

import shardscope
from shardscope.case.tpu import libtpu_version


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
