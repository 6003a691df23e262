"""Collectives predicted from a tensors-only plan, without compiling.

A compile takes seconds to minutes; tracing the placement takes seconds. From every tensor's placement alone
this package predicts the collectives that dominate a train step's traffic: each weight's all-gather (forward
and, with remat, again in the backward pass), each weight gradient's sum over the data-parallel axes, and the
MoE token all-to-alls. `benchmarks/prediction.py` measures the prediction against the compiled goldens.
"""

from shardscope.predict.plan import PREDICTED, is_predicted, predict_collectives, predicted_plan

__all__ = ["PREDICTED", "is_predicted", "predict_collectives", "predicted_plan"]
