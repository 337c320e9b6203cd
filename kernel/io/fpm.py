"""Forward-pass-metrics (FPM) traces: one row per forward pass, with aggregates per group.

Engines such as NVIDIA Dynamo log each forward pass as counts, sums and variances instead of
per-request rows. :func:`fpm_to_requests` rebuilds integer per-request shapes the kernel can
price (``docs/traces.md`` "Aggregate (FPM) traces" states the rule):

* each group (the pass's prefills, its decodes) keeps its **count and sum exactly**;
* its **population variance** is matched as closely as a simple integer shape allows: two
  levels (half the requests high, half low), or, when the low level would go below the
  minimum, k requests above the minimum sharing the excess evenly and the rest at the
  minimum (k the best of the integers around the two-level solution), or, past the largest
  variance the sum allows, one request holding all the excess;
* minimums: a prefill schedules at least 1 new token; a decode has at least 1 token in cache;
  prefix tokens in cache (``sum_prefill_kv_tokens``, no variance given) are spread evenly;
* in a pass, decodes come first, then prefills (vLLM schedules running requests first).

A row whose aggregates are impossible — a negative count, sum or variance, a sum smaller than
its count's minimum, tokens without requests — is set aside with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

__all__ = ["FPM_COLUMNS", "FPM_IDS", "FpmError", "fpm_to_requests", "integer_shape"]

FPM_COLUMNS = ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens",
               "var_prefill_length", "num_decode_requests", "sum_decode_kv_tokens",
               "var_decode_kv_tokens")
FPM_IDS = ("counter_id", "worker_id", "dp_rank", "phase", "workload_segment")
_COUNTS = ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens",
           "num_decode_requests", "sum_decode_kv_tokens")


class FpmError(ValueError):
    """The FPM input as a whole is unusable (a missing column)."""


# -- the integer shape ---------------------------------------------------------------------------

def integer_shape(n: np.ndarray, total: np.ndarray, var: np.ndarray, minimum: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per-element values for many groups at once: (group index per element, value).

    Group g has ``n[g]`` elements, each ≥ ``minimum``, summing to exactly ``total[g]``, with a
    population variance as close to ``var[g]`` as the shape allows. Requires
    ``total >= n * minimum`` and ``var >= 0`` (checked by the caller).
    """
    n = np.asarray(n, np.int64)
    total = np.asarray(total, np.int64)
    var = np.asarray(var, np.float64)
    g = np.repeat(np.arange(n.size), n)
    starts = np.cumsum(n) - n
    i = np.arange(g.size) - starts[g]  # index within the group
    excess = total - n * minimum  # E: what is above the minimum, to be shaped
    nf = np.maximum(n, 1).astype(np.float64)
    ef = excess.astype(np.float64)
    vmax = ef * ef * (nf - 1) / (nf * nf)  # one element holds everything
    with np.errstate(divide="ignore", invalid="ignore"):
        # A: k = n // 2 high at lo + d, the rest at lo
        k_a = np.maximum(n // 2, 1)
        d = np.sqrt(var * nf * nf / (k_a * np.maximum(n - k_a, 1)))
        lo_real = (ef - k_a * d) / nf
        lo = np.floor(np.maximum(lo_real, 0.0)).astype(np.int64)
        hi = lo + np.rint(d).astype(np.int64)
        rem = excess - k_a * hi - (n - k_a) * lo
        # B: lows at the minimum and k requests above it, either sharing the excess evenly
        # or at h with one more taking the rest (k·h² + m² = Σy² target, k·h + m = E); k from
        # the two-level solution E²(n−k)/(n²k) = var, the best shape of the integers around it
        k_real = nf * ef * ef / (nf * nf * var + ef * ef)
        k0 = np.floor(np.nan_to_num(k_real, nan=1.0)).astype(np.int64)
        q_target = nf * var + ef * ef / nf
        best_err = np.full(n.size, np.inf)
        best = [np.ones(n.size, np.int64), np.zeros(n.size, np.int64),
                np.zeros(n.size, np.int64), np.zeros(n.size, bool)]  # k, h, r|m, middle?
        for dk in (-1, 0, 1, 2):
            kc = np.clip(k0 + dk, 1, np.maximum(n, 1))
            kf = kc.astype(np.float64)
            h, rr = np.divmod(excess, kc)
            # (h, r-or-m, Σy², uses a middle element, allowed)
            cands = [(h, rr, rr * (h + 1) ** 2 + (kc - rr) * h * h, False,
                      np.ones(n.size, bool))]
            disc = np.maximum(kf * kf * ef * ef - (kf + kf * kf) * (ef * ef - q_target), 0.0)
            hq = (kf * ef + np.sqrt(disc)) / (kf + kf * kf)
            for hm in (np.floor(hq), np.ceil(hq)):
                hm = np.clip(np.nan_to_num(hm), 0, excess // kc).astype(np.int64)
                m = excess - kc * hm
                cands.append((hm, m, kc * hm * hm + m * m, True, kc < n))
            for hc, rc, sq, mid, allowed in cands:
                err = np.abs(sq / nf - (ef / nf) ** 2 - var)
                ok = allowed & (err < best_err)
                best_err = np.where(ok, err, best_err)
                best = [np.where(ok, kc, best[0]), np.where(ok, hc, best[1]),
                        np.where(ok, rc, best[2]), np.where(ok, mid, best[3])]
        k_b, h_b, x_b, mid_b = best
    regime = np.where((n <= 1) | (var >= vmax), 2, np.where(lo_real >= 0, 0, 1))
    y = np.zeros(g.size, np.int64)
    r = regime[g]
    # regime A: highs first, then lows; the rounding remainder is spread evenly, its last
    # units +1 to lows first (then highs), so the sum is exact and lows stay >= 0
    a = r == 0
    ga, ia = g[a], i[a]
    ya = np.where(ia < k_a[ga], hi[ga], lo[ga])
    q_a, r_a = np.divmod(rem, np.maximum(n, 1))
    low_first = np.where(ia >= k_a[ga], ia - k_a[ga], (n[ga] - k_a[ga]) + ia)
    ya = ya + q_a[ga] + (low_first < r_a[ga]).astype(np.int64)
    y[a] = ya
    b = r == 1
    gb, ib = g[b], i[b]
    kb, hb, xb, mb = k_b[gb], h_b[gb], x_b[gb], mid_b[gb]
    even = np.where(ib < kb, hb + (ib < xb).astype(np.int64), 0)
    with_mid = np.where(ib < kb, hb, np.where(ib == kb, xb, 0))
    y[b] = np.where(mb, with_mid, even)
    c = r == 2
    y[c] = np.where(i[c] == 0, excess[g[c]], 0)
    return g, y + minimum


def even_split(n: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group, value): ``total`` split over ``n`` elements as evenly as integers allow."""
    n = np.asarray(n, np.int64)
    total = np.asarray(total, np.int64)
    g = np.repeat(np.arange(n.size), n)
    i = np.arange(g.size) - (np.cumsum(n) - n)[g]
    q, r = np.divmod(total, np.maximum(n, 1))
    return g, q[g] + (i < r[g]).astype(np.int64)


# -- the reader ---------------------------------------------------------------------------------

def _frame(src: Any) -> pl.DataFrame:

    if isinstance(src, pl.LazyFrame):
        return src.collect()
    if isinstance(src, pl.DataFrame):
        return src
    if isinstance(src, str | Path):
        p = Path(src)
        if p.suffix.lower() == ".parquet":
            return pl.read_parquet(p)
        if p.suffix.lower() in (".csv", ".tsv"):
            return pl.read_csv(p, separator="\t" if p.suffix.lower() == ".tsv" else ",")
        if p.suffix.lower() in (".arrow", ".ipc", ".feather"):
            return pl.read_ipc(p)
        raise FpmError(f"{p}: unsupported FPM file type {p.suffix!r}")
    import pyarrow as pa  # (heavy: Arrow, loaded only on this path)

    if isinstance(src, pa.Table):
        out = pl.from_arrow(src)
        assert isinstance(out, pl.DataFrame)
        return out
    raise FpmError(f"cannot read an FPM trace from a {type(src).__name__}")


def fpm_to_requests(src: Any, *, columns: Mapping[str, str] | None = None,
                    batch_id: str | None = None) -> tuple[pl.DataFrame, pl.DataFrame,
                                                          pl.DataFrame]:
    """(request rows, per-batch table, rejects) from an FPM trace.

    Request rows: ``batch_id, scheduled, computed, prompt_len`` (prompt_len = computed +
    scheduled for a prefill, = computed for a decode). Per-batch table: ``batch_id``, the FPM
    aggregates, and every other column of the input passed through (``latency_ms``, the
    identifiers). ``batch_id`` is the input's column of that name if it has one (or
    ``batch_id=`` names one), else the row number. Rejects: ``row, batch_id, reason, column,
    detail, source, values`` as the trace rejects table.
    """
    f = _frame(src)
    rename = {v: k for k, v in (columns or {}).items() if v in f.columns}
    f = f.rename(rename)
    missing = [c for c in FPM_COLUMNS if c not in f.columns]
    if missing:
        raise FpmError(f"missing FPM column(s) {missing}: an FPM trace needs "
                       f"{list(FPM_COLUMNS)}; it has {f.columns}")
    bid_col = batch_id or ("batch_id" if "batch_id" in f.columns else None)
    f = f.with_row_index("_row")
    bids = (f[bid_col].cast(pl.Int64, strict=False).fill_null(-1) if bid_col
            else f["_row"].cast(pl.Int64)).to_numpy().astype(np.int64)
    vals = {c: f[c].cast(pl.Float64, strict=False).to_numpy() for c in FPM_COLUMNS}
    nrow = f.height
    reason = np.full(nrow, "", dtype=object)
    column = np.full(nrow, "", dtype=object)
    detail = np.full(nrow, "", dtype=object)

    def flag(mask: np.ndarray, why: str, col: str, text: str) -> None:
        new = mask & (reason == "")
        reason[new], column[new], detail[new] = why, col, text

    for c in FPM_COLUMNS:
        v = vals[c]
        flag(~np.isfinite(v), "null" if np.isnan(v).any() else "non_integer", c,
             f"{c} is null or not finite")
        flag(np.isfinite(v) & (v < 0), "negative", c, f"{c} is negative")
        if c in _COUNTS:
            flag(np.isfinite(v) & (v != np.floor(v)), "non_integer", c, f"{c} is not an integer")
    if bid_col:
        flag(np.asarray(f[bid_col].cast(pl.Int64, strict=False).is_null()), "null", bid_col,
             f"{bid_col} is null or not an integer")
    ok0 = reason == ""
    iv = {c: np.where(ok0, np.nan_to_num(vals[c]), 0).astype(np.int64) for c in _COUNTS}
    npf, spf = iv["num_prefill_requests"], iv["sum_prefill_tokens"]
    skv = iv["sum_prefill_kv_tokens"]
    nd, sd = iv["num_decode_requests"], iv["sum_decode_kv_tokens"]
    flag(spf < npf, "impossible_aggregate", "sum_prefill_tokens",
         "sum_prefill_tokens is smaller than num_prefill_requests (a prefill schedules at "
         "least one token)")
    flag((npf == 0) & (skv > 0), "impossible_aggregate", "sum_prefill_kv_tokens",
         "prefix tokens in cache with no prefill request")
    flag(sd < nd, "impossible_aggregate", "sum_decode_kv_tokens",
         "sum_decode_kv_tokens is smaller than num_decode_requests (a decode has at least one "
         "token in cache)")
    flag((npf + nd) == 0, "impossible_aggregate", "num_prefill_requests",
         "a forward pass with no request")
    good = reason == ""
    gi = np.flatnonzero(good)
    # decodes first, then prefills (vLLM schedules running requests first)
    dg, dk = integer_shape(nd[gi], sd[gi], np.nan_to_num(vals["var_decode_kv_tokens"][gi]), 1)
    pg, ps = integer_shape(npf[gi], spf[gi], np.nan_to_num(vals["var_prefill_length"][gi]), 1)
    _, pk = even_split(npf[gi], skv[gi])
    grp = np.concatenate([dg, pg])
    sched = np.concatenate([np.ones(dg.size, np.int64), ps])
    comp = np.concatenate([dk, pk])
    first = np.concatenate([np.zeros(dg.size, np.int8), np.ones(pg.size, np.int8)])
    order = np.lexsort((first, grp))  # by pass, decodes then prefills, stable
    grp, sched, comp = grp[order], sched[order], comp[order]
    is_pre = first[order] == 1
    requests = pl.DataFrame({"batch_id": bids[gi][grp], "scheduled": sched, "computed": comp,
                             "prompt_len": np.where(is_pre, comp + sched, comp)})
    batches = f.filter(pl.Series(good)).with_columns(pl.Series("batch_id", bids[gi])).drop("_row")
    if bid_col and bid_col != "batch_id":
        batches = batches.drop(bid_col)
    bad = np.flatnonzero(~good)
    raw = f.drop("_row")
    rejects = pl.DataFrame({
        "row": bad.astype(np.int64),
        "batch_id": pl.Series(bids[bad], dtype=pl.Int64),
        "reason": reason[bad].astype(str), "column": column[bad].astype(str),
        "detail": detail[bad].astype(str), "source": ["trace"] * bad.size,
        "values": [", ".join(f"{k}={v!r}" for k, v in r.items())
                   for r in raw[bad.tolist()].iter_rows(named=True)] if bad.size else [],
    }, schema={"row": pl.Int64, "batch_id": pl.Int64, "reason": pl.String,
               "column": pl.String, "detail": pl.String, "source": pl.String,
               "values": pl.String})
    return requests, batches.select(["batch_id", *[c for c in batches.columns
                                                    if c != "batch_id"]]), rejects
