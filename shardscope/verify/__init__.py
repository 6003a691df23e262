"""The same computation under two shardings: real train steps on fake CPU devices, compared tensor by tensor.

- `inputs`: the parameters and batches both sides start from; `layout`: pipelined and stacked layouts;
- `run`: one side's steps run for real (a case on its mesh, on one device, or a program of one's own);
- `program`: what a step's traced program says about each output (reductions, float types, order);
- `tolerance`: the rule for how far two sides may differ; `compare`: the checks, in computation order;
- `blame`: where a diverging tensor lives and the plan's collectives on it; `verdict`: the report;
- `records`: the report's records and JSON; `cases` and `steps`: `verify MODEL` and `verify --step`.
"""
