"""Every cost law of the kernel, as pure functions.

References are to sections of docs/model.md (model.md §0.3). Each
formula keeps the spec's floating-point operation order, in float64 throughout, so that a
port matches the Go goldens bit for bit on amd64.

Scalar/array polymorphism: the laws whose data arguments can be per request or per batch
(token counts, contexts, chunk sizes, computed tokens, bytes, seconds) accept a Python scalar
or a numpy array for those arguments and return the same kind. Coefficient arguments are
always Python scalars. A call with Python numbers never touches numpy; an array call gives,
element by element, exactly the bits of the scalar call (same IEEE-754 operations in the same
order; data-dependent branches become masked selections). Integer laws return int64 arrays.
Float laws that take integer data (causal pairs, windowed pairs) convert it to float64 first.

Summing per-request array results is the caller's job; float sums must be accumulated in
request order (e.g. ``np.add.accumulate``), not with ``np.sum``'s pairwise order, to match.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, overload

import numpy as np
from numpy.typing import NDArray

from pipeline.constants import MAX_DURATION_NS

Array = NDArray[Any]
FloatT = TypeVar("FloatT", float, Array)
IntT = TypeVar("IntT", int, Array)

_TWO_63 = 9223372036854775808.0  # 2**63, the first float64 that no int64 holds
CANDIDATE_RANK_WIDTHS = (2, 4, 8, 16)
DECLARED_WIDTHS = (1, 2, 4, 8, 16)
# Packed DSA cache layouts: bytes per token per layer, scales included (model.md §3.1).
DS_MLA_STATE_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}


# --- polymorphic helpers: numpy only when an argument is an array -------------------------


def select(cond: Any, a: Any, b: Any) -> Any:
    """`a if cond else b`, element-wise when cond is an array."""
    if isinstance(cond, np.ndarray):
        return np.where(cond, a, b)
    return a if cond else b


def go_max(a: Any, b: Any) -> Any:
    """Go's max (NaN-propagating), element-wise for arrays."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b or a != a else b


