"""The batch API for simulators (issue 31): ``Kernel.step_time_arrays`` and ``StepBatch``.

Both must give ``k.step_time(Batch(...))`` bit for bit — overlap, NoOverlap, bottleneck, the
per-resource map (keys, order, ns) and ``calibrated`` — for numpy, Arrow and sequence input,
on pools with a fast path (decode, mixed, prefill) and without one (DCP, sparse reads),
and refuse bad columns with an error naming the column and the first bad position.
The reference side is the shared path ``finish(compose(summarise(...)))`` where the kernel is
uncalibrated, so the new code is never compared with itself alone.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernel
from kernel import StepBatch
from kernel.calibration import Law, PhaseCorrection
from kernel.facade.kernel import Kernel
from kernel.model import jit, step, step_arrays, step_batch
from kernel.model.calibration_law import TERMS
from kernel.model.types import Batch, Resource
from tests.fixtures_pools import tiny_dense, tiny_moe_mla
from tests.jit_modes import jit_mode  # noqa: F401 (the fixture: compiled loops, then none)
from tests.step_support import same, shared

# (jit_mode is function-scoped and fixed for all of a test's examples: the health check's
# concern, state leaking between examples, does not arise)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
SCENARIOS = ["deepseek-v3-h200-fp8-sglang-tp8",  # MoE + MLA: fast path
             "llama-3.1-8b-h100-tp1",  # dense gqa: one-kernel floor rule
             "nemotron3-ultra-h100-agg",  # hybrid: recurrent layers
             "glm5-h200-tp8-dcp4"]  # DCP: no fast path, the shared path from columns
LAW = Law(PhaseCorrection((1.3, 0.8, 1.7, 1.0, 1.0), 2e5),
          PhaseCorrection((0.7, 1.25, 2.0, 1.0, 1.0), 1e6),
          PhaseCorrection((1.1, 0.9, 1.5, 1.0, 1.0), 5e5))


@cache
def open_k(name: str) -> Kernel:
    return kernel.open(name)


@cache
def calibrated(name: str) -> Kernel:
    k = open_k(name)
    r = k.resolved_pool
    doc = {"kind": "Calibration", "version": 1, "name": "t", "model": r.model_name,
           "chip": r.chip_name,
           "phases": {ph: {"multipliers": dict(zip(TERMS, c.multipliers, strict=True)),
                           "constant_ns": c.constant_ns}
                      for ph, c in (("prefill", LAW.prefill), ("decode", LAW.decode),
                                    ("mixed", LAW.mixed))}}
    return k.with_calibration(doc, force=True)


rows_st = st.lists(st.one_of(st.tuples(st.integers(0, 5000), st.integers(0, 300_000)),
                             st.tuples(st.integers(1, 4), st.integers(0, 300_000)),
                             st.tuples(st.integers(0, 2), st.integers(0, 2))), max_size=70)


def inputs(rows: list[tuple[int, int]]) -> list[tuple[Any, Any]]:
    """The same columns as numpy int64, numpy int32/uint32, Arrow, lists and tuples."""
    s = [q[0] for q in rows]
    c = [q[1] for q in rows]
    return [(np.array(s, dtype=np.int64), np.array(c, dtype=np.int64)),
            (np.array(s, dtype=np.int32), np.array(c, dtype=np.uint32)),
            (pa.array(s, type=pa.int64()), pa.chunked_array([pa.array(c, type=pa.int64())])),
            (s, c), (tuple(s), [np.int64(x) for x in c])]


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("name", SCENARIOS)
@SETTINGS
@given(rows=rows_st, thr=st.sampled_from([0, 1, 4, 8]), budget=st.sampled_from([0, 66]))
def test_columns_price_as_a_batch(name: str, rows: list[tuple[int, int]], thr: int,
                                  budget: int) -> None:
    k = open_k(name)
    b = Batch(rows, decode_threshold=thr, sm_budget=budget)
    if not b.tokens():  # no token scheduled: no forward pass, refused by both (RL8)
        for s, c in inputs(rows):
            with pytest.raises(ValueError, match="no forward pass"):
                k.step_time_arrays(s, c, decode_threshold=thr, sm_budget=budget)
        with pytest.raises(ValueError, match="no forward pass"):
            k.step_time(b)
        return
    want = shared(k, b)
    same(k.step_time(b), want)
    for s, c in inputs(rows):
        same(k.step_time_arrays(s, c, decode_threshold=thr, sm_budget=budget), want)
    s, c = inputs(rows)[0]
    got = k.step_time_arrays(s, c, c + s, decode_threshold=thr, sm_budget=budget,
                             per_resource=False)
    assert got.per_resource is None and got.overlap == want.overlap
    kc = calibrated(name)
    same(kc.step_time_arrays(s, c, decode_threshold=thr, sm_budget=budget), kc.step_time(b))


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("rows", [[(1, 4095)] * 32, [(2048, 0)] + [(1, 4095)] * 63, [],
                                  [(0, 0)], [(512, 9), (0, 3), (7, 0)]],
                         ids=["decode", "mixed", "empty", "no-tokens", "odd"])
def test_the_simulator_shapes_on_every_sample_pool(rows: list[tuple[int, int]]) -> None:
    for name in SCENARIOS:
        k = open_k(name)
        b = Batch(rows, decode_threshold=8)
        s, c = inputs(rows)[0]
        if not b.tokens():  # (refused: RL8)
            with pytest.raises(ValueError, match="no forward pass"):
                k.step_time_arrays(s, c, decode_threshold=8)
            continue
        same(k.step_time_arrays(s, c, decode_threshold=8), shared(k, b))


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("args, message", [
    (([1, -2], [3, 4]), r"scheduled\[1\] is -2"),
    (([1, 2], [3, -4]), r"computed\[1\] is -4"),
    ((np.array([1.0, 2.0]), np.array([3, 4])), r"scheduled must hold integers.*float64"),
    ((np.array([True]), np.array([3])), r"scheduled must hold integers.*bool"),
    (([1, 2], [3]), r"one entry per request: 2 scheduled, 1 computed"),
    ((np.ones((2, 2), dtype=np.int64), np.ones(2, dtype=np.int64)), r"1-D array"),
    (([1, 2.5], [3, 4]), r"scheduled\[1\] must be an integer"),
    (([1, True], [3, 4]), r"scheduled\[1\] must be an integer"),
    ((pa.array([1, None]), pa.array([3, 4])), r"scheduled holds 1 null"),
    ((pa.array([1.0]), pa.array([3])), r"Arrow integer array"),
    ((5, [3]), r"sequence of integers, got int"),
    (([1], [3], [-1]), r"prompt_len\[0\] is -1"),
    (([1], [3], [1, 2]), r"prompt_len must have one entry per request"),
    ((np.array([1, 1]), np.array([3, 4]), np.array([5, -1])), r"prompt_len\[1\] is -1"),
    ((np.array([1, 1]), np.array([3, 4]), np.array([5])),
     r"prompt_len must have one entry per request: 2 scheduled, 1 prompt_len"),
    ((np.array([1, 1]), np.array([3, -4]), np.array([5, 6])), r"computed\[1\] is -4"),
    ((np.array([1, 1]), np.array([3]), np.array([5, 6])), r"2 scheduled, 1 computed"),
])
def test_bad_columns_are_refused_clearly(args: tuple[Any, ...], message: str) -> None:
    k = open_k(SCENARIOS[0])
    with pytest.raises(ValueError, match=message):
        k.step_time_arrays(*args)


@pytest.mark.usefixtures("jit_mode")
def test_bad_threshold_and_budget_are_refused_as_batch_refuses_them() -> None:
    k = open_k(SCENARIOS[0])
    with pytest.raises(ValueError, match="sm_budget must be a non-negative"):
        k.step_time_arrays([1], [3], sm_budget=-1)
    with pytest.raises(ValueError, match="decode_threshold must be an integer"):
        k.step_time_arrays([1], [3], decode_threshold=1.5)  # type: ignore[arg-type]
    assert k.step_time_arrays([1], [3], decode_threshold=np.int64(8)) == \
        k.step_time(Batch([(1, 3)], decode_threshold=8))


# -- StepBatch ------------------------------------------------------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3000), st.integers(0, 100_000)),
    st.tuples(st.just("extend"), st.lists(st.tuples(st.integers(0, 3000),
                                                    st.integers(0, 100_000)), max_size=8)),
    st.tuples(st.just("remove"), st.integers(0, 1000)),
    st.tuples(st.just("remove_many"), st.lists(st.integers(0, 1000), max_size=3)),
    st.tuples(st.just("mask"), st.integers(0, 2**16)),
    st.tuples(st.just("advance")),
    st.tuples(st.just("decode")),
    st.tuples(st.just("schedule"), st.lists(st.integers(0, 3000), min_size=64, max_size=64)),
    st.tuples(st.just("set"), st.integers(0, 1000), st.integers(0, 3000)),
    st.tuples(st.just("clear")),
), max_size=25)


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("name", SCENARIOS)
@SETTINGS
@given(steps=ops)
def test_step_batch_follows_its_operations(name: str, steps: list[tuple[Any, ...]]) -> None:
    """A StepBatch after any operations holds what a plain list model of the same operations
    holds, and prices as the Batch of that list."""
    k = open_k(name)
    sb = StepBatch(decode_threshold=8, capacity=2)
    model: list[list[int]] = []
    for op in steps:
        if op[0] == "add":
            assert sb.add(op[1], op[2], op[1] + op[2]) == len(model)
            model.append([op[1], op[2], op[1] + op[2]])
        elif op[0] == "extend":
            sb.extend([q[0] for q in op[1]], np.array([q[1] for q in op[1]], dtype=np.int64))
            model.extend([q[0], q[1], 0] for q in op[1])
        elif op[0] == "remove" and model:
            i = op[1] % len(model)
            sb.remove(i)
            del model[i]
        elif op[0] == "remove_many" and model:
            pos = sorted({i % len(model) for i in op[1]})
            sb.remove(np.array(pos, dtype=np.int64))
            model = [m for j, m in enumerate(model) if j not in pos]
        elif op[0] == "mask":
            mask = np.array([(op[1] >> (j % 16)) & 1 == 1 for j in range(len(model))],
                            dtype=bool)
            sb.remove(mask)
            model = [m for m, drop in zip(model, mask.tolist(), strict=True) if not drop]
        elif op[0] == "advance":
            sb.advance()
            model = [[s, c + s, p] for s, c, p in model]
        elif op[0] == "decode":
            sb.schedule(1)
            model = [[1, c, p] for _s, c, p in model]
        elif op[0] == "schedule":
            sb.schedule(op[1][:len(model)])
            model = [[v, c, p] for v, (_s, c, p) in zip(op[1], model, strict=False)]
        elif op[0] == "set" and model:
            i = op[1] % len(model)
            sb.set_scheduled(i, op[2])
            model[i][0] = op[2]
        elif op[0] == "clear":
            sb.clear()
            model = []
        assert len(sb) == len(model)
        assert sb.scheduled.tolist() == [m[0] for m in model]
        assert sb.computed.tolist() == [m[1] for m in model]
        assert sb.prompt_len.tolist() == [m[2] for m in model]
        b = Batch([tuple(m) for m in model], decode_threshold=8)
        assert sb.to_batch() == b
        if not b.tokens():  # no token scheduled: refused, as k.step_time refuses it (RL8)
            with pytest.raises(ValueError, match="no forward pass"):
                sb.step_time(k)
            continue
        same(sb.step_time(k), shared(k, b))  # after every operation: the sums stay exact
    if not sb.to_batch().tokens():
        return
    same(sb.step_time(k, per_resource=False), step.finish(step.compose(
        k.resolved_pool, step.summarise(k.resolved_pool, sb.to_batch())), None))


def test_step_batch_refuses_bad_values() -> None:
    sb = StepBatch(decode_threshold=4)
    with pytest.raises(ValueError, match="computed must be a non-negative"):
        sb.add(1, -3)
    with pytest.raises(ValueError, match="scheduled must be an integer"):
        sb.add(1.0, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"computed\[1\] is -1"):
        sb.extend([1, 1], [0, -1])
    with pytest.raises(ValueError, match="computed has 1 entries, scheduled has 2"):
        sb.extend([1, 1], [0])
    sb.extend([1, 1], [5, 6])
    with pytest.raises(IndexError, match="out of range"):
        sb.remove(2)
    with pytest.raises(ValueError, match="one entry per request"):
        sb.remove(np.array([True]))
    with pytest.raises(ValueError, match=r"scheduled\[0\] is -1"):
        sb.schedule([-1, 1])
    with pytest.raises(ValueError, match="sm_budget must be a non-negative"):
        StepBatch(sm_budget=-1)
    with pytest.raises(ValueError, match="read-only"):
        sb.computed[0] = -7  # the views are read-only: the sums cannot go stale
    with pytest.raises(IndexError, match="out of range"):
        sb.set_scheduled(5, 1)
    sb.sm_budget = -2  # a public attribute: checked when priced
    with pytest.raises(ValueError, match="sm_budget must be a non-negative"):
        sb.step_time(open_k(SCENARIOS[0]))
    assert len(sb) == 2 and sb.scheduled.tolist() == [1, 1]


def test_per_resource_is_a_fresh_map_each_call() -> None:
    k = open_k(SCENARIOS[0])
    s, c = np.ones(4, dtype=np.int64), np.full(4, 100, dtype=np.int64)
    a, b = k.step_time_arrays(s, c), k.step_time_arrays(s, c)
    assert a.per_resource is not None and a.per_resource is not b.per_resource
    assert Resource.HBM in a.per_resource


def test_step_batch_on_a_calibrated_kernel() -> None:
    kc = calibrated(SCENARIOS[0])
    sb = StepBatch(decode_threshold=8)
    sb.extend([2048, 1, 1], [0, 4095, 100])
    got = sb.step_time(kc)
    assert got.calibrated is not None
    same(got, kc.step_time(sb.to_batch()))


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("dtype", ["i1", "<i2", ">i2", "<i4", ">i4", "<i8", ">i8", "u2", "u8"])
def test_numpy_sign_check_reads_every_dtype_and_byte_order(dtype: str) -> None:
    """The computed column's sign is read from its bytes (decision FS1): every signed width
    and byte order, strided views too, is refused at the first negative position and priced
    as a Batch otherwise."""
    k = open_k(SCENARIOS[0])
    values = [5, 0, 100, 7, 3, 1]
    c = np.array(values, dtype=dtype)
    s = np.ones(len(values), dtype=np.int64)
    want = shared(k, Batch(list(zip([1] * 6, values, strict=True)), decode_threshold=8))
    same(k.step_time_arrays(s, c, decode_threshold=8), want)
    same(k.step_time_arrays(s[::2], c[::2], decode_threshold=8),
         shared(k, Batch([(1, v) for v in values[::2]], decode_threshold=8)))
    if dtype[-2] != "u":
        bad = c.copy()
        bad[3] = -1
        with pytest.raises(ValueError, match=r"computed\[3\] is -1"):
            k.step_time_arrays(s, bad, decode_threshold=8)
        with pytest.raises(ValueError, match=r"computed\[1\] is -1"):
            k.step_time_arrays(s[1::2], bad[1::2], decode_threshold=8)


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("rows", [[(1, 40), (2048, 0), (1, 9)], [(512, 7), (2048, 0)],
                                  [(2048, 3), (512, 7), (512, 0)], [(2048, 5)],
                                  [(0, 0), (2048, 0), (1, 4)]],
                         ids=["one-chunk", "two-chunks", "chunk-first", "alone", "empty-row"])
def test_step_batch_finds_its_prefill_rows(rows: list[tuple[int, int]]) -> None:
    """The one-chunk shortcut (decision FS2) takes only a step with one prefill chunk among
    decodes; two chunks of different sizes still walk both, in batch order."""
    for name in SCENARIOS:
        k = open_k(name)
        sb = StepBatch(decode_threshold=8)
        sb.extend([q[0] for q in rows], [q[1] for q in rows])
        same(sb.step_time(k), shared(k, Batch(rows, decode_threshold=8)))


# -- the compiled aggregate (decision AJ1) ------------------------------------------------

_I64_MAX = 2**63 - 1


def _aggregate_oracle(s: list[int], c: list[int], pl: list[int] | None) -> tuple[int, ...]:
    """step_arrays.aggregate's contract, from Python lists."""
    n = len(s)
    if len(c) != n:
        return (-1,) + (0,) * 8
    if not n:
        return (0,) * 9
    hi = max(s)
    if (min(s) < 0 or min(c) < 0 or hi * n > _I64_MAX or max(c) * n > _I64_MAX
            or pl is not None and (len(pl) != n or min(pl) < 0)):
        return (-1,) + (0,) * 8
    below = [v for v in s if v < hi]
    return (n, min(s), hi, c[s.index(hi)], int(s.count(hi) > 1),
            max(below) if below else -(2**63),
            sum(1 for a, b in zip(s, c, strict=True) if a == 0 and b == 0), sum(s), sum(c))


