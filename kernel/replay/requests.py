"""A request set: the replay's input (docs/requests.md), its schema, and the checks every source
passes through.

Every reader (formats.py) and generator (loads.py) ends in :func:`assemble`, which applies the
same rules to all of them, so a bad row is treated alike whatever it came from: it is left out
and recorded in ``RequestSet.rejects`` with its source row, the column, the value and the
reason, and ``rows_in == table.num_rows + rejects.num_rows`` always. Rows out of arrival order
are kept and sorted stably (decision RQ2); the count is ``RequestSet.unordered``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .hashes import HASH_TYPE, chain_lengths, take_lists

__all__ = ["REJECT_SCHEMA", "REQUEST_SCHEMA", "RejectLog", "RequestSet", "assemble",
           "parse_ints", "parse_ns", "scale_rate", "summarise", "ARRIVAL_UNITS"]

REQUEST_SCHEMA = pa.schema([
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("arrival_ns", pa.int64()),
    pa.field("prompt_tokens", pa.int64(), nullable=False),
    pa.field("output_tokens", pa.int64(), nullable=False),
    pa.field("prefix_hashes", HASH_TYPE),
    pa.field("session_id", pa.string()),
    pa.field("think_ns", pa.int64()),
    pa.field("stage", pa.int32(), nullable=False),
])

REJECT_SCHEMA = pa.schema([
    pa.field("row", pa.int64(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("column", pa.string()),
    pa.field("value", pa.string()),
])

# Nanoseconds per unit of an arrival column.
ARRIVAL_UNITS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}

_INT_RE = r"^\s*[+-]?[0-9]+\s*$"
_NUM_RE = r"^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$"
_INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class RequestSet:
    """Requests ready to replay (the replay contract; docs/requests.md).

    ``table`` follows :data:`REQUEST_SCHEMA`, ordered by ``(arrival_ns, original order)`` with
    closed-loop follow-ups (null ``arrival_ns``) after every timed row, in their session's chain
    order. ``rejects`` follows :data:`REJECT_SCHEMA` (``row`` is the 0-based data row of the
    source). ``unordered`` counts accepted rows that arrived before an earlier row in the source
    (kept, and sorted; decision RQ2). ``notes`` are facts about the reading worth reporting.
    """

    table: pa.Table
    rejects: pa.Table
    source: str
    hash_block_tokens: int | None
    rows_in: int
    unordered: int = 0
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.rows_in != self.table.num_rows + self.rejects.num_rows:
            raise AssertionError(f"{self.source}: rows_in {self.rows_in} != accepted "
                                 f"{self.table.num_rows} + rejected {self.rejects.num_rows}")

    def __len__(self) -> int:
        return self.table.num_rows


class RejectLog:
    """Rejected rows collected while reading: one entry per row, the first reason found."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, str, str | None, list[str | None]]] = []

    def add(self, rows: np.ndarray, reason: str, column: str | None,
            values: Sequence[Any] | np.ndarray | pa.Array | None) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        if values is None:
            texts: list[str | None] = [None] * rows.size
        else:
            seq = values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else \
                list(np.asarray(values, dtype=object))
            texts = [None if v is None else str(v) for v in seq]
        self._parts.append((rows, reason, column, texts))

    def table(self) -> pa.Table:
        if not self._parts:
            return REJECT_SCHEMA.empty_table()
        rows = np.concatenate([p[0] for p in self._parts])
        reasons = [p[1] for p in self._parts for _ in range(p[0].size)]
        columns = [p[2] for p in self._parts for _ in range(p[0].size)]
        values = [v for p in self._parts for v in p[3]]
        t = pa.table([pa.array(rows, pa.int64()), pa.array(reasons, pa.string()),
                      pa.array(columns, pa.string()), pa.array(values, pa.string())],
                     schema=REJECT_SCHEMA)
        return t.take(pc.sort_indices(t, [("row", "ascending")]))