def go_min(a: Any, b: Any) -> Any:
    """Go's min (NaN-propagating), element-wise for arrays."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a <= b or a != a else b


def as_f64(x: Any) -> Any:
    """float64 of an integer datum (Go's float64(int))."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return float(x)


def _trunc(x: Any) -> Any:
    """Go's int(float): truncation toward zero."""
    if isinstance(x, np.ndarray):
        return x.astype(np.int64)
    return int(x)


def round_half(x: Any) -> Any:
    """Go's ``int(x + 0.5)``: the reference's rounding of a token count (truncation after)."""
    return _trunc(x + 0.5)


def _full(value: Any, *like: Any) -> Any:
    """`value`, broadcast to the shape of the array arguments in `like` (if any)."""
    shapes = [x.shape for x in like if isinstance(x, np.ndarray)]
    if not shapes:
        return value
    return np.full(np.broadcast_shapes(*shapes), value)


def cdiv(a: IntT, b: int) -> IntT:
    """Integer ceil(a/b) for b > 0 (model.md §0.2)."""
    if b <= 0:
        raise ValueError(f"cdiv needs a positive divisor, got {b}")
    return -((-a) // b)


# --- ramps and collectives (model.md §2.1, §5.1) --------------------------------------------


def efficiency(m: FloatT, eps_max: float, m_half: float) -> FloatT:
    """GEMM efficiency ramp eps_max*m/(m+m_half), 0 for m <= 0 (model.md §2.1 Efficiency)."""
    if eps_max <= 0:
        return _full(0.0, m)
    if m_half <= 0:
        return select(m <= 0, 0.0, eps_max)
    if not isinstance(m, np.ndarray):
        return 0.0 if m <= 0 else eps_max * m / (m + m_half)
    with np.errstate(divide="ignore", invalid="ignore"):  # masked lanes with m == -m_half
        return np.where(m <= 0, 0.0, eps_max * m / (m + m_half))


def _ratio(x: Any, half: float) -> Any:
    """x/(x+half); masked array lanes where x == -half divide by zero quietly."""
    if isinstance(x, np.ndarray):
        with np.errstate(divide="ignore", invalid="ignore"):
            return x / (x + half)
    return x / (x + half)


def shape_efficiency(
    m: FloatT, n: float, k: float, eps_max: float, m_half: float, n_half: float, k_half: float
) -> FloatT:
    """Shape-aware GEMM efficiency: eps_max times m, then k, then n factors (model.md §2.2)."""
    if eps_max <= 0:
        return _full(0.0, m)
    if not isinstance(m, np.ndarray) and m <= 0:
        return 0.0
    eff: Any = eps_max
    if m_half > 0:
        eff = eff * _ratio(m, m_half)
    if k_half > 0 and k > 0:
        eff = eff * (k / (k + k_half))
    if n_half > 0 and n > 0:
        eff = eff * (n / (n + n_half))
    return select(m <= 0, 0.0, eff)


def span(cross: int, total: int, ratio: float) -> float:
    """Cross-node bytes multiplier 1 + (ratio-1)*cross/total (model.md §5.5 Span)."""
    if cross <= 0 or total <= 0 or math.isnan(ratio) or math.isinf(ratio) or ratio <= 1:
        return 1.0
    return 1 + (ratio - 1) * cross / total


def flat_span(g: int, per_node: int, ratio: float) -> float:
    """Span of a group whose every hop may cross nodes (model.md §5.5 FlatSpan)."""
    if g <= 1 or per_node <= 0 or g <= per_node:
        return 1.0
    return span(g - 1, g - 1, ratio)


def ring_span(g: int, per_node: int, ratio: float) -> float:
    """Span of a ring collective over whole nodes, else FlatSpan (model.md §5.5 RingSpan)."""
    if g <= 1 or per_node <= 0:
        return 1.0
    if g % per_node != 0:
        return flat_span(g, per_node, ratio)
    return span(g // per_node - 1, g - 1, ratio)


def all2all_span(g: int, per_node: int, ratio: float) -> float:
    """Span of an all-to-all: off-node peers over all peers (model.md §5.5 All2AllSpan)."""
    if g <= 1 or per_node <= 0:
        return 1.0
    return span(g - per_node, g - 1, ratio)


def fabric_ratio(intra_gbps: float, inter_gbps: float) -> float:
    """Intra- over inter-node bandwidth, 1 if either is <= 0 (model.md §5.5 fabric.Ratio, case
    90)."""
    if intra_gbps <= 0 or inter_gbps <= 0:
        return 1.0
    return intra_gbps / inter_gbps


def collective_time(nbytes: FloatT, trans: float, peak: float, floor: float) -> FloatT:
    """Three-parameter collective law max(floor + b/trans, b/peak) (model.md §5.1
    CollectiveTime)."""
    if peak <= 0:
        return select(nbytes <= 0, floor, math.inf)
    at_peak = nbytes / peak
    t = go_max(floor + nbytes / trans, at_peak) if trans > 0 else go_max(floor, at_peak)
    return select(nbytes <= 0, floor, t)


def knot_time(nbytes: FloatT, knots: Sequence[float], seconds: Sequence[float]) -> FloatT:
    """Seconds of a collective priced from measured knots (docs/decisions.md AC2): linear
    between the knots (message bytes ascending), the first knot's time at or below it, the
    last segment's slope past the last knot. Needs two knots or more."""
    n = len(knots)
    if isinstance(nbytes, np.ndarray):
        xs = np.asarray(knots, dtype=np.float64)
        ys = np.asarray(seconds, dtype=np.float64)
        j = np.clip(np.searchsorted(xs, nbytes, side="right") - 1, 0, n - 2)
        x0, y0 = xs[j], ys[j]
        slope = (ys[j + 1] - y0) / (xs[j + 1] - x0)
        return np.where(nbytes <= xs[0], ys[0], y0 + (nbytes - x0) * slope)
    if nbytes <= knots[0]:
        return seconds[0]
    k = min(max(bisect.bisect_right(knots, nbytes) - 1, 0), n - 2)
    x0, y0 = knots[k], seconds[k]
    return y0 + (nbytes - x0) * ((seconds[k + 1] - y0) / (knots[k + 1] - x0))


def floor_and_rate(nbytes: FloatT, rate: float, floor: float) -> FloatT:
    """max(floor, bytes/rate); floor for no bytes, +Inf for no rate (model.md §5.1 FloorAndRate)."""
    if rate <= 0:
        return select(nbytes <= 0, floor, math.inf)
    return select(nbytes <= 0, floor, go_max(floor, nbytes / rate))


# --- experts (model.md §4.1, §4.3) --------------------------------------------------------


def experts_per_rank(n_experts: int, ep: int) -> tuple[int, int]:
    """(base, heaviest) experts per rank over an ep-wide group (model.md §4.1 ExpertsPerRank)."""
    if ep <= 0:
        raise ValueError(f"expert-parallel width must be at least 1, got {ep}")
    base = n_experts // ep
    return base, base + (1 if n_experts % ep else 0)


def _go_pow_int(x: float, n: int) -> float:
    """Go's math.Pow(x, n) for an integer n >= 0: repeated squaring on frexp mantissas.

    Ported rather than using `**`: libm pow, numpy's (SIMD) power and Go's loop can each
    differ by ulps, and only this loop is bit-identical between scalars and arrays.
    """
    a1, ae = 1.0, 0
    x1, xe = math.frexp(x)
    i = n
    while i != 0:
        if xe < -(1 << 12) or (1 << 12) < xe:
            ae += xe  # catastrophic under/overflow: Ldexp settles it
            break
        if i & 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    return math.ldexp(a1, ae)


def _go_pow_int_array(x: float, n: Array) -> Array:
    """`_go_pow_int` over an int64 array of exponents (same multiplications, same order)."""
    a1 = np.ones(n.shape)
    ae = np.zeros(n.shape, dtype=np.int64)
    x1, xe = math.frexp(x)
    j = 0
    active = n != 0
    while active.any():
        if xe < -(1 << 12) or (1 << 12) < xe:
            ae = np.where(active, ae + xe, ae)
            break
        bit = active & (((n >> j) & 1) == 1)
        a1 = np.where(bit, a1 * x1, a1)
        ae = np.where(bit, ae + xe, ae)
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        j += 1
        active = (n >> j) != 0
    return np.ldexp(a1, ae)


@overload
def experts_touched(tokens: int, n_experts: int, top_k: int, local: float) -> float: ...
@overload
def experts_touched(tokens: Array, n_experts: int, top_k: int, local: float) -> Array: ...
def experts_touched(tokens: int | Array, n_experts: int, top_k: int, local: float) -> float | Array:
    """Expected local experts touched by `tokens` tokens: local*(1-((E-k)/E)^t) (model.md §4.3)."""
    if isinstance(tokens, np.ndarray):
        tokens = tokens.astype(np.int64)
        if local <= 0:
            return np.zeros(tokens.shape)
        if n_experts <= 0 or top_k <= 0 or top_k >= n_experts:
            return np.where(tokens <= 0, 0.0, float(local))
        miss = _go_pow_int_array((n_experts - top_k) / n_experts, np.maximum(tokens, 0))
        return np.where(tokens <= 0, 0.0, local * (1 - miss))
    if local <= 0 or tokens <= 0:
        return 0.0
    if n_experts <= 0 or top_k <= 0 or top_k >= n_experts:
        return float(local)
    return local * (1 - _go_pow_int((n_experts - top_k) / n_experts, tokens))


# --- causal attention work (model.md §1.2, §3.5) ------------------------------------------


def causal_pairs(s: FloatT, computed: FloatT) -> FloatT:
    """Causal prefill work 4*(s*C + s*s*0.5) for s new tokens after C computed (model.md §1.2)."""
    fs, fc = as_f64(s), as_f64(computed)
    return 4 * (fs * fc + fs * fs * 0.5)


def windowed_pairs_for_chunk(s: FloatT, prefix: FloatT, window: int) -> FloatT:
    """One chunk's term of windowedCausalFLOPs, before the final x4 (model.md §3.5)."""
    if window <= 0:
        return _full(0.0, s, prefix)
    w = float(window)
    fs, fp = as_f64(s), as_f64(prefix)
    n_small = go_max(0.0, go_min(fs, w - fp))
    return (
        n_small * (fp + 1) + n_small * (n_small - 1) * 0.5 - n_small * 0.5 + (fs - n_small) * w
    )


def windowed_causal_flops(chunks: Iterable[tuple[int, int]], window: int) -> float:
    """Sliding-window causal work 4*sum(chunk terms) over (s, prefix) chunks (model.md §3.5)."""
    if window <= 0:
        return 0.0
    pairs = 0.0
    for s, prefix in chunks:
        pairs += windowed_pairs_for_chunk(s, prefix, window)
    return 4 * pairs


# --- decode-context parallelism (model.md §3.7) -------------------------------------------


def dcp_shards_kv(kind: str) -> bool:
    """Whether DCP shards this attention kind's cache (model.md §3.7 dcpShardsKV)."""
    return kind in ("gqa", "mla", "sparse_mla")


def is_latent(kind: str) -> bool:
    """Whether the attention kind keeps one latent tensor (model.md §3.1 latent)."""
    return kind in ("mla", "sparse_mla")


def dcp_local_tokens_one(ctx: IntT, dcp: int, interleave: int) -> IntT:
    """Busiest DCP rank's share of one context (vLLM striping), 0 for ctx <= 0 (model.md §3.7)."""
    if dcp < 1:
        raise ValueError(f"dcp width must be at least 1, got {dcp}")
    inter = max(interleave, 1)
    if not isinstance(ctx, np.ndarray) and ctx <= 0:
        return 0
    base = (ctx // inter // dcp) * inter
    local = go_max(base + go_min(ctx - base * dcp, inter), 1)
    return select(ctx <= 0, 0, local)


def dcp_local_tokens(ctxs: Iterable[int] | Array, dcp: int, interleave: int) -> int:
    """Sum of the busiest DCP rank's shares, -1 when dcp <= 1 (model.md §3.7 dcpLocalTokens)."""
    if dcp <= 1:
        return -1
    if isinstance(ctxs, np.ndarray):
        return int(dcp_local_tokens_one(ctxs.astype(np.int64), dcp, interleave).sum())
    return sum(dcp_local_tokens_one(c, dcp, interleave) for c in ctxs)


def sparse_top_k(kind: str, index_top_k: int, window: int) -> int:
    """Tokens a sparse-MLA layer selects per query: index top-k, else window (model.md §3.6)."""
    if kind != "sparse_mla":
        return 0
    if index_top_k > 0:
        return index_top_k
    return window if window > 0 else 0


@overload
def selected_kv_tokens_for(ctx: int, topk: int, compress_ratio: float) -> float: ...
@overload
def selected_kv_tokens_for(ctx: Array, topk: int, compress_ratio: float) -> Array: ...
def selected_kv_tokens_for(ctx: int | Array, topk: int, compress_ratio: float) -> float | Array:
    """min(ctx, topk) + (ctx-topk)/ratio past the top-k (model.md §3.6 selectedKVTokensFor)."""
    sel = as_f64(go_min(ctx, topk))
    if compress_ratio > 0:
        sel = sel + select(ctx > topk, (ctx - topk) / compress_ratio, 0.0)
    return sel


def selected_kv_tokens(ctxs: Iterable[int], topk: int, compress_ratio: float) -> float:
    """Sum of selected KV tokens, -1 when the layer selects nothing (model.md §3.6
    selectedKVTokens)."""
    if topk <= 0:
        return -1.0
    total = 0.0
    for ctx in ctxs:
        total += selected_kv_tokens_for(ctx, topk, compress_ratio)
    return total


@overload
def dcp_decode_tokens_one(
    ctx: int, topk: int, compress_ratio: float, dcp: int, interleave: int, shards_kind: bool
) -> float: ...
@overload
def dcp_decode_tokens_one(
    ctx: Array, topk: int, compress_ratio: float, dcp: int, interleave: int, shards_kind: bool
) -> Array: ...
def dcp_decode_tokens_one(
    ctx: int | Array, topk: int, compress_ratio: float, dcp: int, interleave: int,
    shards_kind: bool,
) -> float | Array:
    """One decode request's KV read: selection, then DCP shard; 0 for ctx <= 0 (model.md §3.7)."""
    read: Any = selected_kv_tokens_for(ctx, topk, compress_ratio) if topk > 0 else as_f64(ctx)
    if dcp > 1 and shards_kind:
        read = as_f64(dcp_local_tokens_one(round_half(read), dcp, interleave))
    return select(ctx <= 0, 0.0, read)


def dcp_decode_tokens(
    ctxs: Iterable[int], topk: int, compress_ratio: float, dcp: int, interleave: int,
    shards_kind: bool,
) -> float:
    """A layer's decode KV tokens, -1 when neither selection nor DCP applies (model.md §3.7)."""
    if topk <= 0 and not (dcp > 1 and shards_kind):
        return -1.0
    total = 0.0
    for ctx in ctxs:
        if ctx > 0:
            total += dcp_decode_tokens_one(ctx, topk, compress_ratio, dcp, interleave, shards_kind)
    return total


# --- prefill-context parallelism (model.md §3.8) ------------------------------------------


def _zigzag_chunk(idx: int, ch: Any, s: Any) -> tuple[Any, Any]:
    """Token range [lo, hi) of zigzag chunk `idx` of size `ch` over `s` tokens."""
    lo = go_min(idx * ch, s)
    return lo, go_min(lo + ch, s)


def _rank_tokens(rank: int, n_chunks: int, ch: Any, s: Any) -> Any:
    """Tokens held by PCP rank `rank`: its chunks rank and n_chunks-1-rank."""
    held: Any = 0
    for idx in (rank, n_chunks - 1 - rank):
        lo, hi = _zigzag_chunk(idx, ch, s)
        held = held + go_max(hi - lo, 0)
    return held


def pcp_local_tokens(s: IntT, pcp: int, dcp: int) -> IntT:
    """Busiest PCP rank's prefill tokens (zigzag), s if replicated, -1 off (model.md §3.8)."""
    if pcp <= 1:
        return _full(-1, s)
    if not isinstance(s, np.ndarray) and s <= 0:
        return -1
    n_chunks = 2 * pcp
    ch = cdiv(s, n_chunks)
    replicated = (n_chunks - 1) * ch >= s
    if dcp > 1 and not isinstance(s, np.ndarray) and replicated:
        return s  # DCP replicates a request this short: no rank walk needed
    best: Any = 0
    for rank in range(pcp):
        best = go_max(best, _rank_tokens(rank, n_chunks, ch, s))
    if dcp > 1:
        best = select(replicated, s, best)
    return select(s <= 0, -1, best)


@overload
def pcp_causal_pairs(s: int, prefix: int, pcp: int, dcp: int) -> float: ...
@overload
def pcp_causal_pairs(s: Array, prefix: Array | int, pcp: int, dcp: int) -> Array: ...
def pcp_causal_pairs(s: Any, prefix: Any, pcp: int, dcp: int) -> Any:
    """Busiest PCP rank's causal work over its two zigzag chunks, x4 (model.md §3.8
    pcpCausalPairs)."""
    if pcp <= 1:
        return _full(0.0, s, prefix)
    if not isinstance(s, np.ndarray) and s <= 0:
        return _full(0.0, prefix)
    local = pcp_local_tokens(s, pcp, dcp)
    whole = causal_pairs(s, prefix)
    if not isinstance(s, np.ndarray) and local == s:
        return whole
    n_chunks = 2 * pcp
    ch = cdiv(s, n_chunks)
    fp = as_f64(prefix)
    best: Any = 0.0
    for rank in range(pcp):
        pairs: Any = 0.0
        for idx in (rank, n_chunks - 1 - rank):
            lo, hi = _zigzag_chunk(idx, ch, s)
            n, flo, fhi = as_f64(hi - lo), as_f64(lo), as_f64(hi)
            term = n * (fp + 1) + (flo + fhi - 1) * n / 2 - n / 2
            pairs = pairs + select(hi > lo, term, 0.0)  # + 0.0 is exact: same as skipping
        best = go_max(best, pairs)
    return select(s <= 0, 0.0, select(local == s, whole, 4 * best))


def pcp_busiest_chunks(s: int, prefix: int, pcp: int, dcp: int) -> list[tuple[int, int]]:
    """The busiest PCP rank's (tokens, global prefix) chunks (model.md §3.8 appendPCPChunks)."""
    local = pcp_local_tokens(s, pcp, dcp)
    if local < 0 or local == s:
        return [(s, prefix)]
    n_chunks = 2 * pcp
    ch = cdiv(s, n_chunks)
    busiest, most = 0, -1
    for rank in range(pcp):
        held = _rank_tokens(rank, n_chunks, ch, s)
        if held > most:  # first strict maximum wins
            busiest, most = rank, held
    chunks = []
    for idx in (busiest, n_chunks - 1 - busiest):
        lo, hi = _zigzag_chunk(idx, ch, s)
        if hi > lo:
            chunks.append((hi - lo, prefix + lo))
    return chunks


# --- durations (model.md §9.9, §0.1) ------------------------------------------------------


@overload
def to_duration_ns(seconds: float) -> int: ...
@overload
def to_duration_ns(seconds: Array) -> Array: ...
def to_duration_ns(seconds: float | Array) -> int | Array:
    """Seconds to integer ns: NaN/negative 0, +Inf/overflow MaxInt64, else truncated
    (model.md §0.1)."""
    if isinstance(seconds, np.ndarray):
        secs = seconds.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, clamped below
            nanos = secs * 1e9
        zero = np.isnan(secs) | (secs < 0)
        big = ~zero & (nanos >= _TWO_63)
        out = np.where(zero | big, 0.0, nanos).astype(np.int64)
        return np.where(big, MAX_DURATION_NS, out)
    if math.isnan(seconds) or seconds < 0:
        return 0
    ns = seconds * 1e9
    if ns >= _TWO_63:
        return MAX_DURATION_NS
    return int(ns)


def us_to_duration_ns(us: float) -> int:
    """A µs coefficient as Go's Duration: int(us*1000.0), truncated (model.md §9.9)."""
    return int(us * 1000.0)


def duration_seconds(ns: Any) -> Any:
    """Go's Duration.Seconds(): float(ns / 1e9 whole) + float(remainder)/1e9 (model.md §9.9).

    Also element-wise on an int64 array of non-negative durations."""
    if isinstance(ns, np.ndarray):
        whole, rem = np.divmod(ns.astype(np.int64), 10**9)
        return whole.astype(np.float64) + rem.astype(np.float64) / 1e9
    sec, nsec = divmod(abs(ns), 10**9)
    if ns < 0:  # Go's / and % truncate toward zero
        sec, nsec = -sec, -nsec
    return float(sec) + float(nsec) / 1e9


# --- memory (model.md §9.3, §3.1, §7) -----------------------------------------------------

_DTYPE_BYTES = {
    "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
    "nvfp4": 0.5, "mxfp4": 0.5, "int4": 0.5, "fp32": 4.0,
}

_CACHE_DTYPE_BYTES = {
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "fp8_ds_mla": 1.0,
    "bfloat16": 2.0, "float16": 2.0,
    "nvfp4": 0.5625, "nvfp4_4over6": 0.5625,  # 4-bit values plus one fp8 scale per 16
    "nvfp4_ds_mla": 0.5,
    "float32": 4.0,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a served/weight dtype (model.md §9.3 DType.Bytes)."""
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} has no known byte width") from None


def known_cache_dtype(declared: str) -> bool:
    """Whether ``declared`` names a cache dtype: auto ('' or 'auto') or one with a width."""
    return declared in ("", "auto") or declared in _CACHE_DTYPE_BYTES


def cache_dtype_bytes(declared: str, fallback_bytes: float) -> float:
    """Bytes per cache element of a declared cache dtype (model.md §9.3 cacheDTypeBytes,
    19ac88e6)."""
    if declared in ("", "auto"):
        return 2.0 if fallback_bytes < 2 else fallback_bytes
    return _CACHE_DTYPE_BYTES.get(declared, fallback_bytes)


def dtype_fit(
    served: str, bf16_tflops: float, fp8_tflops: float, nvfp4_tflops: float
) -> tuple[str, float]:
    """(coefficient suffix, peak FLOP/s) the served dtype runs at (model.md §9.3 dtypeFit)."""
    bf16 = ("bf16", bf16_tflops * 1e12)
    fp8 = ("fp8", fp8_tflops * 1e12)
    if served == "fp8":
        return fp8 if fp8_tflops > 0 else bf16
    if served in ("nvfp4", "mxfp4"):
        if nvfp4_tflops > 0:
            return "nvfp4", nvfp4_tflops * 1e12
        return fp8 if fp8_tflops > 0 else bf16
    if served == "int8":
        return fp8  # no fallback
    return bf16  # bf16, fp16, int4 (W4A16) and anything else


def kv_bytes_per_token(
    n_kv: int, tp: int, head_dim: int, layers: int, cache_bytes: float, latent: bool,
    layout: str = "",
) -> float:
    """Per-rank KV bytes per token over all KV layers (model.md §3.1 KVBytesPerToken).

    A latent cache in a packed DSA ``layout`` (``DS_MLA_STATE_BYTES``) holds that many bytes
    per token per layer, scales included, whatever the heads and element width. Otherwise
    tp <= 1 leaves the heads undivided, so only n_kv, head_dim, layers and cache_bytes gate 0.
    """
    if latent and layout in DS_MLA_STATE_BYTES:
        return float(DS_MLA_STATE_BYTES[layout] * layers)
    if n_kv <= 0 or head_dim <= 0 or layers <= 0 or cache_bytes <= 0:
        return 0.0
    heads = n_kv if tp <= 1 else max(n_kv // tp, 1)
    tensors = 1 if latent else 2
    return tensors * heads * head_dim * float(cache_bytes) * layers


def paged_bytes(t: IntT, block: int, bytes_per_token: float) -> IntT:
    """KV bytes of t tokens in whole pages, int64-truncated (model.md §7.4 PagedBytes)."""
    if bytes_per_token <= 0:
        return _full(0, t)
    if not isinstance(t, np.ndarray) and t <= 0:
        return 0
    raw = t * bytes_per_token if block <= 1 else cdiv(t, block) * block * bytes_per_token
    return select(t <= 0, 0, _trunc(raw))


def recurrent_state_bytes(
    page: float, mode: str, length: int, block: int, spec: int, ckpt: int
) -> float:
    """One recurrent layer's state bytes per sequence for a mamba cache mode (model.md §7.6)."""
    if page <= 0:
        return 0.0
    if mode == "all":
        return page if block <= 0 else page * (cdiv(length, block) + spec)
    if mode == "align":
        return page * (2 + spec + ckpt)
    return page * (1 + spec)


def ring_pages(window: int, block: int, in_flight: IntT, max_model_len: int) -> IntT:
    """Pages of a window ring at f in-flight tokens: cdiv(min(w-1+f, L), B)+1 (model.md §7.3)."""
    f = go_max(in_flight, 0)
    return cdiv(go_min(window - 1 + f, max_model_len), block) + 1


def ring_pages_at(
    computed: IntT, in_flight: IntT, window: int, block: int, max_model_len: int
) -> IntT:
    """Ring pages once c tokens are computed: min(cdiv(min(c+f, L), B), ring(f)) (model.md §7.5)."""
    c, f = go_max(computed, 0), go_max(in_flight, 0)
    held = cdiv(go_min(c + f, max_model_len), block)
    return go_min(held, ring_pages(window, block, f, max_model_len))


def default_max_num_batched_tokens(memory_gib: float, chip_name: str) -> int:
    """Default max_num_batched_tokens for a part (model.md §9.5)."""
    if memory_gib >= 160:
        return 16384
    if memory_gib >= 70 and "a100" not in chip_name.lower():
        return 8192
    return 2048


def default_max_num_seqs(memory_gib: float, chip_name: str) -> int:
    """Default max_num_seqs for a part (model.md §9.5 defaultMaxNumSeqs)."""
    return 1024 if memory_gib >= 70 and "a100" not in chip_name.lower() else 256


# The MLA context-gather chunk with no max_model_len stated, and its ceiling otherwise
# (model.md §9.7).
MLA_CONTEXT_CHUNK_MAX = 65536


def mla_context_chunk(
    max_model_len: int, max_num_seqs: int, block: int, dcp: int, interleave: int
) -> int:
    """MLA context-gather chunk in tokens, aligned to block and DCP stripe (model.md §9.7,
    19ac88e6).

    With max_model_len <= 0 the chunk is ``MLA_CONTEXT_CHUNK_MAX`` (with dcp > 1 on a latent
    model the caller records that value as the assumption `mla_context_chunk`).
    """
    chunk = MLA_CONTEXT_CHUNK_MAX
    if max_model_len > 0:
        chunk = min(max(8 * max_model_len, 4 * max_num_seqs * block), MLA_CONTEXT_CHUNK_MAX)
    align = max(block, 1)
    if dcp > 1:
        align = math.lcm(align, dcp * max(interleave, 1))
    chunk = cdiv(max(chunk, align), align) * align
    return max(chunk, 1)


# --- width snapping (model.md §5.3, §7.1) -------------------------------------------------


def go_int_list(xs: Sequence[int]) -> str:
    """Go's %v of a []int, as the reference's messages print a width list: [2 4 8]."""
    return "[" + " ".join(str(x) for x in xs) + "]"


def snap_collective_width(
    width: int, measured: Iterable[int], op: str = "collective", chip: str = "this part"
) -> int:
    """Measured rank width a collective of `width` ranks is priced at (model.md §5.3).

    Raises ValueError when nothing is measured or `width` falls inside the swept range
    (<= 16) without an exact measurement: a width is never borrowed from a narrower one.
    """
    widths = sorted(set(measured))
    if not widths:
        raise ValueError(f"no measured {op} widths at all for {chip}")
    if width <= widths[0]:
        return widths[0]
    if width in widths:
        return width
    if width > CANDIDATE_RANK_WIDTHS[-1]:
        return widths[-1]
    raise ValueError(
        f"no {width}-rank {op} measurement for {chip}: the registry carries "
        f"{go_int_list(widths)}-rank figures"
    )


def assumed_collective_figure(part: str, width: int, w1: int, v1: float, w0: int,
                              v0: float) -> float:
    """A collective figure at an unmeasured `width` from the two widest measured ones.

    The assumed width extension (docs/decisions.md, issue 18); `w1` is the widest measured
    width with figure `v1`, `w0` the next narrower (equal to `w1` when only one is measured).

    * ``floor``: a ring collective takes one more step per rank (all-reduce two), so the floor
      grows linearly in the width at the measured per-rank slope ``(v1 - v0) / (w1 - w0)``,
      never negative; with one measured width it is carried unchanged.
    * ``peak_rate`` / ``transition_rate``: a ring (or a pairwise all-to-all) moves
      ``(w - 1) / w`` of the payload per rank (all-reduce twice that), so at the link's bus
      bandwidth the algorithm rate scales by ``((w1 - 1) / w1) / ((w - 1) / w)``.
    """
    if width <= 1 or w1 <= 1:
        raise ValueError(f"assumed collective widths need widths above 1, got {width} from {w1}")
    if part == "floor":
        slope = (v1 - v0) / (w1 - w0) if w1 > w0 else 0.0
        return v1 + max(0.0, slope) * (width - w1)
    if part in ("peak_rate", "transition_rate"):
        return v1 * ((w1 - 1) / w1) / ((width - 1) / width)
    raise ValueError(f"unknown collective figure {part!r}; expected floor, peak_rate or "
                     "transition_rate")


def measured_collective_widths(
    names: Iterable[str], op: str, chip: str, dtype: str = "fp16"
) -> list[int]:
    """Widths with a full floor/peak/transition triple among coefficient names (model.md §5.3)."""
    stem = f"{re.escape(op)}_{re.escape(dtype)}_(\\d+)rank_{re.escape(chip.replace('-', '_'))}"
    pattern = re.compile(f"collective_(floor|peak_rate|transition_rate)_{stem}")
    seen: dict[int, set[str]] = {}
    for name in names:
        match = pattern.fullmatch(name)
        if match and int(match.group(2)) >= 1:
            seen.setdefault(int(match.group(2)), set()).add(match.group(1))
    return sorted(w for w, kinds in seen.items() if len(kinds) == 3)


def snap_declared(width: int, declared: Iterable[int]) -> int:
    """Widest declared width <= width, else the narrowest, else width itself (model.md §7.1
    snap)."""
    widths = sorted(w for w in set(declared) if w in DECLARED_WIDTHS)
    if not widths:
        return width
    fitting = [w for w in widths if w <= width]
    return fitting[-1] if fitting else widths[0]


# --- CUDA graph capture (model.md §9.6) ---------------------------------------------------


def _capture_grid(ceiling: int) -> set[int]:
    """vLLM's default capture sizes up to `ceiling`: 1,2,4, then 8..248 by 8, 256.. by 16."""
    sizes = {x for x in (1, 2, 4) if x <= ceiling}
    sizes.update(range(8, min(ceiling + 1, 256), 8))
    sizes.update(range(256, ceiling + 1, 16))
    return sizes


def platform_capture_cap(blackwell_family_100: bool) -> int:
    """The platform's largest default capture size: 1024 on the Blackwell 100 family, else 512."""
    return 1024 if blackwell_family_100 else 512


def capture_sizes(
    max_num_seqs: int,
    decode_query_len: int,
    max_num_batched_tokens: int,
    max_capture_size: int | None = None,
    stated_sizes: Iterable[int] | None = None,
    blackwell_family_100: bool = False,
    decode_mode_full: bool = True,
    model_runner_v1: bool = True,
) -> list[int]:
    """Token counts vLLM captures CUDA graphs for (model.md §9.6 CaptureTokens procedure).

    CaptureTokens is the largest size. Only call when some graph mode is not NONE: a
    (NONE, NONE) engine captures nothing and CaptureTokens is 0 — that check is the caller's.
    Tensor-parallel sequence parallelism (which drops sizes not divisible by TP) is off by
    default and not modelled. Raises
    ValueError where vLLM refuses: no size survives, or a stated ceiling contradicts the
    stated sizes, or spec-decode rounding leaves nothing.
    """
    seqs, q, budget = max_num_seqs, decode_query_len, max_num_batched_tokens
    platform = platform_capture_cap(blackwell_family_100)
    ceiling = max_capture_size if max_capture_size is not None else min(seqs * q * 2, platform)
    uniform: set[int] = set()
    if max_capture_size is None and q > 1:
        top_req = min(seqs, platform)
        uniform = {n * q for n in _capture_grid(top_req) | {top_req} if n * q <= ceiling}
    if stated_sizes is not None:
        sizes = {x for x in stated_sizes if x <= budget}  # not filtered by the ceiling
    else:
        bounded = min(budget, ceiling)
        sizes = _capture_grid(bounded)
        if budget <= bounded:
            sizes.add(budget)  # the largest batch is captured even off the grid
        sizes.update(u for u in uniform if u <= budget)
    if not sizes:
        raise ValueError(
            f"no CUDA graph capture size is at most max_num_batched_tokens {budget}"
        )
    largest = max(sizes)
    if max_capture_size is not None and max_capture_size != largest and stated_sizes is not None:
        raise ValueError(
            f"max_cudagraph_capture_size {max_capture_size} differs from the largest stated "
            f"cudagraph_capture_sizes entry {largest}"
        )
    if q > 1 and decode_mode_full and model_runner_v1:
        rounded = sorted({cdiv(x, q) * q for x in sizes if cdiv(x, q) * q <= largest})
        if not rounded and q <= largest:
            rounded = [q]
        if not rounded:
            raise ValueError(
                f"no CUDA graph capture size survives rounding to the decode query length {q}"
            )
        return rounded
    return sorted(sizes)