value_st = st.one_of(st.integers(0, 5), st.integers(0, 300_000),
                     st.integers(2**62 - 3, 2**62 + 3), st.integers(-5, -1),
                     st.sampled_from([-(2**63), _I64_MAX, 2**32, 2**56]))
# Values a simulator's columns hold: the pass accepts them (sums inside int64 for n <= 70).
fine_st = st.one_of(st.integers(0, 5), st.integers(0, 300_000), st.integers(0, 2**56))


@st.composite
def column_sets(draw: Any) -> tuple[list[int], list[int], list[int] | None]:
    """scheduled and computed: random, all equal, or all equal but one outlier anywhere;
    usually of equal length (empty and length 1 included), sometimes not; and no prompt
    length, or a column of them (a negative one or another length sometimes)."""
    n = draw(st.integers(0, 70))
    values = draw(st.sampled_from([value_st, fine_st]))
    shape = draw(st.sampled_from(["random", "equal", "outlier"]))
    if shape == "random":
        s = draw(st.lists(values, min_size=n, max_size=n))
    else:
        s = [draw(values)] * n
        if shape == "outlier" and n:
            s[draw(st.integers(0, n - 1))] = draw(values)
    m = n if draw(st.integers(0, 9)) else draw(st.integers(0, 70))
    c = draw(st.lists(st.one_of(values, st.just(0)), min_size=m, max_size=m))
    if draw(st.booleans()):
        return s, c, None
    k = n if draw(st.integers(0, 9)) else draw(st.integers(0, 70))
    bad = draw(st.integers(0, 4)) == 0
    return s, c, draw(st.lists(value_st if bad else st.integers(0, 2**63 - 1), min_size=k,
                               max_size=k))


