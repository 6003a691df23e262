"""What MaxText's command line keys are: the values MaxText accepts where a key's type says too little, the
per-tensor keys of its `custom` remat policy, and the keys that steer a run but not the step it compiles.

Read off MaxText's `configs/types.py`, `configs/base.yml` and `layers/decoders.py` (the commit the built-in
presets carry).
"""

from __future__ import annotations

from reference_models.config import REMAT_LOCATIONS, REMAT_POLICIES

# The values MaxText accepts for keys whose type (str) says too little (configs/types.py, layers/decoders.py).
CHOICES: dict[str, tuple[str, ...]] = {
    "remat_policy": REMAT_POLICIES,
    "dtype": ("bfloat16", "float32", "float16"),
    "weight_dtype": ("bfloat16", "float32", "float16"),
    "grad_dtype": ("bfloat16", "float32", "float16"),
    "shard_mode": ("auto", "explicit"),
    "opt_type": ("adamw", "adam_pax", "sgd", "muon"),
    "attention": ("autoselected", "dot_product", "flash", "cudnn_flash_te", "cudnn_flash_jax", "paged"),
}
# Keys MaxText has renamed: an earlier release's name → the name base.yml has now. Published command lines
# were written against the release of their day (the Ironwood recipes against maxtext-tutorial-v1.5.0).
RENAMED_KEYS: dict[str, str] = {"fsdp_shard_on_exp": "shard_exp_on_fsdp"}
# The per-tensor keys of `remat_policy=custom` (base.yml), each one of REMAT_LOCATIONS.
CUSTOM_REMAT_KEYS = (
    "decoder_layer_input",
    "context",
    "mlpwi",
    "mlpwi_0",
    "mlpwi_1",
    "mlpwo",
    "moe_mlpwi_0",
    "moe_mlpwi_1",
    "moe_mlpwo",
    "query_proj",
    "key_proj",
    "value_proj",
    "kv_proj",
    "qkv_proj",
    "out_proj",
    "query_wa_proj",
    "kv_wa_proj",
    "mla_q",
    "mla_kv",
    "attention_out",
    "indexer_cutoff_threshold",
    "engram",
)
for _remat_key in CUSTOM_REMAT_KEYS:
    CHOICES[_remat_key] = REMAT_LOCATIONS

# Keys that steer a run but not the step it compiles: no sharding, shape or memory depends on them.
RUN_ONLY_KEYS = frozenset(
    {
        "run_name",
        "steps",
        "base_output_directory",
        "dataset_type",
        "dataset_path",
        "dataset_name",
        "eval_dataset_name",
        "train_split",
        "eval_split",
        "tokenizer_path",
        "tokenizer_type",
        "enable_checkpointing",
        "async_checkpointing",
        "checkpoint_period",
        "load_parameters_path",
        "load_full_state_path",
        "log_period",
        "profiler",
        "profiler_steps",
        "skip_first_n_steps_for_profiler",
        "upload_all_profiler_results",
        "enable_goodput_recording",
        "monitor_goodput",
        "enable_pathways_goodput",
        "metrics_file",
        "gcs_metrics",
        "save_config_to_gcs",
        "enable_tensorboard",
        "use_vertex_tensorboard",
        "vertex_tensorboard_project",
        "vertex_tensorboard_region",
        "learning_rate",
        "warmup_steps_fraction",
        "learning_rate_schedule_steps",
        "adam_b1",
        "adam_b2",
        "adam_eps",
        "adam_eps_root",
        "adam_weight_decay",
        "init_weights_seed",
        "data_shuffle_seed",
        "enable_data_shuffling",
        "eval_interval",
        "eval_steps",
        "reuse_example_batch",
        "jax_cache_dir",
        "hardware",
        "skip_jax_distributed_system",
        "enable_single_controller",
        "compiled_trainstep_file",
        "dump_hlo",
        "dump_hlo_gcs_dir",
        "dump_hlo_xla_flags",
        "dump_hlo_local_dir",
        "dump_step",
        "packing",
        "grain_worker_count",
        "grain_train_files",
        "hf_path",
        "hf_data_dir",
        "hf_train_files",
        "add_bos",
        "add_eos",
        "enable_model_warmup",
        "model_call_mode",
        "max_checkify",
        "log_config",
        "debug_sharding",
        "attention_bias",
    }
)
