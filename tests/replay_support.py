"""Request sets for the replay tests, in the contract's REQUEST_SCHEMA (docs/requests.md).

Built here so the engine's tests do not depend on the request readers; when
``kernel.replay.requests`` is present its schema is used, so a drift shows up as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa

try:
    from kernel.replay.requests import REQUEST_SCHEMA  # type: ignore[import-not-found]
except ImportError:  # the request sources not merged yet: the contract's table
    REQUEST_SCHEMA = pa.schema([
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("arrival_ns", pa.int64()),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("output_tokens", pa.int64(), nullable=False),
        pa.field("prefix_hashes", pa.list_(pa.uint64())),
        pa.field("session_id", pa.string()),
        pa.field("think_ns", pa.int64()),
        pa.field("stage", pa.int32(), nullable=False),
    ])


@dataclass(frozen=True)
class LocalRequestSet:
    table: pa.Table
    rejects: pa.Table
    source: str
    hash_block_tokens: int | None
    rows_in: int


def request_set(rows: list[dict[str, Any]], hash_block_tokens: int | None = None
                ) -> LocalRequestSet:
    """Rows (dicts with arrival_ns, prompt_tokens, output_tokens and optional columns) as a
    RequestSet-like object; request_id defaults to the row number."""
    cols: dict[str, list[Any]] = {f.name: [] for f in REQUEST_SCHEMA}
    for i, r in enumerate(rows):
        cols["request_id"].append(str(r.get("request_id", i)))
        cols["arrival_ns"].append(r.get("arrival_ns"))
        cols["prompt_tokens"].append(r["prompt_tokens"])
        cols["output_tokens"].append(r["output_tokens"])
        cols["prefix_hashes"].append(r.get("prefix_hashes"))
        cols["session_id"].append(r.get("session_id"))
        cols["think_ns"].append(r.get("think_ns"))
        cols["stage"].append(r.get("stage", 0))
    table = pa.table(cols, schema=REQUEST_SCHEMA)
    rejects = pa.table({"row": pa.array([], pa.int64()), "reason": pa.array([], pa.string()),
                        "column": pa.array([], pa.string()), "value": pa.array([], pa.string())})
    return LocalRequestSet(table, rejects, "<tests>", hash_block_tokens, len(rows))


@lru_cache(maxsize=4)
def kernel_for(scenario: str = "llama-3.1-8b-h100-tp1") -> Any:
    import kernel

    return kernel.open(scenario)
