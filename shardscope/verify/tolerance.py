"""How far apart two runs of the same computation may land, per tensor.

The rule, in full:

1. Rounding. A float value whose sums were reordered (as sharding reorders them: partial sums on each device,
   then a collective) differs by about eps · √K · magnitude, where eps is the machine epsilon of the coarsest
   float type the value went through (float32: 1.2e-7; bfloat16: 7.8e-3), K the summed sizes of the
   reductions on its way from the step's inputs (a matmul's contracted dimension, a sum over the batch, a
   psum over a mesh axis; a scan's body counted once per iteration; see `verify.program`), and magnitude
   the largest absolute value of the tensor on the reference side. The allowed difference is
   `SAFETY` times that; both sides' programs are read and the larger K and eps are taken.
2. Steps. From the second step on, each side starts from its own state, which already differs by what the
   step before measured: a tensor may also differ by the largest relative difference of the parameters that
   step left (ρ) times its magnitude.
3. The optimizer. AdamW divides the first moment by the square root of the second, elementwise; where a
   gradient is near zero, a rounding difference of the gradient moves that quotient by up to its whole
   size. So the moments and the updated parameters are bounded elementwise, by carrying the gradient's
   allowed difference through AdamW's update on the reference side's values (interval arithmetic on
   m̂ / (√v̂ + eps)), plus their own rounding by rule 1.

Integer outputs (counts, indices) must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardscope.stages.train_step import AdamW
from shardscope.verify.program import Precision

# Rounding differences are sums of many small independent errors; eight of their typical size (in eps·√K
# units) is not reached by a reordering, and a lost or misplaced collective's error is of the size of the
# tensor itself, millions of such units.
SAFETY = 8.0

# The rule as `verify --help` states it.
RULE = (
    "A tensor may differ by 8 × eps × √K × max|reference|: eps of the coarsest float type it went through, K "
    "the summed sizes of the reductions on its way (from the step's program); after step 1, also by the "
    "relative difference the parameters already carry; AdamW's moments and updates are bounded elementwise."
)


def rounding_tolerance(precision: Precision, magnitude: float) -> float:
    """Rule 1: the absolute difference a reordering of the value's sums may make."""
    return precision.tolerance(magnitude, SAFETY)


@dataclass(frozen=True)
class AdamBounds:
    """Elementwise allowed differences of one parameter's first and second moments and of the parameter
    itself after a step, carried to the next step (rule 3)."""

    mu: np.ndarray
    nu: np.ndarray
    param: np.ndarray


def adam_bounds(
    step: int,
    grad: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    grad_tolerance: float,
    before: AdamBounds | None,
    adamw: AdamW,
) -> AdamBounds:
    """Rule 3: how far the moments and the parameter may move after `step` (1-based), given the reference
    side's gradient and new moments and the gradient's allowed difference.

    Args:
      step: the step number (AdamW's bias correction reads it).
      grad: the reference gradient of this step.
      mu, nu: the reference moments after this step.
      grad_tolerance: the gradient's allowed absolute difference.
      before: the bounds after the previous step (None at step 1, where every side starts equal).
      adamw: the optimizer's settings.
    """
    g = np.abs(grad.astype(np.float64))
    previous_mu = before.mu if before is not None else 0.0
    previous_nu = before.nu if before is not None else 0.0
    previous_param = before.param if before is not None else 0.0
    d_mu = adamw.b1 * previous_mu + (1 - adamw.b1) * grad_tolerance
    d_nu = adamw.b2 * previous_nu + (1 - adamw.b2) * (2 * g * grad_tolerance + grad_tolerance**2)
    mu_hat = mu.astype(np.float64) / (1 - adamw.b1**step)
    nu_hat = nu.astype(np.float64) / (1 - adamw.b2**step)
    d_mu_hat = d_mu / (1 - adamw.b1**step)
    d_nu_hat = d_nu / (1 - adamw.b2**step)
    update = mu_hat / (np.sqrt(nu_hat) + adamw.eps)
    # The quotient is monotone in each of m̂ and v̂, so its extremes over the box are at the corners.
    roots = (np.sqrt(np.maximum(nu_hat - d_nu_hat, 0.0)), np.sqrt(nu_hat + d_nu_hat))
    d_update = np.zeros_like(update)
    for top in (mu_hat - d_mu_hat, mu_hat + d_mu_hat):
        for root in roots:
            d_update = np.maximum(d_update, np.abs(top / (root + adamw.eps) - update))
    decay = abs(1 - adamw.learning_rate * adamw.weight_decay)
    d_param = decay * previous_param + adamw.learning_rate * d_update
    return AdamBounds(np.broadcast_to(d_mu, g.shape), np.broadcast_to(d_nu, g.shape), d_param)
