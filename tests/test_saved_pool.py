"""A saved resolved pool loads back and prices identically; a wrong file is refused clearly.
Also: the decoder's per-type cache and the alias-free YAML checks change no result."""

from __future__ import annotations

import pickle
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.facade import saved
from kernel.model.types import Batch, Direction, Placement
from pipeline import decode, documents, yamlio
from pipeline.errors import DocumentError

SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"


@pytest.fixture(scope="module")
def built() -> kernel.Kernel:
    return kernel.open(SCENARIO)


@pytest.fixture(scope="module")
def loaded(built: kernel.Kernel, tmp_path_factory: pytest.TempPathFactory) -> kernel.Kernel:
    path = built.save(tmp_path_factory.mktemp("saved") / "ds3.pool")
    return kernel.load_kernel(path)


def test_loaded_pool_is_the_same_record(built: kernel.Kernel, loaded: kernel.Kernel) -> None:
    assert loaded.resolved_pool == built.resolved_pool
    assert loaded.resolved_pool is not built.resolved_pool
    assert loaded.resolved() == built.resolved()
    assert loaded.deployment() == built.deployment()
    assert loaded.documents() == built.documents() != {}
    assert loaded.calibration is built.calibration is None
    assert repr(loaded) == repr(built)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 100_000)), min_size=1,
                max_size=40).filter(lambda reqs: any(s for s, _ in reqs)),  # a step (RL8)
       st.sampled_from([1, 8]))
def test_loaded_pool_prices_identically(built: kernel.Kernel, loaded: kernel.Kernel,
                                        reqs: list[tuple[int, int]], thr: int) -> None:
    b = Batch(reqs, decode_threshold=thr)
    pa: dict[kernel.Resource, int] = {}
    pb: dict[kernel.Resource, int] = {}
    assert loaded.step_time_into(b, pa) == built.step_time_into(b, pb)
    assert pa == pb


def test_loaded_pool_answers_every_question_alike(built: kernel.Kernel,
                                                  loaded: kernel.Kernel) -> None:
    assert loaded.fixed_bytes() == built.fixed_bytes()
    assert loaded.pre_snapshot_bytes() == built.pre_snapshot_bytes()
    assert loaded.kv_capacity() == built.kv_capacity()
    assert loaded.sequence_bounded_bytes_at(4096, 2048) == built.sequence_bounded_bytes_at(
        4096, 2048)
    assert loaded.provenance() == built.provenance()
    assert loaded.evidence() == built.evidence()
    assert loaded.graph_modes() == built.graph_modes()
    src, dst = Placement(0), Placement(1)
    assert loaded.pd_transfer_time(8192, src, dst) == built.pd_transfer_time(8192, src, dst)
    for tier in built.resolved_pool.tiers:
        assert loaded.tier_time(tier, Direction.FROM_TIER, 1 << 20, 4) == built.tier_time(
            tier, Direction.FROM_TIER, 1 << 20, 4)


def test_bulk_prices_a_loaded_pool_identically(built: kernel.Kernel,
                                               loaded: kernel.Kernel) -> None:
    from kernel.io.synth import synth

    trace = synth(300, seed=3)
    assert loaded.price(trace).equals(built.price(trace))


def test_a_kernel_pickles_as_a_whole(built: kernel.Kernel) -> None:
    again = pickle.loads(pickle.dumps(built))
    b = Batch([(1, 4095)] * 32, decode_threshold=8)
    assert again.step_time(b) == built.step_time(b)


def test_wrong_files_are_refused_with_the_reason(built: kernel.Kernel, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pool"
    junk.write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match="junk.pool: not a saved blis-kernel pool"):
        kernel.load_kernel(junk)
    other = tmp_path / "other.pool"
    other.write_bytes(pickle.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a saved blis-kernel pool"):
        kernel.load_kernel(other)
    header, body = pickle.loads(saved.dumps(built))
    for key, value, why in (("version", 99, "format version 99"),
                            ("engine", "0.1.0", "engine behaviour '0.1.0'")):
        stale = tmp_path / f"{key}.pool"
        stale.write_bytes(pickle.dumps(({**header, key: value}, body)))
        with pytest.raises(ValueError, match=why):
            kernel.load_kernel(stale)
    broken = tmp_path / "broken.pool"
    broken.write_bytes(pickle.dumps((header, ("a", "b", "c", {}, None))))
    with pytest.raises(ValueError, match="not a resolution record"):
        kernel.load_kernel(broken)
    with pytest.raises(ValueError, match="cannot read"):
        kernel.load_kernel(tmp_path / "missing.pool")


def test_saving_never_leaves_half_a_file(built: kernel.Kernel, tmp_path: Path) -> None:
    out = built.save(tmp_path / "k.pool")
    assert [p.name for p in tmp_path.iterdir()] == ["k.pool"]
    assert kernel.load_kernel(out).resolved_pool == built.resolved_pool


# --- the decoder's per-type cache -----------------------------------------------------------


def test_type_hints_are_resolved_once_per_type(monkeypatch: pytest.MonkeyPatch) -> None:
    decode._record_plan.cache_clear()
    decode._shape.cache_clear()
    calls: list[object] = []
    real = typing.get_type_hints

    def counting(tp: object, *a: object, **kw: object) -> object:
        calls.append(tp)
        return real(tp, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(typing, "get_type_hints", counting)
    from pipeline.resources import data_dir

    path = next((data_dir() / "catalog" / "models" / "deepseek-v3").glob("*.yaml"), None)
    assert path is not None
    tree = yamlio.read_documents(path)[0]
    first, _ = decode.decode(documents.Graph, tree, str(path))
    n = len(calls)
    second, _ = decode.decode(documents.Graph, tree, str(path))
    assert first == second
    assert len(calls) == n  # nothing resolved again for the same types
    assert len(calls) == len(set(calls))  # each type at most once


def test_unknown_keys_are_still_reported_with_their_path() -> None:
    tree = yamlio.read_documents("x.yaml", "name: a\nbogus: 1\n")[0]
    with pytest.raises(DocumentError, match="unknown key 'bogus'"):
        decode.decode(documents.Chip, tree, "x.yaml")


# --- YAML size checks without aliases ---------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.integers(0, 9) | st.text("ab", max_size=3),
                    lambda c: st.lists(c, max_size=3)
                    | st.dictionaries(st.text("xyz", min_size=1, max_size=2), c, max_size=3),
                    max_leaves=30))
def test_tree_depth_equals_the_alias_aware_depth(value: object) -> None:
    node = yaml.compose(yaml.safe_dump(value), Loader=yamlio._LOADER)
    assert yamlio._tree_depth(node) == yamlio._depth(node)


def test_alias_bombs_and_deep_documents_are_still_refused() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n"
        for i in range(6))
    with pytest.raises(DocumentError, match="aliases"):
        yamlio.read_documents("bomb.yaml", bomb)
    deep = "[" * (yamlio.MAX_DEPTH + 5) + "]" * (yamlio.MAX_DEPTH + 5)
    with pytest.raises(DocumentError, match="deep"):
        yamlio.read_documents("deep.yaml", deep)