def _whole(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def parse_ints(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Integers from a column of any type: ``(values, ok, why)``.

    ``why`` holds, for rows not ok, ``"missing"``, ``"not a number"`` or ``"not an integer"``;
    values of rows not ok are 0. Strings may be integer literals or integral decimals
    (``"12"``, ``"12.0"``); floats must be integral.
    """
    a = _whole(arr)
    n = len(a)
    why = np.full(n, "", dtype=object)
    missing = np.asarray(a.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_integer(a.type):
        vals = a.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        why[missing] = "missing"
        return vals, ~missing, why
    if pa.types.is_floating(a.type) or pa.types.is_decimal(a.type):
        f = a.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        return _from_floats(f, missing, np.zeros(n, dtype=bool), why)
    if pa.types.is_boolean(a.type):
        why[:] = "not a number"
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool), why
    s = a.cast(pa.string())
    numeric = np.asarray(pc.fill_null(pc.match_substring_regex(s, _NUM_RE), False)
                         .to_numpy(zero_copy_only=False), dtype=bool)
    text = pc.if_else(pa.array(numeric), s, pa.scalar("0"))
    f = pc.cast(pc.utf8_trim_whitespace(text), pa.float64()).to_numpy(zero_copy_only=False)
    return _from_floats(f, missing, ~numeric & ~missing, why)


def _from_floats(f: np.ndarray, missing: np.ndarray, not_number: np.ndarray,
                 why: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    finite = np.isfinite(f)
    in_range = finite & (np.abs(f) < 9.0e18)
    integral = in_range & (np.floor(f) == f)
    why[missing] = "missing"
    why[not_number | (~missing & ~not_number & ~finite)] = "not a number"
    why[~missing & ~not_number & finite & ~integral] = "not an integer"
    ok = ~missing & ~not_number & integral
    vals = np.where(ok, f, 0.0).astype(np.int64)
    return vals, ok, why


def parse_ns(arr: pa.Array | pa.ChunkedArray, unit: str) -> tuple[np.ndarray, np.ndarray,
                                                                     np.ndarray]:
    """Times in ``unit`` (s, ms, us, ns) to integer ns: ``(values, ok, why)``.

    Integers scale exactly; fractional values are rounded to the nearest ns (decision RQ3:
    a binary float of a decimal second sits a hair below or above it, and truncating would
    turn 0.3 s into 299,999,999 ns).
    """
    scale = ARRIVAL_UNITS[unit]
    a = _whole(arr)
    n = len(a)
    why = np.full(n, "", dtype=object)
    missing = np.asarray(a.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_integer(a.type):
        v = a.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        fits = np.abs(v) <= _INT64_MAX // scale
        why[missing] = "missing"
        why[~missing & ~fits] = "out of range"
        ok = ~missing & fits
        return np.where(ok, v * scale, 0), ok, why
    if pa.types.is_floating(a.type) or pa.types.is_decimal(a.type):
        f = a.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        not_number = np.zeros(n, dtype=bool)
    elif pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
        s = a.cast(pa.string())
        numeric = np.asarray(pc.fill_null(pc.match_substring_regex(s, _NUM_RE), False)
                             .to_numpy(zero_copy_only=False), dtype=bool)
        text = pc.if_else(pa.array(numeric), s, pa.scalar("0"))
        f = pc.cast(pc.utf8_trim_whitespace(text), pa.float64()).to_numpy(zero_copy_only=False)
        not_number = ~numeric & ~missing
    else:
        why[:] = f"not a number (type {a.type})"
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool), why
    with np.errstate(invalid="ignore", over="ignore"):
        x = f * scale
    fits = np.isfinite(x) & (np.abs(x) < 9.0e18)
    why[missing] = "missing"
    why[not_number] = "not a number"
    why[~missing & ~not_number & ~np.isfinite(f)] = "not a number"
    why[~missing & ~not_number & np.isfinite(f) & ~fits] = "out of range"
    ok = ~missing & ~not_number & fits
    return np.where(ok, np.rint(np.where(ok, x, 0.0)), 0).astype(np.int64), ok, why


def reject_parsed(log: RejectLog, rows: np.ndarray, ok: np.ndarray, why: np.ndarray,
                  column: str, raw: pa.Array | pa.ChunkedArray, what: str) -> None:
    """Record the rows a parse failed on, one reason per distinct failure kind."""
    bad = np.flatnonzero(~ok)
    if bad.size == 0:
        return
    raw_a = _whole(raw)
    for kind in sorted(set(why[bad].tolist())):
        sel = bad[why[bad] == kind]
        log.add(rows[sel], f"{column} {kind}: {what}", column, raw_a.take(pa.array(sel)))


@dataclass
class Columns:
    """Candidate rows as a reader parsed them, before the common checks.

    ``row`` is each candidate's 0-based source row; every array has one entry per candidate.
    ``arrival_ok`` False means null (allowed only for closed-loop follow-ups).
    """

    row: np.ndarray
    arrival_ns: np.ndarray
    arrival_ok: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    request_id: pa.Array | None = None
    prefix_hashes: pa.Array | None = None
    session_id: pa.Array | None = None
    think_ns: np.ndarray | None = None
    think_ok: np.ndarray | None = None
    stage: np.ndarray | None = None

    def take(self, idx: np.ndarray) -> Columns:
        if idx.size == self.row.size and bool(np.all(idx == np.arange(idx.size))):
            return self  # the identity: nothing to copy
        sel = pa.array(idx, pa.int64())

        def arr(a: pa.Array | None) -> pa.Array | None:
            if a is not None and pa.types.is_list(a.type):
                return take_lists(a, idx)
            return None if a is None else _whole(a).take(sel)

        def np_(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return Columns(self.row[idx], self.arrival_ns[idx], self.arrival_ok[idx],
                       self.prompt[idx], self.output[idx], arr(self.request_id),
                       arr(self.prefix_hashes), arr(self.session_id), np_(self.think_ns),
                       np_(self.think_ok), np_(self.stage))


def _checks(c: Columns, hash_block_tokens: int | None,
            max_model_len: int | None) -> list[tuple[np.ndarray, str, str, np.ndarray]]:
    """Row rules in the order they are reported: (bad mask, reason, column, values)."""
    n = c.row.size
    think_ok = c.think_ok if c.think_ok is not None else np.zeros(n, dtype=bool)
    has_session = np.zeros(n, dtype=bool) if c.session_id is None else \
        np.asarray(c.session_id.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    out: list[tuple[np.ndarray, str, str, np.ndarray]] = [
        (~c.arrival_ok & ~(think_ok & has_session),
         "arrival is missing (null is allowed only for a closed-loop follow-up: session_id and "
         "think_ns set)", "arrival", np.full(n, None, dtype=object)),
        (c.arrival_ok & (c.arrival_ns < 0), "arrival is negative: arrivals are times >= 0 from "
         "the trace start", "arrival", c.arrival_ns),
        (c.prompt <= 0, "prompt_tokens must be > 0", "prompt_tokens", c.prompt),
        (c.output <= 0, "output_tokens must be > 0 (tokens the request generates, the first "
         "included)", "output_tokens", c.output),
    ]
    if c.think_ns is not None:
        out.append((think_ok & (c.think_ns < 0), "think_ns must be >= 0", "think_ns",
                    c.think_ns))
    if max_model_len is not None:
        # vLLM's engine refuses a prompt that leaves no room for one output token
        # (vllm/v1/engine/input_processor.py, _validate_model_input); its OpenAI server refuses
        # prompt + max_tokens beyond max_model_len (decision RQ7).
        out.append((c.prompt >= max_model_len, f"prompt_tokens leave no room for an output "
                    f"token within max_model_len {max_model_len} (vLLM refuses the prompt)",
                    "prompt_tokens", c.prompt))
        out.append((c.prompt + c.output > max_model_len, f"prompt_tokens + output_tokens exceed "
                    f"max_model_len {max_model_len} (vLLM refuses a request whose prompt plus "
                    "max_tokens exceed it)", "output_tokens", c.output))
    if c.prefix_hashes is not None and hash_block_tokens is not None:
        lens = chain_lengths(c.prefix_hashes)
        out.append((lens > c.prompt // hash_block_tokens,
                    f"prefix_hashes has more entries than the prompt has full blocks of "
                    f"{hash_block_tokens} tokens", "prefix_hashes", lens))
    return out


def assemble(c: Columns, log: RejectLog, *, rows_in: int, source: str,
             hash_block_tokens: int | None, max_model_len: int | None = None,
             on_reject: str = "collect", notes: Sequence[str] = ()) -> RequestSet:
    """Apply the common row rules, order the rows and build the :class:`RequestSet`."""
    if on_reject not in ("collect", "raise"):
        raise ValueError(f"on_reject must be 'collect' or 'raise', not {on_reject!r}")
    if max_model_len is not None and max_model_len <= 0:
        raise ValueError(f"max_model_len must be > 0, not {max_model_len}")
    bad = np.zeros(c.row.size, dtype=bool)
    for mask, reason, column, values in _checks(c, hash_block_tokens, max_model_len):
        new = mask & ~bad
        idx = np.flatnonzero(new)
        if idx.size:
            log.add(c.row[idx], reason, column, np.asarray(values)[idx])
        bad |= new
    c = c.take(np.flatnonzero(~bad))
    c = _drop_duplicate_ids(c, log)
    c = _drop_headless_sessions(c, log)
    rejects = log.table()
    if on_reject == "raise" and rejects.num_rows:
        r = rejects.slice(0, 1).to_pylist()[0]
        raise ValueError(f"{source}: row {r['row']}, column {r['column']!r}, value "
                         f"{r['value']!r}: {r['reason']} ({rejects.num_rows} row(s) rejected "
                         f"in all; on_reject='collect' keeps the others)")
    order, unordered = _order(c)
    c = c.take(order)
    n = c.row.size
    ids = c.request_id if c.request_id is not None else \
        pa.array(c.row, pa.int64()).cast(pa.string())
    table = pa.table([
        ids.cast(pa.string()),
        pa.array(c.arrival_ns, pa.int64(), mask=~c.arrival_ok),
        pa.array(c.prompt, pa.int64()),
        pa.array(c.output, pa.int64()),
        c.prefix_hashes.cast(HASH_TYPE) if c.prefix_hashes is not None
        else pa.nulls(n, HASH_TYPE),
        c.session_id.cast(pa.string()) if c.session_id is not None
        else pa.nulls(n, pa.string()),
        pa.array(c.think_ns, pa.int64(), mask=~c.think_ok)
        if c.think_ns is not None and c.think_ok is not None else pa.nulls(n, pa.int64()),
        pa.array(c.stage if c.stage is not None else np.zeros(n, np.int32), pa.int32()),
    ], schema=REQUEST_SCHEMA)
    notes = tuple(notes)
    if unordered:
        notes += (f"{unordered} row(s) arrived before an earlier row of the source; kept and "
                  "sorted stably by arrival (decision RQ2)",)
    return RequestSet(table, rejects, source, hash_block_tokens, rows_in, unordered, notes)


def _drop_duplicate_ids(c: Columns, log: RejectLog) -> Columns:
    if c.request_id is None or c.row.size == 0:
        return c
    ids = _whole(c.request_id).cast(pa.string())
    missing = np.asarray(ids.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    log.add(c.row[missing], "request_id is missing", "request_id", None)
    codes = np.asarray(pc.dictionary_encode(ids.fill_null("")).indices, dtype=np.int64)
    _, first = np.unique(codes, return_index=True)
    dup = np.ones(codes.size, dtype=bool)
    dup[first] = False
    dup &= ~missing
    idx = np.flatnonzero(dup)
    log.add(c.row[idx], "request_id repeats an earlier row's", "request_id",
            ids.take(pa.array(idx, pa.int64())))
    return c.take(np.flatnonzero(~dup & ~missing))


def _drop_headless_sessions(c: Columns, log: RejectLog) -> Columns:
    """A closed-loop follow-up needs an earlier row of its session with an arrival time."""
    if c.session_id is None or bool(c.arrival_ok.all()):
        return c
    sess = _whole(c.session_id).cast(pa.string())
    codes = np.asarray(pc.dictionary_encode(sess.fill_null("")).indices, dtype=np.int64)
    _, first = np.unique(codes, return_index=True)
    headless = np.zeros(c.row.size, dtype=bool)
    starts = first[~c.arrival_ok[first]]
    headless[np.isin(codes, codes[starts])] = True
    idx = np.flatnonzero(headless)
    log.add(c.row[idx], "the session's first request has no arrival (a closed-loop chain must "
            "start at a time)", "session_id", sess.take(pa.array(idx, pa.int64())))
    return c.take(np.flatnonzero(~headless))


def _order(c: Columns) -> tuple[np.ndarray, int]:
    """Stable order by arrival, null arrivals last; and how many rows came out of order."""
    key = np.where(c.arrival_ok, c.arrival_ns, _INT64_MAX)
    timed = c.arrival_ns[c.arrival_ok]
    unordered = int((timed[1:] < np.maximum.accumulate(timed)[:-1]).sum()) if timed.size else 0
    return np.argsort(key, kind="stable"), unordered


def summarise(rs: RequestSet) -> dict[str, Any]:
    """The figures worth a glance: counts, time span and rate, lengths, sessions, and the
    share of prefix-hash entries seen before (the hit rate of a prefix cache that never
    evicts: an upper bound on what prefix caching can save)."""
    t = rs.table
    arrival = t["arrival_ns"].drop_null().to_numpy()
    prompt = t["prompt_tokens"].to_numpy()
    output = t["output_tokens"].to_numpy()
    span = float(arrival.max() - arrival.min()) / 1e9 if arrival.size else 0.0
    flat = pc.list_flatten(t["prefix_hashes"]).to_numpy() if t.num_rows else np.zeros(0)
    repeated = int(flat.size - np.unique(flat).size) if flat.size else 0

    def q(x: np.ndarray, p: float) -> int | None:
        return int(np.quantile(x, p, method="lower")) if x.size else None

    return {
        "source": rs.source, "rows_in": rs.rows_in, "accepted": t.num_rows,
        "rejected": rs.rejects.num_rows, "unordered": rs.unordered,
        "first_arrival_s": float(arrival.min()) / 1e9 if arrival.size else None,
        "span_s": span, "mean_rate_per_s": (arrival.size - 1) / span if span > 0 else None,
        "prompt_mean": float(prompt.mean()) if prompt.size else None,
        "prompt_p50": q(prompt, 0.5), "prompt_p99": q(prompt, 0.99),
        "prompt_max": int(prompt.max()) if prompt.size else None,
        "output_mean": float(output.mean()) if output.size else None,
        "output_p99": q(output, 0.99), "output_max": int(output.max()) if output.size else None,
        "sessions": len(pc.unique(t["session_id"].drop_null())) if t.num_rows else 0,
        "closed_loop_followups": t["arrival_ns"].null_count,
        "stages": int(pc.max(t["stage"]).as_py() or 0) + 1 if t.num_rows else 0,
        "hash_block_tokens": rs.hash_block_tokens,
        "repeated_hash_share": repeated / flat.size if flat.size else None,
    }


def scale_rate(rs: RequestSet, factor: float) -> RequestSet:
    """The same requests arriving ``factor`` times as fast: every arrival time divided by
    ``factor`` (truncated to the ns), lengths, hashes, sessions and think times unchanged.
    Replaying a recorded trace at another load."""
    if not (np.isfinite(factor) and factor > 0):
        raise ValueError(f"a rate factor must be a finite number > 0, not {factor}")
    arrival = rs.table["arrival_ns"]
    valid = np.asarray(arrival.is_valid().to_numpy(zero_copy_only=False), dtype=bool) \
        if rs.table.num_rows else np.zeros(0, dtype=bool)
    ns = np.asarray(arrival.fill_null(0).to_numpy(), dtype=np.int64)
    scaled = np.floor(ns / factor).astype(np.int64) if factor != 1 else ns
    table = rs.table.set_column(1, REQUEST_SCHEMA.field("arrival_ns"),
                                pa.array(scaled, pa.int64(), mask=~valid))
    return RequestSet(table, rs.rejects, f"{rs.source} x{factor:g} rate", rs.hash_block_tokens,
                      rs.rows_in, rs.unordered, rs.notes)
