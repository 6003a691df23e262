"""Every lint shardscope knows: its id, severity, what it needs, and the paragraph `lint --explain` prints.

Kept apart from the checks (and free of JAX) so that presets can validate `lint: {ignore: [...]}` against it
and the CLI can explain a lint without planning anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope.errors import unknown_name

# What a lint needs: the forward trace (rules, tensors) or the compiled step (collectives, compiler log).
TRACE = "trace"
COMPILE = "compile"


@dataclass(frozen=True)
class LintInfo:
    """One lint as users see it."""

    id: str
    severity: str  # info, warning or error
    stage: str  # TRACE or COMPILE
    title: str
    explanation: str


_LINTS = (
    LintInfo(
        "dead-rule",
        "warning",
        TRACE,
        "a rule that matches no tensor of the model",
        "A rule `[name, mesh_axes]` in `logical_axis_rules` whose logical name the model never uses: no "
        "parameter, optimizer state, input or activation carries it, and the model never asks the rules for "
        "it (the names the model resolves without recording a tensor count as used, e.g. the MoE's "
        "`(exp, None, mlp_no_fsdp)` placement of its expert weights). Such a rule changes nothing, so a "
        "reviewer who reads it as doing something is misled; often it is a misspelt name (then the model's "
        "own name is replicated) or a rule written for another model. Rules whose name another model family "
        "uses are summarised once instead (`rules-for-other-models`). Delete it, or fix its name (the "
        "finding suggests the closest name the model uses).",
    ),
    LintInfo(
        "rules-for-other-models",
        "info",
        TRACE,
        "rules for logical names only other model families use, in one summary",
        "MaxText's rule files serve every model: a rule for Llama's and Mixtral's grouped-query attention "
        "(`activation_length_attn`) or for their single layer stack (`layers`) matches no DeepSeek tensor. "
        "Such a rule is dead for the model linted but not a mistake, so instead of a `dead-rule` warning each, "
        "these rules are listed once, as information, with the model families whose models use each name "
        "(shardscope's table of the names every family's tiny model uses, kept in step with the models by a "
        "test). Nothing to fix: the file serves several model families; lint it with their models to check "
        "these rules. A rule whose name no family uses stays a `dead-rule` warning, and no finding suggests "
        "renaming a rule whose name another family uses. A preset that silences `dead-rule` silences this "
        "summary too.",
    ),
    LintInfo(
        "shadowed-rule",
        "warning",
        TRACE,
        "a rule that never decides a dimension: earlier rules always do first",
        "Rules are tried in order and a dimension takes the first rule for its name whose mesh axes are all "
        "still free (Flax's `logical_to_mesh_axes`). A later rule for the same name is a fallback: it applies "
        "only where the earlier ones could not. This lint reports a rule whose name the model uses but which "
        "decides no dimension of any tensor the model places: in every one an earlier rule for that name "
        "decided first (a rule with no mesh axes decides too: replicated), or the rule's mesh axes were taken "
        "by other dimensions. The rule has no effect on this model; delete it, or move it above the rule that "
        "shadows it if it was meant to win.",
    ),
    LintInfo(
        "unmatched-name",
        "info",
        TRACE,
        "a logical name the model uses that no rule mentions",
        "Every tensor dimension the model names is looked up in `logical_axis_rules`; a name no rule mentions "
        "is replicated on every device without anything saying so. That is often what a rule file means (a "
        "pure-FSDP file shards only the batch and the embedding dimensions), so this is information; when the "
        "finding suggests a close rule name, a rule is probably misspelt. Add a rule (`[name, []]` states the "
        "replication on purpose).",
    ),
    LintInfo(
        "absent-axis-rule",
        "warning",
        TRACE,
        "a rule naming a mesh axis that `mesh_axes` lacks",
        "MaxText lets a rule name a mesh axis its `mesh_axes` does not list, and treats that axis as size 1: it "
        "shards nothing, on every mesh this file can describe. A reviewer reading `[activation_length, "
        "[context]]` expects the sequence to be split; with no `context` axis it never is. Either the axis is "
        "missing from `mesh_axes`, or the rule (or that axis in it) should go.",
    ),
    LintInfo(
        "unit-axis-rule",
        "info",
        TRACE,
        "a rule naming a mesh axis of size 1 on this mesh",
        "A rule that decides dimensions of the model's tensors names a mesh axis whose size is 1 on the mesh "
        "being planned: that part of the rule shards nothing here (MaxText's rule files name many axes so that "
        "one file serves many meshes). Information, so that nobody reads a sharding into it; when every axis "
        "of the rule is size 1 the rule replicates what it decides. A file that sets no mesh sizes (a MaxText "
        "rule file) planned on MaxText's defaults, where FSDP takes every device, gets one note from `dump` "
        "and `lint` instead: which axes its rules name that are size 1, and how to size them (`--mesh`, or "
        "MaxText's `ici_*_parallelism`).",
    ),
    LintInfo(
        "indivisible-dim",
        "error",
        TRACE,
        "a tensor dimension its mesh axes do not divide",
        "A dimension of size n sharded over mesh axes whose sizes multiply to k needs k to divide n. JAX "
        "refuses such parameters and inputs outright, and pads constrained activations unevenly. `dump` stops "
        "at the first such tensor with an error; `lint` traces on with those dimensions replicated and reports "
        "every one. Change the mesh (--mesh), the model's shape (--set model.…), or the rule that shards the "
        "dimension (`shardscope explain` shows which one it is).",
    ),
    LintInfo(
        "silently-replicated",
        "warning",
        TRACE,
        "a dimension the rules want sharded that ends up replicated",
        "A tensor dimension whose name has rules naming a mesh axis larger than 1, but which ends up "
        "replicated: each such rule was skipped because another dimension of the same tensor had already "
        "taken its mesh axes (a mesh axis shards one dimension of a tensor at most), and what decided instead "
        "names no axis larger than 1 on this mesh. Nothing fails; the tensor just takes more memory than the "
        "rules suggest. Reorder the rules, add a fallback rule for the name on a free axis, or state the "
        "replication on purpose with `[name, []]` before the others.",
    ),
    LintInfo(
        "activation-name-on-weight",
        "warning",
        TRACE,
        "a weight carrying an `activation_*` logical name",
        "Logical names keep weights and activations apart, so that a rule file can shard the two differently "
        "(FSDP for weights, batch or context parallelism for activations). A parameter carrying an "
        "`activation_*` name is sharded by the activation rules, which change whenever someone retunes "
        "activation sharding: a reviewer's comment on MaxText's ep-tp change ('the weights below use "
        "activation logical axis rules when activation should only be used for activations'). Give the "
        "weight a weight name (embed, mlp, heads, …).",
    ),
    LintInfo(
        "weight-name-on-activation",
        "warning",
        TRACE,
        "an activation carrying a weight's logical name",
        "The mirror image of `activation-name-on-weight`: an activation constraint names a dimension with a "
        "name the model's parameters carry (embed, mlp, …), so the weight rules (FSDP, typically) shard an "
        "activation and a change to weight sharding silently moves activations. Use the `activation_*` name "
        "of that dimension.",
    ),
    LintInfo(
        "moe-name-outside-moe",
        "warning",
        TRACE,
        "a `*_moe` logical name outside the MoE block",
        "Names ending in `_moe` (embed_moe, mlp_moe, activation_batch_moe, …) exist so that the MoE block can "
        "be sharded unlike the rest of the model; MaxText's reviewers: 'any `_moe` rule should only be used "
        "deep inside the moe layer'. A tensor outside the MoE block (no path component naming a MoE block) "
        "that carries one is sharded by the MoE's rules. Use the dense name (embed, mlp, activation_batch, …).",
    ),
    LintInfo(
        "large-replicated",
        "warning",
        TRACE,
        "a large parameter or optimizer state left fully replicated",
        "A parameter (or optimizer-state tensor) that no dimension of is sharded is held whole by every device. "
        "Above a threshold of bytes per device (16 MiB unless the preset says `lint: {max_replicated_bytes: "
        "…}`, or `--set lint.max_replicated_bytes=…`) that is memory FSDP would have saved, usually because no "
        "rule names its dimensions or because the rules' axes are size 1 on this mesh. Shard one of its "
        "dimensions (typically the embedding dimension over the FSDP axes).",
    ),
    LintInfo(
        "involuntary-remat",
        "warning",
        COMPILE,
        "the compiler's 'involuntary full rematerialization' of a tensor",
        "When XLA's SPMD partitioner cannot move a tensor from one sharding to another with collectives "
        "(typically between two shardings over the same devices in different dimension orders), it "
        "replicates the whole tensor on every device and slices it again: memory and traffic of the full "
        "tensor, where the rules meant shards. XLA warns on stderr without saying where in the model; "
        "shardscope captures the warning while compiling and ties it to the instruction, the Flax module "
        "(from the instruction's op_name), the pass, and the two shardings in mesh axes. Make the two "
        "shardings agree (the rules of the two tensors, or an intermediate constraint).",
    ),
    LintInfo(
        "expert-gather-in-loop",
        "warning",
        COMPILE,
        "MoE expert weights all-gathered over an expert-parallel axis inside the layer loop",
        "Expert parallelism keeps each device's experts on that device: the weights' expert dimension stays "
        "sharded over the expert-parallel axes, which are the axes of the expert dimension of the weights "
        "the MoE computes with (MaxText places them on the spec of `(exp, None, mlp_no_fsdp)` with FSDP "
        "removed: gathering them over FSDP once per layer is MaxText's design and not reported). An "
        "all-gather inside the scanned layers, at the MoE block, whose result has an expert weight's shape "
        "and whose mesh axes include an expert-parallel axis moves every expert to every device, every "
        "layer. Usually a rule for `mlp_no_fsdp`, `embed_moe` or `mlp_moe` takes the expert axis from `exp`.",
    ),
    LintInfo(
        "dcn-weight-in-loop",
        "warning",
        TRACE,
        "weights of the scanned layers sharded over the cross-slice (DCN) axis",
        "With several TPU slices (--slices), the `data` mesh axis spans them and travels over the data-center "
        "network, tens of times slower than the links inside a slice. A parameter of a scanned layer stack "
        "sharded over `data` (FSDP across slices) is all-gathered across slices in every layer of the forward "
        "pass, again for the rematerialised forward and reduce-scattered in the backward pass. Keep the "
        "weights' sharding inside a slice (fsdp, expert, …) and leave `data` to the batch.",
    ),
    LintInfo(
        "dcn-collective-in-loop",
        "warning",
        COMPILE,
        "a collective over the cross-slice (DCN) axis inside the layer loop",
        "With several TPU slices, a collective whose device groups span the `data` axis crosses the "
        "data-center network. Once per step (the gradient all-reduce) that is data parallelism; inside the "
        "scanned layers (loop trips > 1) it runs once per layer, at DCN bandwidth. Find which tensor's "
        "sharding over `data` causes it (the row's source names the module) and keep that axis to the batch.",
    ),
    LintInfo(
        "network-collective-in-loop",
        "warning",
        COMPILE,
        "on a GPU cluster, a collective of the layer loop crossing the network where NVLink could carry it",
        "On a GPU cluster, the GPUs of one NVLink domain (an HGX host's 8, a GB200 NVL72 rack's 72) talk over "
        "NVLink; between domains, over each GPU's network card, about a ninth of NVLink's bandwidth on "
        "H100, H200 and B200. A collective inside the scanned layers (loop trips > 1) whose device groups "
        "cross the network, over mesh axes whose GPUs would fit in one domain, pays that every layer for a "
        "placement choice: lay those axes inside the host (MaxText's `ici_*_parallelism`) and put a batch "
        "axis, which moves once per step, across hosts (`dcn_data_parallelism`, `dcn_fsdp_parallelism`).",
    ),
    LintInfo(
        "tensor-parallel-across-network",
        "warning",
        COMPILE,
        "on a GPU cluster, a tensor-parallel axis split across NVLink domains",
        "Tensor parallelism (`tensor`, `tensor_transpose`, `tensor_sequence`) sums partial results of every "
        "split matmul, on every layer's critical path, so its groups belong inside one NVLink domain. When "
        "its collectives cross the network, the axis is larger than a domain or laid across hosts: keep it "
        "within one domain (at most its GPUs, on `ici_tensor_parallelism`) and split across hosts over data "
        "or FSDP.",
    ),
    LintInfo(
        "hbm-overflow",
        "error",
        TRACE,
        "the plan does not fit the target hardware's HBM",
        "The per-device memory the plan needs, against the HBM of one device of the target TPU generation "
        "(the topology's, or --hardware) or of the GPU cluster's GPUs: the compiler's own figures when the "
        "plan was compiled for TPU or GPU (or its refusal to compile; the GPU compiler's arguments, outputs "
        "and temporaries added up), else shardscope's estimate from the tensors (parameters, optimizer "
        "state, inputs, gradients, activations kept for the backward pass), which is a lower bound: if even "
        "that does not fit, the step cannot. Shard more (FSDP over more devices), lower the batch "
        "(--set model.per_device_batch=…), or use more devices.",
    ),
)

LINTS: dict[str, LintInfo] = {lint.id: lint for lint in _LINTS}
LINT_IDS: tuple[str, ...] = tuple(LINTS)


def get_lint(lint_id: str) -> LintInfo:
    """A lint by id.

    Raises:
      UnknownNameError: no lint has that id (with a "did you mean").
    """
    if lint_id not in LINTS:
        raise unknown_name("lint", lint_id, LINT_IDS)
    return LINTS[lint_id]