@pytest.fixture
def jit_on(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Compiled loops on, whatever BLIS_JIT says outside (skipped without numba)."""
    pytest.importorskip("numba", reason="numba is not installed for this Python")
    monkeypatch.delenv("BLIS_JIT", raising=False)
    jit.reset()
    yield
    jit.reset()


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cols=column_sets())
@pytest.mark.usefixtures("jit_on")
def test_compiled_aggregate_is_the_python_one(
        cols: tuple[list[int], list[int], list[int] | None]) -> None:
    s, c = (np.array(x, dtype=np.int64) for x in cols[:2])
    pl = None if cols[2] is None else np.array(cols[2], dtype=np.int64)
    want = _aggregate_oracle(*cols)
    with np.errstate(over="ignore"):  # (int64 scalars may wrap where the result says -1)
        interpreted = tuple(int(v) for v in step_arrays.aggregate(s, c, pl))
    compiled = jit.compiled(step_arrays.aggregate)
    assert compiled is not None
    got = compiled(s, c, pl)
    assert all(type(v) is int for v in got)
    assert got == interpreted == want


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("rows", [
    [(9, 0), (1, 100), (1, 200)], [(1, 100), (1, 200), (9, 0)], [(1, 5), (9, 7), (2, 9)],
    [(9, 5)], [(0, 0), (9, 0), (1, 3)], [(0, 0), (1, 3), (1, 4)], [(2, 3), (2, 4), (40, 0)],
    [(1, 3), (1, 4)], [(2, 3), (2, 4)], [(9, 0), (9, 1), (1, 2)]],
    ids=["chunk-first", "chunk-last", "chunk-inside", "chunk-alone", "empty-row",
         "empty-row-decodes", "width-2", "uniform-1", "uniform-2", "two-chunks"])
def test_small_steps_keep_their_graph_mode(rows: list[tuple[int, int]]) -> None:
    """Steps under the capture size on pools whose decode and other graph modes differ in host
    cost: only a step where every request schedules the uniform decode width takes the decode
    mode, whatever the path (columns, StepBatch) and the jit mode."""
    for r in (tiny_dense(), tiny_moe_mla(dcp=1)):
        assert r.decode_graph_mode != r.other_graph_mode
        for width in (1, 2):
            k = Kernel(dataclasses.replace(r, uniform_decode_width=width), None, None)  # type: ignore[arg-type]
            b = Batch(rows, decode_threshold=8)
            want = shared(k, b)
            s, c = inputs(rows)[0]
            same(k.step_time_arrays(s, c, decode_threshold=8), want)
            sb = StepBatch(decode_threshold=8)
            sb.extend(s, c)
            same(sb.step_time(k), want)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cols=column_sets(), thr=st.sampled_from([-1, 0, 1, 8, 2048, 2**62, _I64_MAX]))
@pytest.mark.usefixtures("jit_on")
def test_compiled_prefill_pairs_are_the_python_ones(
        cols: tuple[list[int], list[int], list[int] | None], thr: int) -> None:
    s, c = cols[0], cols[1][:len(cols[0])]
    s = s[:len(c)]
    want = [(a, b) for a, b in zip(s, c, strict=True) if a > thr]
    sa, ca = np.array(s, dtype=np.int64), np.array(c, dtype=np.int64)
    fn = jit.compiled(step_arrays.prefill_pairs)
    assert fn is not None
    for got in (fn(sa, ca, thr), step_arrays.prefill_pairs(sa, ca, thr)):
        assert got.dtype == np.int64 and got.shape == (2, len(want))
        assert list(zip(*got.tolist(), strict=True)) == want


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("thr", [-(2**70), -3, -1, 0])
@pytest.mark.parametrize("rows", [[(0, 0), (1, 5), (2048, 0)], [(0, 0), (0, 0), (3, 1)],
                                  [(1, 5), (1, 6)], [(0, 7), (4, 0), (0, 0), (9, 9)]],
                         ids=["zeros-decode-chunk", "zeros-first", "decodes", "mixed"])
def test_thresholds_at_or_below_zero(rows: list[tuple[int, int]], thr: int) -> None:
    """At a threshold below 0 every request is a prefill row, (0, 0) ones included; at 0, a
    (0, 0) request has no context and the walk skips it."""
    for name in SCENARIOS[:2]:
        k = open_k(name)
        b = Batch(rows, decode_threshold=thr)
        s, c = inputs(rows)[0]
        same(k.step_time_arrays(s, c, c + s, decode_threshold=thr), shared(k, b))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(1, 80), data=st.data())
@pytest.mark.usefixtures("jit_on")
def test_compiled_shift_is_the_slice_assignment(cap: int, data: st.DataObject) -> None:
    """StepBatch.remove's compiled shift (decision AJ6) moves what the numpy slice moves."""
    n = data.draw(st.integers(1, cap))
    i = data.draw(st.integers(0, n - 1))
    cols = np.array(data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=3 * cap,
                                       max_size=3 * cap)), dtype=np.int64).reshape(3, cap)
    want = cols.copy()
    want[:, i:n - 1] = want[:, i + 1:n]
    fn = jit.compiled(step_batch.shift_left)
    assert fn is not None
    for shift in (fn, step_batch.shift_left):
        got = cols.copy()
        shift(got, i, n)
        assert got.tolist() == want.tolist()


