"""Collectives predicted from a tensors-only plan, without compiling.

A compile takes seconds to minutes; tracing the placement takes seconds. From every tensor's placement alone
this package predicts the collectives of a train step (`plan`) and its work (`work`): each weight's
all-gather and gradient sum (`weights`), tensor parallelism's partial sums (`activations`), context
parallelism's attention gathers (`context`), the MoE's token exchanges and expert sums (`moe`), a
pipeline's sends and edge (`pipeline`) and the token lookup (`embedding`), laid out by `layout`, each tensor
known by its logical axes and shape, never by its name (`roles`).
`benchmarks/prediction.py` measures the prediction against compiled plans (`measure`).
"""

from shardscope.predict.plan import PREDICTED, is_predicted, predict_collectives, predicted_plan

__all__ = ["PREDICTED", "is_predicted", "predict_collectives", "predicted_plan"]
