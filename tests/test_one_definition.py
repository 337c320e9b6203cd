"""Every law is defined once (issue 16): the views call the Python laws through the UDFs of
``kernel/pool/sql_laws.py``, and no SQL copy of a law's body comes back.

The copy check is a search, like ``git grep``, over ``sql/*.sql`` with comments stripped: each
law lists fragments that only a SQL copy of its body would contain (its constants and
comparisons as SQL spells them). It is run on a temporary directory holding each law's old SQL
copy, so a fragment list that no longer catches its copy fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.model import laws
from kernel.pool import build, sql_laws
from pipeline import rules
from pipeline.constants import EVIDENCED_METHODS, FLASHINFER_SM90_SPARSE_MLA_VERSION
from pipeline.resources import sql_dir
from tests.resolution_support import GLM5, inputs, variant

# law -> regular expressions that a SQL copy of its body would match (case-insensitive)
FRAGMENTS: dict[str, tuple[str, ...]] = {
    "dtype_bytes": (r"'bf16'\s+THEN\s+2\b", r"'(nvfp4|mxfp4|int4)'\s+THEN\s+0?\.5\b"),
    "cache_dtype_bytes": (r"\b0?\.5625\b", r"'bfloat16'\s*,\s*'float16'\)?\s+THEN\s+2\b"),
    "dtype_fit": (r"tflops_\w+\s*>\s*0\s+THEN\s+'(fp8|nvfp4)'", r"tflops_\w+\s*\*\s*1e12"),
    "default_max_num_batched_tokens": (r"\b16384\b", r"memory_gib\s*>=\s*160"),
    "default_max_num_seqs": (r"'%a100%'", r"memory_gib\s*>=\s*70"),
    "kv_bytes_per_token": (r"\b656\b", r"\b352\b", r"THEN\s+1\s+ELSE\s+2\s+END",
                           r"kv_heads\s*//\s*\w*\.?tp"),
    "snap_collective_width": (r"width\s*<=\s*\w*\.?measured\[1\]",
                              r"list_contains\(\s*\w*\.?measured\s*,\s*\w*\.?width\s*\)",
                              r"width\s*>\s*16\s+THEN"),
    "measured_collective_widths": (r"floor\|peak_rate\|transition_rate",
                                   r"\(\[0-9\]\+\)rank_"),
    "fabric_ratio": (r"intra_node_bw_gbps\s*/\s*\w*\.?inter_node_bw_gbps",
                     r"inter_node_bw_gbps\s*<=\s*0\s+THEN\s+CAST\(\s*1\b"),
    "sequence_parallel_moe": (r"\btp\s*>\s*1\s+AND\s+\w*\.?dp\s*>\s*1\s+AND\s+\w*\.?all2all",),
    "custom_allreduce_supports_width": (r"\btp\s+IN\s*\(\s*SELECT",),
    "is_latent": (r"IN\s*\(\s*'mla'\s*,\s*'sparse_mla'\s*\)",),
    "dcp_shards_kv": (r"IN\s*\(\s*'gqa'\s*,\s*'mla'\s*,\s*'sparse_mla'\s*\)",),
    "go_int_list": (r"'\['\s*\|\|\s*array_to_string",),
    "platform_capture_cap": (r"THEN\s+1024\s+ELSE\s+512\b",),
    "MLA_CONTEXT_CHUNK_MAX": (r"\b65536\b",),
    "experts_per_rank": (r"%\s*greatest\(\s*\w*\.?expert_width",
                         r"\)\s*//\s*greatest\(\s*\w*\.?expert_width"),
    "snap_declared": (r"lambda\s+w\s*:\s*w\s*<=",),
    "DECLARED_WIDTHS": (r"\(1\)\s*,\s*\(2\)\s*,\s*\(4\)",),
    "span": (r"\(\s*\w*ratio\s*-\s*1\s*\)\s*\*",),
    "mla_context_chunk": (r"8\s*\*\s*\w*\.?max_model_len",),
    "evidenced methods": (r"IN\s*\(\s*'measured'\s*,\s*'literature'\s*,\s*'vendor_spec'\s*\)",),
}

# The SQL each law had before issue 16 (or the obvious way to write it again): the check must
# flag every one of them as a copy of its own law.
OLD_COPIES: dict[str, str] = {
    "dtype_bytes": "CREATE MACRO dtype_bytes(d) AS CASE d WHEN 'bf16' THEN 2.0 "
                   "WHEN 'fp8' THEN 1.0 WHEN 'nvfp4' THEN 0.5 ELSE 0.0 END;",
    "cache_dtype_bytes": "SELECT CASE WHEN c IN ('nvfp4', 'nvfp4_4over6') THEN 0.5625 END;",
    "dtype_fit": """
        CASE WHEN served_dtype = 'fp8' THEN CASE WHEN tflops_fp8 > 0 THEN 'fp8' ELSE 'bf16' END
             WHEN served_dtype = 'int8' THEN 'fp8' ELSE 'bf16' END AS gemm_suffix,
        CASE WHEN f.gemm_suffix = 'fp8' THEN f.tflops_fp8 * 1e12 END AS peak_flops""",
    "default_max_num_batched_tokens": """
        CASE WHEN max_num_batched_tokens > 0 THEN max_num_batched_tokens
             WHEN memory_gib >= 160 THEN 16384 ELSE 2048 END""",
    "default_max_num_seqs": """
        CASE WHEN memory_gib >= 70 AND lower(chip) NOT LIKE '%a100%' THEN 1024
             ELSE 256 END AS resolved_max_num_seqs""",
    "kv_bytes_per_token": """
        CASE WHEN latent_kind(kv_kind) AND cache_layout = 'fp8_ds_mla'
             THEN CAST(656 * kv_layers AS DOUBLE)
             ELSE (CASE WHEN latent_kind(kv_kind) THEN 1 ELSE 2 END) * heads * kv_head_dim
                  * cache_bytes * kv_layers END AS kv_bytes_per_token""",
    "snap_collective_width": """
        CASE WHEN coalesce(len(measured), 0) = 0 THEN NULL
             WHEN width <= measured[1] THEN measured[1]
             WHEN list_contains(measured, width) THEN width
             WHEN width > 16 THEN measured[-1] ELSE NULL END AS ranks""",
    "measured_collective_widths": """
        regexp_extract(name, '^collective_(floor|peak_rate|transition_rate)_'
                             || '(all_reduce|all_gather|reduce_scatter|alltoall)_fp16_'
                             || '([0-9]+)rank_(.+)$', ['part', 'op', 'w', 'chip']) AS m""",
    "fabric_ratio": """
        CASE WHEN intra_node_bw_gbps <= 0 OR inter_node_bw_gbps <= 0 THEN CAST(1 AS DOUBLE)
             ELSE intra_node_bw_gbps / inter_node_bw_gbps END AS fabric_ratio""",
    "sequence_parallel_moe": """
        (w.enable_expert_parallel AND w.tp > 1 AND w.dp > 1 AND w.all2all_backend IN (
             SELECT value FROM rules r WHERE r.category = 'sp_moe_backends'))""",
    "custom_allreduce_supports_width": """
        (w.tp IN (SELECT CAST(value AS BIGINT) FROM rules r
                  WHERE r.category = 'custom_allreduce_world_sizes')) AS custom_width_ok""",
    "is_latent": "CREATE OR REPLACE MACRO latent_kind(k) AS k IN ('mla', 'sparse_mla');",
    "dcp_shards_kv": "CREATE OR REPLACE MACRO dcp_shards_kind(k) AS k IN ('gqa', 'mla', "
                     "'sparse_mla');",
    "go_int_list": "CREATE OR REPLACE MACRO go_int_list(xs) AS "
                   "'[' || array_to_string(list_transform(xs, lambda x: CAST(x AS VARCHAR)), "
                   "' ') || ']';",
    "platform_capture_cap": "CASE WHEN tflops_nvfp4 > 0 THEN 1024 ELSE 512 END",
    "experts_per_rank": """
        CASE WHEN experts > 0 THEN (experts + redundant) // greatest(expert_width, 1)
                 + (CASE WHEN (experts + redundant) % greatest(expert_width, 1) <> 0 THEN 1
                         ELSE 0 END) ELSE 0 END AS experts_per_rank""",
    "snap_declared": """
        CASE WHEN coalesce(len(d.comm_widths), 0) = 0 THEN p.tp
             ELSE coalesce(list_max(list_filter(d.comm_widths, lambda w: w <= p.tp)),
                           d.comm_widths[1]) END AS comm_rank""",
    "DECLARED_WIDTHS": "FROM p, (VALUES (1), (2), (4), (8), (16)) AS dw(w)",
    "MLA_CONTEXT_CHUNK_MAX": "SELECT 1903, 'mla_context_chunk', '65536'",
    "span": "CREATE MACRO span_law(c, t, ratio) AS 1 + (ratio - 1) * c / t;",
    "mla_context_chunk": "least(greatest(8 * max_model_len, 4 * max_num_seqs * block), 65536)",
    "evidenced methods": "count(*) FILTER (WHERE method IN ('measured', 'literature', "
                         "'vendor_spec')) AS evidenced",
}

_COMMENT = re.compile(r"--[^\n]*")
_MACRO = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\w*\s+)?MACRO\s+(\w+)", re.I)


def law_copies(directory: Path) -> list[tuple[str, str, str]]:
    """(file, law, matched text) for every law fragment found in ``directory/*.sql``."""
    found = []
    for path in sorted(directory.glob("*.sql")):
        text = _COMMENT.sub("", path.read_text())
        for law, patterns in FRAGMENTS.items():
            for pattern in patterns:
                for match in re.finditer(pattern, text, re.I):
                    found.append((path.name, law, match.group(0)))
    return found


def _udf_names() -> set[str]:
    return {*sql_laws._LAWS, *sql_laws._NULL_AWARE, "capture_sizes"}


def test_no_law_body_in_sql() -> None:
    assert sorted(sql_dir().glob("*.sql")), "no sql/ files found"
    copies = law_copies(sql_dir())
    assert not copies, "laws written again in SQL (call the kernel.model.laws UDF instead): " + \
        "; ".join(f"{f}: {law} ({text!r})" for f, law, text in copies)


@pytest.mark.parametrize("law", sorted(OLD_COPIES))
def test_the_check_finds_a_re_added_copy(tmp_path: Path, law: str) -> None:
    (tmp_path / "99_copy.sql").write_text(f"-- a copy\nSELECT\n{OLD_COPIES[law]}\n")
    assert law in {found_law for _, found_law, _ in law_copies(tmp_path)}
    (tmp_path / "99_copy.sql").write_text("".join(f"-- {line}\n"
                                                  for line in OLD_COPIES[law].splitlines()))
    assert law_copies(tmp_path) == []  # a comment quoting the formula is not a copy


def test_every_law_has_an_old_copy_and_a_python_definition() -> None:
    assert set(OLD_COPIES) == set(FRAGMENTS)
    for law in FRAGMENTS:
        if law == "evidenced methods":
            assert set(EVIDENCED_METHODS) == {"measured", "literature", "vendor_spec"}
        else:
            assert getattr(laws, law, None) is not None or callable(getattr(rules, law, None)), law


def test_no_sql_macro_redefines_a_law_or_a_udf() -> None:
    names = {name.lower() for path in sql_dir().glob("*.sql")
             for name in _MACRO.findall(_COMMENT.sub("", path.read_text()))}
    python_laws = {n for n in dir(laws) if callable(getattr(laws, n)) and not n.startswith("_")}
    clash = names & (python_laws | _udf_names())
    assert not clash, f"SQL macros named like a kernel law or its UDF: {sorted(clash)}"


def test_every_udf_the_views_call_is_registered() -> None:
    """A view calling a law by a name no installer registers would fail only at run time."""
    con = duckdb.connect()
    sql_laws.register_laws(con)
    have = {r[0] for r in con.execute(
        "SELECT function_name FROM duckdb_functions() WHERE function_type = 'scalar'").fetchall()}
    assert _udf_names() <= have
    text = " ".join(_COMMENT.sub("", p.read_text()) for p in sql_dir().glob("*.sql"))
    called = {n for n in _udf_names() if re.search(rf"\b{n}\s*\(", text)}
    assert called == _udf_names() - {"span_law", "flat_span"}, \
        f"registered but never called: {sorted(_udf_names() - called)}"


# -- the UDFs are the laws, with the views' meaning of an absent argument -----------------

@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    sql_laws.register_laws(c)
    return c


def _one(con: duckdb.DuckDBPyConnection, sql: str, *params: object) -> object:
    row = con.execute(sql, list(params)).fetchone()
    assert row is not None
    return row[0]


@settings(max_examples=60, deadline=None)
@given(served=st.sampled_from(["bf16", "fp16", "fp8", "nvfp4", "mxfp4", "int8", "int4", "x"]),
       peaks=st.tuples(*[st.sampled_from([0.0, 989.5, 1979.0, 4500.0])] * 3))
def test_gemm_fit_is_dtype_fit(con: duckdb.DuckDBPyConnection, served: str,
                               peaks: tuple[float, float, float]) -> None:
    got = _one(con, "SELECT gemm_fit(?, ?, ?, ?)", served, *peaks)
    suffix, peak = laws.dtype_fit(served, *peaks)
    assert got == {"suffix": suffix, "peak": peak}


def test_gemm_fit_absent_arguments(con: duckdb.DuckDBPyConnection) -> None:
    assert _one(con, "SELECT gemm_fit(NULL, 1000, 2000, 0)") == {"suffix": "bf16", "peak": 1e15}
    # an unstated fp8 peak is no fp8 unit: fp8 falls back to bf16
    assert _one(con, "SELECT gemm_fit('fp8', 1000, NULL, 0)") == {"suffix": "bf16", "peak": 1e15}
    # int8 has no fallback: its unstated peak stays NULL rather than becoming 0
    assert _one(con, "SELECT gemm_fit('int8', 1000, NULL, 0)") == {"suffix": "fp8", "peak": None}


@settings(max_examples=80, deadline=None)
@given(n_kv=st.integers(0, 128), tp=st.integers(0, 64), head_dim=st.integers(0, 576),
       layers=st.integers(0, 128), cache=st.sampled_from([0.0, 0.5, 0.5625, 1.0, 2.0, 4.0]),
       latent=st.booleans(),
       layout=st.sampled_from(["", "auto", "fp8", "fp8_ds_mla", "nvfp4_ds_mla"]))
def test_kv_bytes_udf_is_the_law(con: duckdb.DuckDBPyConnection, n_kv: int, tp: int,
                                 head_dim: int, layers: int, cache: float, latent: bool,
                                 layout: str) -> None:
    got = _one(con, "SELECT kv_bytes_per_token(?, ?, ?, ?, ?, ?, ?)",
               n_kv, tp, head_dim, layers, cache, latent, layout)
    assert got == laws.kv_bytes_per_token(n_kv, tp, head_dim, layers, cache, latent, layout)


def test_kv_bytes_packed_layouts_and_absent_width(con: duckdb.DuckDBPyConnection) -> None:
    assert laws.kv_bytes_per_token(1, 8, 576, 61, 1.0, True, "fp8_ds_mla") == 656 * 61
    assert laws.kv_bytes_per_token(1, 8, 576, 61, 0.5, True, "nvfp4_ds_mla") == 352 * 61
    # a packed layout name on a non-latent cache is an ordinary cache
    assert laws.kv_bytes_per_token(8, 1, 128, 2, 1.0, False, "fp8_ds_mla") == 2 * 8 * 128 * 2
    # an unknown cache width (NULL; refused elsewhere) holds nothing; a missing geometry is NULL
    assert _one(con, "SELECT kv_bytes_per_token(8, 1, 128, 2, NULL, false, 'x')") == 0.0
    assert _one(con, "SELECT kv_bytes_per_token(NULL, 1, 128, 2, 2.0, false, '')") is None


@settings(max_examples=80, deadline=None)
@given(width=st.integers(1, 64), measured=st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]),
                                                  max_size=4))
def test_snap_udf_is_the_law(con: duckdb.DuckDBPyConnection, width: int,
                             measured: list[int]) -> None:
    got = _one(con, "SELECT snap_collective_width(?, ?::BIGINT[])", width, measured)
    try:
        want: int | None = laws.snap_collective_width(width, measured)
    except ValueError:
        want = None
    assert got == want


@pytest.mark.parametrize("memory, chip", [(192.0, "b200"), (141.0, "h200"), (80.0, "a100-80"),
                                          (80.0, "h100"), (48.0, "l40s"), (160.0, "A100-x")])
def test_default_budgets_are_the_laws(con: duckdb.DuckDBPyConnection, memory: float,
                                      chip: str) -> None:
    assert _one(con, "SELECT default_max_num_batched_tokens(?, ?)", memory, chip) == \
        laws.default_max_num_batched_tokens(memory, chip)
    assert _one(con, "SELECT default_max_num_seqs(?, ?)", memory, chip) == \
        laws.default_max_num_seqs(memory, chip)


def test_rules_udfs_read_the_facts_they_are_given(con: duckdb.DuckDBPyConnection) -> None:
    pack = rules.V0_29
    for backend, ep, tp, dp in [("deepep_low_latency", True, 2, 16), ("pplx", True, 2, 16),
                                ("deepep_low_latency", False, 2, 16),
                                ("deepep_low_latency", True, 1, 16)]:
        assert _one(con, "SELECT sequence_parallel_moe(?, ?, ?, ?, ?::VARCHAR[])", backend, ep,
                    tp, dp, sorted(pack.sp_moe_backends)) == \
            pack.sequence_parallel_moe(backend, ep, tp, dp)
    assert _one(con, "SELECT sequence_parallel_moe('deepep_low_latency', true, 2, 16, NULL)") \
        is False  # a pack without the list has no such backend
    for tp in (1, 2, 3, 8, 16, 32):
        assert _one(con, "SELECT custom_allreduce_supports_width(?, ?::BIGINT[])", tp,
                    sorted(pack.custom_allreduce_world_sizes)) == \
            pack.custom_allreduce_supports_width(tp)


def test_small_laws(con: duckdb.DuckDBPyConnection) -> None:
    for intra, inter in [(450.0, 50.0), (900.0, 900.0), (450.0, 0.0), (0.0, 50.0)]:
        assert _one(con, "SELECT fabric_ratio(?, ?)", intra, inter) == \
            laws.fabric_ratio(intra, inter)
    for kind in ("mla", "sparse_mla", "gqa", "mha", ""):
        assert _one(con, "SELECT latent_kind(?)", kind) is laws.is_latent(kind)
        assert _one(con, "SELECT dcp_shards_kind(?)", kind) is laws.dcp_shards_kv(kind)
    assert _one(con, "SELECT go_int_list([2, 4, 8])") == laws.go_int_list([2, 4, 8]) == "[2 4 8]"
    assert _one(con, "SELECT platform_capture_cap(true), platform_capture_cap(false)") == 1024
    assert laws.platform_capture_cap(False) == 512
    assert _one(con, "SELECT mla_context_chunk_max()") == laws.MLA_CONTEXT_CHUNK_MAX
    assert _one(con, "SELECT declared_widths()") == list(laws.DECLARED_WIDTHS)
    for n, ep in [(256, 8), (257, 8), (7, 1), (3, 16)]:
        base, heaviest = laws.experts_per_rank(n, ep)
        assert _one(con, "SELECT experts_per_rank(?, ?)", n, ep) == \
            {"base": base, "heaviest": heaviest}
    for width, declared in [(8, [1, 2, 4]), (3, [4, 8]), (4, None), (16, [2, 16, 32])]:
        assert _one(con, "SELECT snap_declared(?, ?::BIGINT[])", width, declared) == \
            laws.snap_declared(width, declared or [])
    names = [f"collective_{part}_all_reduce_fp16_{w}rank_h200"
             for w in (2, 4, 8) for part in ("floor", "peak_rate", "transition_rate")
             if (w, part) != (4, "floor")] + ["collective_floor_all_reduce_fp16_16rank_b200"]
    assert _one(con, "SELECT measured_collective_widths(?, 'all_reduce', 'h200')", names) == \
        laws.measured_collective_widths(names, "all_reduce", "h200") == [2, 8]


# -- the named numbers reach the views' text from their one definition ----------------------

def test_assumption_texts_take_the_constants() -> None:
    r, _ = build.resolve(variant(inputs(GLM5), engine={"cache_dtype": "fp8_e4m3"}))
    reason = {o.name: o.scope for o in r.assumptions}["sparse_mla_backend"]
    assert reason.endswith(f"FlashInfer >= {FLASHINFER_SM90_SPARSE_MLA_VERSION}")
    r, _ = build.resolve(variant(inputs("glm5-h200-tp8-dcp4"), engine={"max_model_len": 0}))
    chunk = {o.name: o.scope for o in r.assumptions}["mla_context_chunk"]
    assert chunk.startswith(f"{laws.MLA_CONTEXT_CHUNK_MAX}: ")
