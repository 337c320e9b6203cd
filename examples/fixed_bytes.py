"""Per-rank memory of DeepSeek-V3 on 8 x H200 (the reference's ExampleKernel_FixedBytes)."""

import kernel

GIB = 2**30

k = kernel.open("deepseek-v3-h200-fp8-sglang-tp8")
fb = k.fixed_bytes()
print(f"weights {fb.weights / GIB:.1f} GiB")
print(f"activations {fb.activation_peak / GIB:.1f} GiB")
print(f"CUDA graphs {fb.cuda_graph / GIB:.1f} GiB")
print(f"EPLB {fb.eplb_redundant / GIB:.1f} GiB")
print(f"total inside the budget {fb.total() / GIB:.1f} GiB")
print(f"communicator + workspace (pre-snapshot) {fb.pre_snapshot / GIB:.1f} GiB")
print(f"total with pre-snapshot {fb.with_pre_snapshot() / GIB:.1f} GiB")
print(f"KV of one 4096-token request {k.sequence_variable_bytes(4096) / 2**20:.0f} MiB")

# Output:
# weights 78.1 GiB
# activations 1.1 GiB
# CUDA graphs 0.8 GiB
# EPLB 0.0 GiB
# total inside the budget 80.0 GiB
# communicator + workspace (pre-snapshot) 3.9 GiB
# total with pre-snapshot 83.9 GiB
# KV of one 4096-token request 137 MiB
