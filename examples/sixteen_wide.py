"""A 16-wide group on H200, whose registry measures collectives at 2, 4 and 8 ranks only."""

import kernel

name = "minimax-m25-h200-ep16"
k = kernel.open(name)  # the assumed width extension (on by default) prices it
for origin in k.provenance():
    if origin.set == "assumed-collective-widths" and "all_reduce" in origin.name:
        print(origin.name, origin.method, origin.scope)
measured, total, assumed = k.evidence()
print(f"{sum('16rank' in a for a in assumed)} of {len(assumed)} assumed entries are 16-rank")
try:
    kernel.open(name, kernel.Repos(assumed_collective_widths=False))
except kernel.RefusalError as refusal:
    print("off:", refusal.setting)

# Output:
# collective_floor_all_reduce_fp16_16rank_h200 assumed hardware: h200
# collective_peak_rate_all_reduce_fp16_16rank_h200 assumed hardware: h200
# collective_transition_rate_all_reduce_fp16_16rank_h200 assumed hardware: h200
# 12 of 25 assumed entries are 16-rank
# off: collective_width
