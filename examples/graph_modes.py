"""FULL CUDA graphs requested on a backend that cannot run mixed batches in one graph."""

import dataclasses

import kernel

inputs = kernel.open_inputs("deepseek-v3-h200-fp8-sglang-tp8")
pool = inputs.deployment.pools[0]
full = dataclasses.replace(pool, engine=dataclasses.replace(pool.engine, cudagraph_mode="FULL"))
deployment = dataclasses.replace(inputs.deployment, pools=(full,))
k = kernel.new(dataclasses.replace(inputs, deployment=deployment))
print("graph modes (decode, other):", k.graph_modes())
for o in k.resolved().overrides:
    print(f"{o.field}: {o.requested} -> {o.resolved}")
    print(f"  because {o.reason}")

# Output:
# graph modes (decode, other): ('FULL', 'PIECEWISE')
# cudagraph_mode: FULL -> FULL_AND_PIECEWISE
#   because FLASHMLA for mla layers (FlashMLA; FlashAttention 3 MLA reads no fp8 cache) supports CUDA graphs only up to UNIFORM_BATCH, below ALWAYS, so vLLM v0.31.0 runs mixed batches piecewise
