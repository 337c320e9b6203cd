"""Stamps round-trip and report/compare obey them; the notebook surface; --format on the
printing commands (issue 14, items 1 and 4)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.cli import cli
from kernel.io import stamp
from kernel.io.synth import write_synth

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"
LLAMA = "llama-3.1-8b-h100-tp1"


@pytest.fixture(scope="module")
def ds3() -> kernel.Kernel:
    return kernel.open(DS3)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.parquet"
    write_synth(path, 400, seed=3)
    return path


def _write_priced(k: kernel.Kernel, trace: Path, out: Path) -> stamp.Stamp:
    priced = k.price(trace)
    s = stamp.for_kernel(k, trace=trace, decode_threshold=1, sm_budget=0).with_counts(
        batches_priced=priced.height)
    pq.write_table(stamp.stamped(priced.to_arrow(), s), out)
    return s


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)


@pytest.mark.parametrize("threshold", [1, 2])
def test_python_price_file_writes_the_cli_stamp_minus_the_command_line(
        trace: Path, tmp_path: Path, threshold: int) -> None:
    # issue 30 item 2 (LF3): stamping lives in the library writer; the CLI adds its argv only
    bad = tmp_path / "t.csv"
    bad.write_text("batch_id,scheduled,computed,prompt_len\n1,1,5,5\n2,-1,0,1\n")
    for i, src in enumerate((trace, bad)):
        cli_out, py_out = tmp_path / f"cli-{i}.parquet", tmp_path / f"py-{i}.parquet"
        args = ["price", str(src), "--scenario", DS3, "-o", str(cli_out), "--no-progress",
                "--decode-threshold", str(threshold)]
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
        kernel.price_file(kernel.open(DS3), str(src), py_out, progress=False,
                          decode_threshold=threshold,
                          rejects=py_out.with_name(py_out.stem + ".rejects.parquet"))
        by_cli, by_py = kernel.read_priced(cli_out), kernel.read_priced(py_out)
        assert by_py.stamp is not None and by_cli.stamp is not None
        assert by_py.stamp.command == () and by_cli.stamp.command[1:3] == ("price", str(src))
        assert by_py.stamp == by_cli.stamp.with_command(())
        assert by_py.frame.equals(by_cli.frame)
        rej_cli = cli_out.with_name(cli_out.stem + ".rejects.parquet")
        rej_py = stamp.read_stamp(py_out.with_name(py_out.stem + ".rejects.parquet"))
        assert rej_py is not None and rej_py.kind == "rejects"
        assert rej_cli.exists() == (src == bad)  # the CLI drops an empty rejects file
        if rej_cli.exists():
            assert rej_py == stamp.read_stamp(rej_cli).with_command(())  # type: ignore[union-attr]
    # a caller's own metadata replaces the default stamp
    own = tmp_path / "own.parquet"
    kernel.price_file(kernel.open(DS3), trace, own, progress=False, metadata={"who": "me"})
    assert kernel.read_priced(own).stamp is None


@settings(max_examples=50, deadline=None)
@given(kind=st.sampled_from(stamp.KINDS), scenario=st.none() | names.filter(bool),
       pool=st.none() | st.integers(0, 64),
       docs=st.dictionaries(names, st.fixed_dictionaries({"file": names, "sha256": names}),
                            max_size=4),
       options=st.dictionaries(names, st.integers() | names | st.booleans(), max_size=4),
       counts=st.dictionaries(names, st.integers(0, 2**62), max_size=4),
       command=st.lists(names, max_size=4).map(tuple))
def test_stamp_round_trips_through_metadata(kind, scenario, pool, docs, options, counts,
                                            command):
    s = stamp.Stamp(kind=kind, scenario=scenario, pool=pool, documents=docs, options=options,
                    counts=counts, scenarios=(scenario,) if scenario else (), command=command)
    md = s.to_metadata()
    assert all(k.startswith(stamp.PREFIX) and isinstance(v, str) for k, v in md.items())
    assert stamp.Stamp.from_metadata({k.encode(): v.encode() for k, v in md.items()}) == s


def test_stamped_parquet_and_ipc_round_trip(ds3: kernel.Kernel, trace: Path,
                                            tmp_path: Path) -> None:
    out = tmp_path / "p.parquet"
    s = _write_priced(ds3, trace, out)
    back = kernel.read_priced(out)
    assert back.stamp == s and back.scenario == DS3
    assert back.stamp.documents == ds3.documents()
    assert set(back.stamp.documents) >= {"scenario", "model", "chip", "rules"}
    assert back.stamp.trace["source"] == str(trace)
    assert back.stamp.options == {"decode_threshold": 1, "sm_budget": 0}
    assert back.frame.schema["bottleneck"] == pl.Enum(["sm", "hbm", "nvlink", "nic", "host"])
    ipc = tmp_path / "p.arrow"
    with pa.ipc.new_file(ipc, pq.read_schema(out)) as w:
        w.write_table(pq.read_table(out))
    assert stamp.read_stamp(ipc) == s
    assert "priced" in back._repr_html_() and DS3 in back._repr_html_()


def test_document_digest_is_the_file_sha256(ds3: kernel.Kernel) -> None:
    import hashlib

    from pipeline.resources import data_dir

    chip = ds3.documents()["chip"]
    assert chip["file"] == "<embedded>/catalog/hardware/h200.yaml"
    raw = (data_dir() / "catalog/hardware/h200.yaml").read_bytes()
    assert chip["sha256"] == hashlib.sha256(raw).hexdigest()


def test_report_takes_the_scenario_from_the_stamp_and_refuses_another(
        ds3: kernel.Kernel, trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.parquet"
    _write_priced(ds3, trace, out)
    runner = CliRunner()
    ok = runner.invoke(cli, ["report", str(out), "-o", str(tmp_path / "r.html")])
    assert ok.exit_code == 0, ok.output
    page = (tmp_path / "r.html").read_text()
    assert "provenance" in page and DS3 in ok.output
    bad = runner.invoke(cli, ["report", str(out), "--scenario", LLAMA,
                              "-o", str(tmp_path / "bad.html")])
    assert bad.exit_code == 1
    assert f"priced on scenario '{DS3}'" in bad.output and LLAMA in bad.output
    assert not (tmp_path / "bad.html").exists()
    same = runner.invoke(cli, ["report", str(out), "--scenario", DS3,
                               "-o", str(tmp_path / "same.png")])
    assert same.exit_code == 0, same.output


def test_compare_reads_priced_files_and_refuses_a_contradiction(
        ds3: kernel.Kernel, trace: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    _write_priced(ds3, trace, a)
    _write_priced(kernel.open(LLAMA), trace, b)
    runner = CliRunner()
    res = runner.invoke(cli, ["compare", str(a), str(b), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["scenario"] for r in rows] == [DS3, LLAMA]
    direct = json.loads(runner.invoke(cli, ["compare", str(trace), "--scenario", DS3,
                                            "--scenario", LLAMA, "--format", "json"]).stdout)
    assert rows == direct  # the files price exactly what pricing the trace gives
    bad = runner.invoke(cli, ["compare", str(a), str(b), "--scenario", LLAMA,
                              "--scenario", DS3])
    assert bad.exit_code == 1 and "priced on scenario" in bad.output
    raw = runner.invoke(cli, ["compare", str(trace)])
    assert raw.exit_code == 2 and "--scenario" in raw.output


def test_notebook_surface(ds3: kernel.Kernel) -> None:
    html = ds3._repr_html_()
    assert DS3 in html and "h200" in html and "<table" in html
    est = ds3.step_time(kernel.Batch([kernel.Request(1, 4095)] * 8))
    assert "NoOverlap" in est._repr_html_() and str(est.bottleneck) in est._repr_html_()
    prov = ds3.provenance_frame()
    assert prov.height == len(ds3.provenance())
    assert prov["name"].to_list() == [o.name for o in ds3.provenance()]
    assert prov.schema["value"] == pl.Float64 and isinstance(prov.schema["method"], pl.Enum)
    assert prov.schema["scope_values"] == pl.List(pl.String)
    res = ds3.resolved_frame()
    assert res.height == 1 and res["tp"].item() == ds3.resolved_pool.layout.tp
    con = kernel.connect([DS3])
    assert con.sql("SELECT count(*) FROM provenance").fetchall() == [(prov.height,)]
    con.close()
    assert (Path(kernel.__file__).parent / "py.typed").is_file()


def test_format_json_and_csv_on_the_printing_commands(trace: Path) -> None:
    runner = CliRunner()
    step = runner.invoke(cli, ["step", "-s", DS3, "--batch", "32x1@4095", "--format", "json"])
    assert step.exit_code == 0, step.output
    (row,) = json.loads(step.stdout)
    k = kernel.open(DS3)
    est = k.step_time(kernel.Batch([kernel.Request(1, 4095)] * 32))
    assert (row["overlap_ns"], row["no_overlap_ns"], row["bottleneck"]) == (
        est.overlap, est.no_overlap, str(est.bottleneck))
    mem = runner.invoke(cli, ["memory", "-s", DS3, "--format", "csv"])
    assert mem.exit_code == 0
    header, values = mem.stdout.splitlines()
    assert dict(zip(header.split(","), values.split(","), strict=True))['"fixed_total"'] == \
        str(k.fixed_bytes().total())
    val = runner.invoke(cli, ["validate", DS3, "--format", "json"])
    assert val.exit_code == 0 and json.loads(val.stdout)[0]["errors"] == 0


def test_a_piped_table_never_truncates_the_key_column(trace: Path) -> None:
    long = "deepseek-v4-pro-b300-fp4-vllm-tp4-ep4-mtp-cfg1"
    res = CliRunner().invoke(cli, ["compare", str(trace), "--scenario", DS3, "--scenario",
                                   long], terminal_width=60)
    assert res.exit_code == 0, res.output
    assert any(long in line for line in res.stdout.splitlines() if "│" in line)


def test_price_cli_stamps_priced_and_rejects_with_the_run_counts(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("batch_id,scheduled,computed,prompt_len\n1,1,5,5\n1,1,7,7\n2,-1,0,1\n"
                   "3,4,0,4\n")
    out = tmp_path / "p.parquet"
    res = CliRunner().invoke(cli, ["price", str(bad), "--scenario", DS3, "-o", str(out),
                                   "--decode-threshold", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    priced = kernel.read_priced(out)
    assert priced.stamp is not None and priced.stamp.kind == "priced"
    assert (priced.stamp.scenario, priced.stamp.pool) == (DS3, 0)
    assert priced.stamp.options["decode_threshold"] == 2
    assert priced.stamp.trace["source"] == str(bad)
    assert priced.stamp.counts == {"rows_in": 4, "rows_priced": 3, "rows_rejected": 1,
                                   "batches_priced": 2, "batch_table_rows_rejected": 0}
    assert priced.stamp.documents == kernel.open(DS3).documents()
    assert priced.frame.height == 2
    rej = stamp.read_stamp(tmp_path / "p.rejects.parquet")
    assert rej is not None and rej.kind == "rejects" and rej.counts == priced.stamp.counts


def test_progress_shows_in_a_notebook(trace: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    import rich.console

    shown: list[str] = []

    class Handle:
        def update(self, obj: object) -> None:
            shown.append(str(obj))

    display_mod = types.ModuleType("IPython.display")
    display_mod.HTML = lambda s: s  # type: ignore[attr-defined]

    def display(obj: object, display_id: bool = False) -> Handle:
        shown.append(str(obj))
        return Handle()

    display_mod.display = display  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", types.ModuleType("IPython"))
    monkeypatch.setitem(sys.modules, "IPython.display", display_mod)
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    counts = kernel.price_file(kernel.open(DS3), trace, tmp_path / "p.parquet",
                               progress=True)
    assert len(shown) >= 2 and "<progress" in shown[-1]
    assert f"{counts.rows_in:,} rows" in shown[-1]


def test_priced_result_renders_in_a_notebook(ds3: kernel.Kernel) -> None:
    from kernel.bulk import price_result

    res = price_result(ds3, pl.DataFrame({"batch_id": [1, 1, 2], "scheduled": [1, 1, -1],
                                          "computed": [9, 9, 0], "prompt_len": [9, 9, 1]}),
                       on_reject="ignore")
    html = res._repr_html_()
    assert "in 3 = priced 2 + rejected 1" in html and "1 row(s) in .rejects" in html
    assert "p99" in html and "<table" in html


def test_a_calibrated_kernel_stamps_its_calibration_digest(trace: Path, tmp_path: Path
                                                           ) -> None:
    import hashlib

    from tests.test_calibration import TRUE, _doc

    base = kernel.open(LLAMA)
    r = base.resolved_pool
    kc = base.with_calibration(_doc(r.model_name, r.chip_name, TRUE), force=True)
    assert "calibration" not in stamp.for_kernel(base).options
    opts = stamp.for_kernel(kc).options
    assert opts["calibration"] == hashlib.sha256(kc.calibration.to_yaml().encode()).hexdigest()
    out = tmp_path / "c.parquet"
    kernel.price_file(kc, trace, out, progress=False,
                      metadata=stamp.for_kernel(kc, trace=trace).to_metadata())
    assert kernel.read_priced(out).stamp.options["calibration"] == opts["calibration"]
    prov = kc.provenance_frame()
    assert prov["name"].to_list() == [o.name for o in kc.provenance()]
    assert prov.filter(pl.col("kind") == "calibration")["method"].unique().to_list() == \
        ["fitted"]


def test_trace_arguments_are_typed_by_protocol() -> None:
    import inspect

    import duckdb

    from kernel.bulk import price, price_file, price_result
    from kernel.io.protocols import ArrowStreamExportable

    for fn in (kernel.Kernel.price, price, price_result, price_file):
        params = list(inspect.signature(fn).parameters.values())
        assert params[1].annotation == "TraceInput", fn
    con = duckdb.connect()
    for producer in (pa.table({"a": [1]}), pl.DataFrame({"a": [1]}), con.sql("SELECT 1 AS a")):
        assert isinstance(producer, ArrowStreamExportable)
    assert not isinstance([1, 2], ArrowStreamExportable)
    con.close()
