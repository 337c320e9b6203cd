"""Requests in (issue 29 item 1): the readers, the row rules and the RequestSet contract."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.replay import REJECT_SCHEMA, REQUEST_SCHEMA, RequestSet, read_requests
from kernel.replay.formats import detect_format, write_requests
from tests.validation_support import REFERENCE

DATA = Path(__file__).parent / "data" / "request-traces"
AZURE = DATA / "AzureLLMInferenceTrace_conv.head200.csv"
MOONCAKE = DATA / "mooncake_conversation_trace.head200.jsonl"
# The full public traces, in the knowledge base beside the clone (../shared).
SHARED = REFERENCE / "request-traces"


def _check_contract(rs: RequestSet) -> None:
    assert rs.table.schema.equals(REQUEST_SCHEMA)
    assert rs.rejects.schema.equals(REJECT_SCHEMA)
    assert rs.rows_in == rs.table.num_rows + rs.rejects.num_rows
    arr = rs.table["arrival_ns"].to_pylist()
    timed = [a for a in arr if a is not None]
    assert arr[: len(timed)] == timed  # closed-loop follow-ups (null) come last
    assert np.all(np.diff(np.asarray(timed, dtype=np.int64)) >= 0)
    assert len(set(rs.table["request_id"].to_pylist())) == rs.table.num_rows


# ------------------------------------------------------------------------------ public traces

def test_azure_extract_reads_every_row_as_published() -> None:
    rs = read_requests(AZURE)
    _check_contract(rs)
    assert rs.rows_in == 200 and rs.rejects.num_rows == 0
    lines = AZURE.read_text().splitlines()[1:]
    stamps = [datetime.strptime(line.split(",")[0][:26], "%Y-%m-%d %H:%M:%S.%f")
              for line in lines]
    # the published timestamps carry 7 decimals; the 7th is a 100 ns digit
    extra = [int(line.split(",")[0][26:] or 0) * 100 for line in lines]
    want = [round((s - stamps[0]).total_seconds() * 1e6) * 1000 + e - extra[0]
            for s, e in zip(stamps, extra, strict=True)]
    assert rs.table["arrival_ns"].to_pylist() == want
    assert rs.table["prompt_tokens"].to_pylist() == [int(x.split(",")[1]) for x in lines]
    assert rs.table["output_tokens"].to_pylist() == [int(x.split(",")[2]) for x in lines]
    assert rs.hash_block_tokens is None


def test_mooncake_extract_keeps_full_blocks_and_chains_hashes() -> None:
    rs = read_requests(MOONCAKE)
    _check_contract(rs)
    recs = [json.loads(x) for x in MOONCAKE.read_text().splitlines()]
    assert rs.rows_in == len(recs) == rs.table.num_rows
    assert rs.hash_block_tokens == 512
    assert rs.table["arrival_ns"].to_pylist() == [r["timestamp"] * 1_000_000 for r in recs]
    assert rs.table["prompt_tokens"].to_pylist() == [r["input_length"] for r in recs]
    hashes = rs.table["prefix_hashes"].to_pylist()
    for r, h in zip(recs, hashes, strict=True):
        assert len(h) == r["input_length"] // 512  # whole blocks only
    # equal chained entry i <=> equal published ids up to i (the published ids are chained)
    seen: dict[int, tuple[int, ...]] = {}
    for r, h in zip(recs, hashes, strict=True):
        for i, v in enumerate(h):
            prefix = tuple(r["hash_ids"][: i + 1])
            assert seen.setdefault(v, prefix) == prefix
    shared_first = sum(1 for h in hashes if h and h[0] == hashes[0][0])
    assert shared_first > 1  # the extract does share prefixes


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (the full public traces "
                    "live in ../shared beside the clone; the extracts above still run)")
@pytest.mark.parametrize("name,rows", [
    ("azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv", 19366),
    ("azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv", 8819),
    ("mooncake-fast25/conversation_trace.jsonl", 12031),
    ("mooncake-fast25/synthetic_trace.jsonl", 3993),
])
def test_full_public_traces_read_without_rejects(name: str, rows: int) -> None:
    rs = read_requests(SHARED / name)
    _check_contract(rs)
    assert (rs.rows_in, rs.table.num_rows, rs.unordered) == (rows, rows, 0)


def test_detection_and_override(tmp_path: Path) -> None:
    assert detect_format(AZURE) == "azure"
    assert detect_format(MOONCAKE) == "mooncake"
    p = tmp_path / "t.csv"
    p.write_text("arrival,prompt_tokens,output_tokens\n0.5,10,2\n")
    assert detect_format(p) == "table"
    assert detect_format(pa.table({"a": [1]})) == "table"
    # an Azure CSV read as a plain table lacks the table's columns: a clear error
    with pytest.raises(ValueError, match="arrival.*prompt_tokens"):
        read_requests(AZURE, format="table")
    with pytest.raises(ValueError, match="unknown request format"):
        read_requests(AZURE, format="parquet-ish")
    odd = tmp_path / "x.dat"
    odd.write_text("1")
    with pytest.raises(ValueError, match="format="):
        read_requests(odd)


# ------------------------------------------------------------------------------------ tables

def test_table_units_ids_and_sources(tmp_path: Path) -> None:
    t = pa.table({"arrival": [0.3, 0.1, 2.0], "prompt_tokens": [5, 6, 7],
                  "output_tokens": [1, 2, 3], "request_id": ["a", "b", "c"]})
    rs = read_requests(t)
    assert rs.table["request_id"].to_pylist() == ["b", "a", "c"]  # sorted by arrival
    assert rs.table["arrival_ns"].to_pylist() == [100_000_000, 300_000_000, 2_000_000_000]
    assert rs.unordered == 1 and any("RQ2" in n for n in rs.notes)
    ms = read_requests(t, arrival_unit="ms")
    assert ms.table["arrival_ns"].to_pylist() == [100_000, 300_000, 2_000_000]
    for src in (pl.from_arrow(t), t.to_batches()[0]):
        assert read_requests(src).table.equals(rs.table)
    path = tmp_path / "r.parquet"
    pq.write_table(t, path)
    assert read_requests(path).table.equals(rs.table)
    csv = tmp_path / "r.csv"
    csv.write_text("arrival,prompt_tokens,output_tokens,request_id\n"
                   "0.3,5,1,a\n0.1,6,2,b\n2.0,7,3,c\n")
    assert read_requests(csv).table.equals(rs.table)
    named = pa.table({"arrival_us": [7, 3], "prompt_tokens": [1, 1], "output_tokens": [1, 1]})
    got = read_requests(named)
    assert got.table["arrival_ns"].to_pylist() == [3000, 7000]
    assert got.table["request_id"].to_pylist() == ["1", "0"]  # the source row when absent
    with pytest.raises(ValueError, match="arrival_unit"):
        read_requests(t, arrival_unit="h")


def test_roundtrip_through_parquet_keeps_everything(tmp_path: Path) -> None:
    rs = read_requests(MOONCAKE)
    path = tmp_path / "rs.parquet"
    write_requests(rs, path)
    back = read_requests(path)
    assert back.table.equals(rs.table)
    assert back.hash_block_tokens == 512


def test_prefix_hashes_need_their_block_size() -> None:
    t = pa.table({"arrival": [0, 1], "prompt_tokens": [32, 40], "output_tokens": [1, 1],
                  "prefix_hashes": [[1, 2], [1, 2, 3]]})
    with pytest.raises(ValueError, match="hash_block_tokens"):
        read_requests(t)
    rs = read_requests(t, hash_block_tokens=16)
    # 40 tokens hold 2 full blocks of 16: a third hash is one too many
    assert rs.table.num_rows == 1
    assert rs.rejects.to_pylist() == [{"row": 1, "reason": rs.rejects["reason"][0].as_py(),
                                       "column": "prefix_hashes", "value": "3"}]
    text = pa.table({"arrival": [0, 1], "prompt_tokens": [32, 32], "output_tokens": [1, 1],
                     "prefix_hashes": ["[4, 5]", "oops"]})
    got = read_requests(text, hash_block_tokens=16)
    assert got.table["prefix_hashes"].to_pylist() == [[4, 5]]
    assert got.rejects["column"].to_pylist() == ["prefix_hashes"]


# ------------------------------------------------------------------------------- bad input

BAD_CSV = """arrival,prompt_tokens,output_tokens
0.0,10,5
-1.0,10,5
0.5,10,0
0.6,10.5,3
0.7,ten,3
0.8,10
0.9,10,3,extra
1.0,5000,3
,10,3
1.1,10,-2
1.2,12,4
"""


def test_bad_rows_are_counted_with_row_column_value_and_reason(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(BAD_CSV)
    rs = read_requests(p, max_model_len=4096)
    _check_contract(rs)
    assert rs.rows_in == 11
    assert rs.table["prompt_tokens"].to_pylist() == [10, 12]
    got = {r["row"]: (r["column"], r["value"]) for r in rs.rejects.to_pylist()}
    assert got == {1: ("arrival", "-1000000000"), 2: ("output_tokens", "0"),
                   3: ("prompt_tokens", "10.5"), 4: ("prompt_tokens", "ten"),
                   5: (None, "0.8,10"), 6: (None, "0.9,10,3,extra"),
                   7: ("prompt_tokens", "5000"), 8: ("arrival", None),
                   9: ("output_tokens", "-2")}
    reasons = dict(zip(rs.rejects["row"].to_pylist(), rs.rejects["reason"].to_pylist(),
                       strict=True))
    assert "not an integer" in reasons[3] and "not a number" in reasons[4]
    assert "max_model_len 4096" in reasons[7] and "unreadable row" in reasons[5]
    # prompt 4094 + output 3 > 4096: refused on the output; prompt 4096 leaves no room
    edge = pa.table({"arrival": [0, 1, 2], "prompt_tokens": [4094, 4096, 4093],
                     "output_tokens": [3, 1, 3]})
    got = read_requests(edge, max_model_len=4096)
    assert got.table["prompt_tokens"].to_pylist() == [4093]
    assert got.rejects.select(["row", "column"]).to_pylist() == [
        {"row": 0, "column": "output_tokens"}, {"row": 1, "column": "prompt_tokens"}]
    assert "negative" in reasons[1] and "> 0" in reasons[2]
    with pytest.raises(ValueError, match=r"bad\.csv: row 1, column 'arrival'"):
        read_requests(p, on_reject="raise")


def test_unreadable_jsonl_rows(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n'
                 "not json\n\n"
                 '{"timestamp": 5, "input_length": 600, "output_length": 0, "hash_ids": [0]}\n'
                 '{"timestamp": 9, "input_length": 10, "output_length": 3, "hash_ids": [-1]}\n'
                 '{"timestamp": 3, "input_length": 1024, "output_length": 2, "hash_ids": [0, 7]}\n')
    rs = read_requests(p)
    assert rs.rows_in == 5 and rs.table.num_rows == 2
    assert rs.rejects["row"].to_pylist() == [1, 2, 3]
    assert rs.table["arrival_ns"].to_pylist() == [0, 3_000_000]
    a, b = rs.table["prefix_hashes"].to_pylist()
    assert len(a) == 1 and len(b) == 2 and a[0] == b[0]  # both start with block id 0


def test_duplicate_ids_and_closed_loop_rows() -> None:
    t = pa.table({"arrival": [0.0, 1.0, None, None, None], "prompt_tokens": [1, 2, 3, 4, 5],
                  "output_tokens": [1, 1, 1, 1, 1], "request_id": ["x", "x", "y", "z", "w"],
                  "session_id": ["s", "t", "s", "u", None],
                  "think_ns": [None, None, 5, 6, 7]})
    rs = read_requests(t)
    _check_contract(rs)
    assert rs.table["request_id"].to_pylist() == ["x", "y"]
    assert rs.table["think_ns"].to_pylist() == [None, 5]
    assert rs.table["arrival_ns"].to_pylist() == [0, None]
    why = dict(zip(rs.rejects["row"].to_pylist(), rs.rejects["reason"].to_pylist(),
                       strict=True))
    assert "repeats" in why[1] and "first request has no arrival" in why[3]
    assert "closed-loop" in why[4]


# ----------------------------------------------------------------------------------- tracev2

def _tracev2(tmp_path: Path, rows: list[str], header: str | None = None) -> tuple[Path, Path]:
    h = tmp_path / "trace.yaml"
    h.write_text(header or "trace_version: 2\ntime_unit: us\nmode: generated\n"
                 "warm_up_requests: 0\n")
    cols = ("request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,"
            "prefix_length,streaming,input_tokens,output_tokens,text_tokens,image_tokens,"
            "audio_tokens,video_tokens,reason_ratio,model,deadline_us,server_input_tokens,"
            "arrival_time_us,send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,"
            "status,error_message,finish_reason")
    d = tmp_path / "trace.csv"
    d.write_text(cols + "\n" + "\n".join(rows) + "\n")
    return h, d


def _row(rid: int, group: str, plen: int, inp: int, out: int, arrival: int, send: int = 0,
         server: int = 0, session: str = "") -> str:
    return (f"{rid},c,t,standard,{session},0,{group},{plen},true,{inp},{out},{inp},0,0,0,0,,0,"
            f"{server},{arrival},{send},0,0,0,ok,,")


def test_tracev2_maps_prefix_groups_and_injection(tmp_path: Path) -> None:
    h, d = _tracev2(tmp_path, [
        _row(0, "g1", 40, 100, 7, 1_000),
        _row(1, "g1", 40, 60, 8, 2_500),
        _row(2, "", 0, 50, 9, 3_000, server=55),
        _row(3, "g2", 40, 10, 3, 4_000, session="s1"),
    ])
    for src in (h, d, (h, d), (d, h)):
        rs = read_requests(src)
        _check_contract(rs)
        assert rs.table["prompt_tokens"].to_pylist() == [140, 100, 55, 50]
        assert rs.table["arrival_ns"].to_pylist() == [1_000_000, 2_500_000, 3_000_000,
                                                      4_000_000]
        assert rs.hash_block_tokens == 16
        hs = rs.table["prefix_hashes"].to_pylist()
        assert hs[0] == hs[1] and len(hs[0]) == 2  # 40 shared tokens: 2 full blocks of 16
        assert hs[2] == [] and hs[3][0] != hs[0][0]
        assert rs.table["session_id"].to_pylist() == [None, None, None, "s1"]
    # send_time_us (when recorded) is the injection time, on the arrival clock's origin
    h2, d2 = _tracev2(tmp_path, [_row(0, "", 0, 5, 2, 100, send=10_100),
                                 _row(1, "", 0, 5, 2, 200, send=10_700)])
    assert read_requests(h2).table["arrival_ns"].to_pylist() == [100_000, 700_000]
    assert read_requests(h2, hash_block_tokens=8).hash_block_tokens == 8


def test_tracev2_bad_header_and_rows(tmp_path: Path) -> None:
    h, d = _tracev2(tmp_path, [_row(0, "", 0, 5, 0, 1), "1,c,t"], header="time_unit: ms\n")
    with pytest.raises(ValueError, match="trace_version"):
        read_requests(h)
    h.write_text("trace_version: 2\ntime_unit: ms\n")
    with pytest.raises(ValueError, match="time_unit"):
        read_requests(h)
    h.write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "\n".join(
        f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi",
                                                                   strict=True)) + "\n")
    with pytest.raises(ValueError, match="aliases"):  # refused before expanding
        read_requests(h)
    h.write_text("trace_version: 2\n")
    rs = read_requests(h)
    assert rs.rows_in == 2 and rs.table.num_rows == 0
    assert rs.rejects["column"].to_pylist() == ["output_tokens", None]


# ---------------------------------------------------------------------------------- property

_cell = st.one_of(st.integers(-5, 3000).map(str), st.floats(-2, 50).map(str),
                  st.sampled_from(["", "x", "1e3", " 7 ", "nan", "inf"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_cell, _cell, _cell, st.sampled_from(["", ",9"])), max_size=25),
       st.sampled_from([None, 1000]))
def test_rows_in_equals_accepted_plus_rejected(rows: list[tuple[str, str, str, str]],
                                               max_model_len: int | None) -> None:
    import tempfile

    text = "arrival,prompt_tokens,output_tokens\n" + "".join(
        f"{a},{p},{o}{extra}\n" for a, p, o, extra in rows)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.csv"
        path.write_text(text)
        rs = read_requests(path, max_model_len=max_model_len)
    _check_contract(rs)
    assert rs.rows_in == len(rows)
    assert sorted(rs.rejects["row"].to_pylist()) == sorted(set(rs.rejects["row"].to_pylist()))
    prompt = np.asarray(rs.table["prompt_tokens"].to_pylist())
    assert np.all(prompt > 0) and np.all(np.asarray(rs.table["output_tokens"].to_pylist()) > 0)
    if max_model_len is not None:
        output = np.asarray(rs.table["output_tokens"].to_pylist())
        assert np.all(prompt + output <= max_model_len)
