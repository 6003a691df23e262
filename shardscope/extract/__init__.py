"""A compiled or traced step → Plan: tensors, collectives (on `shardscope.hlo`), memory and work per device.

- `tensors`: parameters, optimizer state, inputs, activations and outputs as placed;
- `collectives`: HLO collectives as plan rows (from a compiled step or any HLO text file);
- `plans`: the plan of a compiled step, of a traced one (tensors only), of any compiled JAX function;
- `maxtext_dump`: one of MaxText's sharding dumps as a tensors-only plan.
"""
