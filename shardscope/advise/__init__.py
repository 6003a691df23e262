"""`shardscope advise`: the best sharding for a model on a topology.

The search, one module per step: `space` (mesh factorizations over the axes each preset can use),
`template` (a model's tensors placed on any mesh without tracing again), `prune` (what cannot work or
cannot fit, decided without compiling), `programs` (candidates that are one program, compiled once),
`rank` (compiled plans ordered by estimated step time, each with why it wins or loses), `sweep` (all of it,
compiles through the runner's backends, with progress) and `export` (the result as JSON and CSV). Importing
this package imports no JAX.
"""
