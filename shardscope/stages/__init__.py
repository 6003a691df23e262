"""The step that gets planned, taken through JAX's own stages (`Traced` → `Lowered` → `Compiled`).

- `devices`: the fake CPU pool, a quiet libtpu, TPU slices described by libtpu, meshes on them;
- `state`: the abstract train state and batch, with their shardings from the rules;
- `train_step`: forward, loss, gradients, the optimizer's update;
- `compile`: trace, lower and compile a case (the only place that calls jit/lower/compile);
- `compiler_log`: the compiler's warnings, captured for lints; `user_step`: a program of one's own;
- `initial`: a model's parameters initialised for real (what `verify` runs from).
"""