@pytest.mark.usefixtures("jit_on")
def test_compiled_passes_found_without_jits_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """price reads jit.compiled's table directly (a dict read per call); without it (an
    empty dict, as when jit keeps its table elsewhere) it asks jit.compiled each call, and
    prices the same."""
    asked: list[Any] = []
    real = jit.compiled

    def spy(fn: Any) -> Any:
        asked.append(fn)
        return real(fn)

    monkeypatch.setattr(step_arrays, "_compiled_get", {}.get)
    monkeypatch.setattr(jit, "compiled", spy)
    k = open_k(SCENARIOS[0])
    for rows in ([(1, 4095)] * 5, [(2048, 0), (512, 7)] + [(1, 99)] * 3):
        s, c = inputs(rows)[0]
        same(k.step_time_arrays(s, c, decode_threshold=8),
             shared(k, Batch(rows, decode_threshold=8)))
    assert asked == [step_arrays.aggregate, step_arrays.aggregate, step_arrays.prefill_pairs]


def test_step_arrays_reads_jits_own_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table price reads is jit.compiled's, also after jit.reset() (else a reset would
    leave price on the compiled passes with BLIS_JIT=0, unseen: the prices are the same)."""
    table = step_arrays._compiled_get.__self__  # type: ignore[attr-defined]
    assert step_arrays._compiled_get == jit.lookup
    if not hasattr(jit, "_done"):  # (jit keeps it elsewhere: price asks jit.compiled)
        assert table == {}
        return
    monkeypatch.setenv("BLIS_JIT", "0")
    jit.reset()
    assert table is jit._done
    s, c = np.ones(3, dtype=np.int64), np.full(3, 7, dtype=np.int64)
    open_k(SCENARIOS[0]).step_time_arrays(s, c)
    assert table.get(step_arrays.aggregate, "unasked") is None
    jit.reset()
