"""The document tables are derived from the document dataclasses: one definition of a schema.

Adding a field to a document class is the only edit a new column needs (checked by editing a
copy of ``pipeline/documents.py`` and nothing else), and every field of every document kind is
a column, rows of a child table, or says why no table holds it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
import typing
from dataclasses import field, make_dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline import arrow_schema as sch
from pipeline import documents as docs
from pipeline import normalise as nz
from pipeline.decode import type_hints, type_shape

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT_KINDS = (docs.Scenario, docs.Deployment, docs.Graph, docs.Chip, docs.Fabric,
                  docs.StorageDevice, docs.CoefficientSet)


def _records(tp: object) -> list[type]:
    """The dataclasses a field type holds (itself, its ``| None``, its tuple items)."""
    origin, args = type_shape(tp)
    if dataclasses.is_dataclass(tp):
        return [typing.cast(type, tp)]
    if origin is not None:
        return [r for a in args if a is not Ellipsis for r in _records(a)]
    return []


def _sources() -> dict[str, list[tuple[str, str]]]:
    """``Class.field`` → [(table, column)] over every document table."""
    out: dict[str, list[tuple[str, str]]] = {}
    for table, parts in nz.TABLES.items():
        for col in sch.part_columns(parts)[0]:
            out.setdefault(col.source, []).append((table, col.name))
    return out


def _audit(kinds: tuple[type, ...]) -> tuple[list[str], set[str], set[str]]:
    """Walk every field a table can reach from the document kinds: (problems, fields that are
    columns or rows, fields declared as held another way or not at all)."""
    sources = _sources()
    row_records = {p.cls for parts in nz.TABLES.values() for p in parts
                   if isinstance(p, sch.Fields)}
    items = {(p.cls, p.field) for parts in nz.TABLES.values() for p in parts
             if isinstance(p, sch.Item)}
    problems: list[str] = []
    tabled: set[str] = set()
    declared: set[str] = set()
    seen: set[type] = set()
    todo = list(kinds)
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for f in dataclasses.fields(cls):
            name, meta = f"{cls.__name__}.{f.name}", f.metadata.get("table", {})
            inner = _records(type_hints(cls)[f.name])
            if meta.get("skip"):
                declared.add(name)
                if not isinstance(meta["skip"], str) or len(meta["skip"]) < 10:
                    problems.append(f"{name}: skip needs a reason")
            elif meta.get("rows"):
                tabled.add(name)
                if meta["rows"] not in nz.TABLES:
                    problems.append(f"{name}: rows of {meta['rows']!r}, not a table")
                if meta.get("item") and (cls, f.name) not in items:
                    problems.append(f"{name}: no table holds its items")
                if inner and inner[0] in row_records:
                    todo.extend(inner)  # a child table's rows: its fields are columns
                elif inner:
                    declared.add(name)  # e.g. Stack, expanded into graph_stack by normalise
            elif inner and not (meta.get("present") or meta.get("as_json")):
                todo.extend(inner)  # a nested record, flattened into this row
            elif name in sources:
                tabled.add(name)
            else:
                problems.append(f"{name}: no column, no rows, no reason")
    return problems, tabled, declared


def test_every_field_of_every_document_kind_is_a_column_or_rows_or_says_why() -> None:
    problems, tabled, declared = _audit(DOCUMENT_KINDS)
    assert not problems, problems
    assert {"Engine.block_size", "EPLB.window_size", "Node.n", "Chip.tflops_peak",
            "Scope.hardware", "Deployment.pools"} <= tabled
    assert {"Binding.trace", "LayerKind.edges", "Graph.stack"} <= declared


def test_the_audit_finds_a_field_with_no_column() -> None:
    """The audit can fail: a kind whose field no table holds is reported."""
    Orphan = make_dataclass("Orphan", [("lost", int, field(default=0))], frozen=True)
    problems, _t, _d = _audit((Orphan,))
    assert problems == ["Orphan.lost: no column, no rows, no reason"]


def test_every_column_of_a_document_table_is_a_field_or_a_declared_key() -> None:
    _problems, tabled, _declared = _audit(DOCUMENT_KINDS)
    for table, parts in nz.TABLES.items():
        cols, _roles = sch.part_columns(parts)
        keys = [p.name for p in parts if isinstance(p, sch.Key)]
        for col in cols:
            assert col.source in tabled | {"Scope.describe()", "key"}, (table, col)
            assert (col.source == "key") == (col.name in keys), (table, col)
        assert [f.name for f in nz.SCHEMAS[table]] == [c.name for c in cols]


def test_types_follow_the_type_hints() -> None:
    hints = type_hints(docs.Engine)
    assert sch.arrow_type(hints["block_size"]) == pa.int64()
    assert sch.arrow_type(hints["gpu_memory_utilization"]) == pa.float64()
    assert sch.arrow_type(hints["async_scheduling"]) == pa.bool_()  # bool | None
    assert sch.arrow_type(hints["cudagraph_capture_sizes"]) == pa.list_(pa.int64())
    assert sch.arrow_type(type_hints(docs.Scope)["model"]) == pa.list_(pa.string())
    with pytest.raises(TypeError, match="column"):
        sch.arrow_type(dict[str, int])


def test_a_subclass_with_one_more_field_has_one_more_column() -> None:
    Engine2 = make_dataclass("Engine2", [("new_knob", int | None, field(default=None))],
                             bases=(docs.Engine,), frozen=True)
    parts = (sch.Key("pool", pa.int64()), sch.Fields(Engine2))
    base = sch.schema((sch.Key("pool", pa.int64()), sch.Fields(docs.Engine)))
    grown = sch.schema(parts)
    assert grown.names == [*base.names, "new_knob"]
    assert grown.field("new_knob").type == pa.int64()
    t = sch.table(parts, [{"pool": 0, "Engine2": Engine2(new_knob=3, eplb=docs.EPLB(
        enable_eplb=True, window_size=5))}, {"pool": 1, "Engine2": Engine2()}])
    assert t.column("new_knob").to_pylist() == [3, None]
    assert t.column("eplb_window_size").to_pylist() == [5, 0]  # absent: the default
    assert t.column("dbo_enable").to_pylist() == [None, None]  # absent: declared None


def test_a_column_derived_twice_is_an_error() -> None:
    Twice = make_dataclass("Twice", [("tp", int, field(default=0))],
                           bases=(docs.Parallelism,), frozen=True)
    Holder = make_dataclass("Holder", [("a", docs.Parallelism, field(default=None)),
                                       ("b", Twice, field(default=None))], frozen=True)
    with pytest.raises(TypeError, match=r"\['dcp', 'dp'"):
        sch.schema((sch.Fields(Holder),))


_EDITS = {  # class → (the last line of its body, the one line added after it)
    "Engine": ("    cp_kv_cache_interleave_size: int = 0\n", "    new_knob: int = 0\n"),
    "Chip": ('    intra_rack_bw_gbps: float = field(default=0.0, metadata=key("IntraRackBwGBps"))\n',
             '    hbm_generation: str = ""\n'),
}

_PROBE = textwrap.dedent("""
    import dataclasses, json
    from kernel.pool import sql_laws  # noqa: F401
    from pipeline import db, normalise as nz
    from pipeline.decode import decode
    from pipeline.documents import Chip, Engine
    from pipeline.load import open_inputs
    from pipeline.yamlio import read_documents
    tree = read_documents("x.yaml", "new_knob: 3\\nblock_size: 16\\n")[0]
    engine, _ = decode(Engine, tree, "x.yaml")
    inputs = open_inputs("llama-3.1-8b-h100-tp1")
    pool = dataclasses.replace(inputs.deployment.pools[0], engine=engine)
    dep = dataclasses.replace(inputs.deployment, pools=(pool,))
    chip = dataclasses.replace(inputs.chip, hbm_generation="HBM3")
    inputs = dataclasses.replace(inputs, deployment=dep, chip=chip)
    con = db.open_db(apply=False)
    db.register(con, inputs)
    db.apply_views(con)
    print(json.dumps({
        "schema": [nz.SCHEMAS["pools"].field("new_knob").type.__str__(),
                   nz.SCHEMAS["chips"].field("hbm_generation").type.__str__()],
        "pools": con.execute("SELECT new_knob, block_size FROM pools").fetchall(),
        "chips": con.execute("SELECT hbm_generation FROM chips").fetchall(),
        "resolved": con.execute("SELECT count(*) FROM resolved_pools").fetchall(),
    }))
""")


def test_adding_a_field_to_a_document_class_is_the_only_edit_a_new_column_needs(
        tmp_path: Path) -> None:
    """Copy pipeline/, add one line to two classes of documents.py, and nothing else: YAML
    decodes the key, the Arrow schema and the DuckDB table carry the column, the views run."""
    shutil.copytree(ROOT / "pipeline", tmp_path / "pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("kernel", "sql", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    path = tmp_path / "pipeline" / "documents.py"
    text = path.read_text()
    for cls, (anchor, line) in _EDITS.items():
        head, sep, tail = text.partition(f"class {cls}:")
        assert sep and tail.count(anchor) >= 1, f"{cls}: the anchor line moved"
        text = head + sep + tail.replace(anchor, anchor + line, 1)
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", _PROBE], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    import json
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"schema": ["int64", "string"], "pools": [[3, 16]],
                   "chips": [["HBM3"]], "resolved": [[1]]}
    # The same probe against the unedited package fails: the column is really new.
    plain = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and "new_knob" in plain.stderr
