"""One SHA-256 per embedded scenario pool over every figure the kernel gives for it: the
resolved pool, provenance, memory, KV capacity, a fixed set of steps (decode, prefill, mixed,
per resource) and a synthetic trace priced in bulk. Two checkouts that print the same digests
price identically (used before/after refactors, e.g. issue 30's layer move).

Usage: PYTHONPATH=. python benchmarks/figures_digest.py
       (run it in each checkout, diff the outputs)
"""

from __future__ import annotations

import hashlib
import io

import pyarrow.ipc as ipc

import kernel
from pipeline.db import embedded_scenarios
from pipeline.load import open_inputs

try:  # the layered kernel/ (issue 30), else the flat one before it
    from kernel.io.synth import synth
except ImportError:
    from kernel.synth import synth  # type: ignore[no-redef]

BATCHES = [
    [(1, 4095)] * 8,  # decode
    [(1, 127)] * 256,  # wide decode
    [(2048, 0)],  # one prefill
    [(512, 1024), (1, 300), (1, 8000), (64, 64)],  # mixed
]


def pool_digest(scenario: str, pool: int) -> str:
    """The digest of every figure of one pool (a refusal's message is its figure)."""
    h = hashlib.sha256()
    try:
        k = kernel.open(scenario, None, pool)
    except ValueError as exc:
        return "refused:" + hashlib.sha256(str(exc).encode()).hexdigest()[:16]
    h.update(repr(k.resolved_pool).encode())
    h.update(repr(sorted(map(repr, k.provenance()))).encode())
    h.update(repr(k.fixed_bytes()).encode())
    try:
        h.update(repr(k.kv_capacity()).encode())
    except (ValueError, ArithmeticError) as exc:
        h.update(str(exc).encode())
    for reqs in BATCHES:
        try:
            h.update(repr(k.step_time(kernel.Batch([kernel.Request(*r) for r in reqs]))).encode())
        except ValueError as exc:
            h.update(str(exc).encode())
    table = k.price(synth(2000, seed=7)).to_arrow()
    table = table.replace_schema_metadata(None)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    h.update(hashlib.sha256(sink.getvalue()).digest())
    return h.hexdigest()


def main() -> None:
    total = hashlib.sha256()
    for scenario in sorted(embedded_scenarios()):
        pools = len(open_inputs(scenario, None, 0).deployment.pools)
        for pool in range(pools):
            d = pool_digest(scenario, pool)
            total.update(d.encode())
            print(f"{scenario} pool {pool}: {d}")
    print(f"all: {total.hexdigest()}")


if __name__ == "__main__":
    main()
