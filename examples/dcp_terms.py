"""Why GLM-5's decode step grows from dcp 4 to dcp 8: each term, summed over the layers."""

import dataclasses

import kernel
from kernel.model.decode_terms import TERMS, decode_terms


def with_dcp(dcp: int) -> kernel.Kernel:
    # the reference's pricing, as docs/decisions.md F3 splits it
    inputs = kernel.open_inputs("glm5-h200-tp8-dcp4", kernel.Repos(pricing="reference"))
    pool = inputs.deployment.pools[0]
    pool = dataclasses.replace(pool, parallel=dataclasses.replace(pool.parallel, dcp=dcp))
    return kernel.new(dataclasses.replace(
        inputs, deployment=dataclasses.replace(inputs.deployment, pools=(pool,))))


contexts = [32768] * 32  # 32 requests decoding one token at 32k context
totals = {}
for dcp in (4, 8):
    per_kind = decode_terms(with_dcp(dcp).resolved_pool, contexts)
    totals[dcp] = {t: sum(v["count"] * v[t] for v in per_kind.values()) for t in TERMS}
for term in TERMS:
    print(f"{term:<18} {(totals[8][term] - totals[4][term]) * 1e6:+8.1f} us")

# Output:
# kv_read              -150.6 us
# secondary_read       -535.3 us
# dcp_query_gather     +949.2 us
# dcp_lse_gather       +274.2 us
# dcp_combine          +701.0 us
# graph_collectives      +0.0 us
