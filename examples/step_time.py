"""One decode step of 32 requests at 4096 tokens of context, and where its time goes."""

import kernel

# The measured layer (vLLM's all-reduce and decode attention from operator tables) is the
# default; kernel.Repos(pricing="reference") gives the reference's 26.35 ms (nvlink 2.55 ms).
k = kernel.open("deepseek-v3-h200-fp8-sglang-tp8")
est = k.step_time(kernel.Batch([kernel.Request(1, 4095)] * 32, decode_threshold=8))
print(f"no overlap {est.no_overlap / 1e6:.2f} ms, overlap {est.overlap / 1e6:.2f} ms")
print(f"bottleneck {est.bottleneck}")
for resource, ns in (est.per_resource or {}).items():
    print(f"  {resource:<6} {ns / 1e6:6.2f} ms")

# Output:
# no overlap 20.42 ms, overlap 19.39 ms
# bottleneck hbm
#   sm       0.46 ms
#   hbm     15.71 ms
#   nvlink   0.70 ms
#   host     3.54 ms
