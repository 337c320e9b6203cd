"""What made an output: the key-value metadata every parquet or Arrow IPC file carries.

A *stamp* names the package and engine-behaviour versions, the scenario and pool, the sha256
of every input document, the pricing options, the trace source and the row counts. It is
stored as flat string keys under the ``blis.`` prefix (nested values as JSON), so DuckDB's
``parquet_kv_metadata()`` and pyarrow's ``schema.metadata`` both show it. :func:`read_stamp`
reads it back; :func:`check_scenario` refuses a scenario that contradicts it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.constants import ENGINE_BEHAVIOUR_COMMIT, ENGINE_BEHAVIOUR_VERSION
from pipeline.resources import data_dir

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from pipeline.load import Inputs

    from ..model.pricer import Pricer

PREFIX = "blis."
KINDS: tuple[str, ...] = ("priced", "rejects", "sweep-partition", "sweep-rejects",
                          "sweep-summary", "export")
# a serving replay's outputs (kernel/replay/output.py)
KINDS += ("replay-requests", "replay-steps", "replay-engine-steps", "replay-summary",
          "replay-rejects")
# a capacity sweep's outputs (kernel/replay/capacity.py)
KINDS += ("replay-capacity-curve", "replay-capacity-max-rate")


class StampError(ValueError):
    """A stamp contradicts what the caller said (e.g. ``--scenario``), or is malformed."""


@lru_cache(maxsize=1)
def package_version() -> str:

    try:
        return version("blis-kernel")
    except PackageNotFoundError:  # a checkout on sys.path without an install

        try:
            meta = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml")
                                 .read_text())
            return str(meta["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


@lru_cache(maxsize=1)
def source_commit() -> str:
    """The git commit of the package source when it is a checkout ("" otherwise)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


@lru_cache(maxsize=512)
def _file_sha256(path: str, _mtime_ns: int, _size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes (memoised while the file is unchanged)."""
    st = os.stat(path)
    return _file_sha256(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def _display_path(file: str) -> str:
    """An embedded document as ``<embedded>/catalog/…``; anything else as given."""

    try:
        return "<embedded>/" + Path(file).resolve().relative_to(data_dir().resolve()).as_posix()
    except (ValueError, OSError):
        return file


def _plain(x: Any) -> Any:
    """A document as JSON-able data with a stable order (sets sorted), for hashing."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, set | frozenset):
        return sorted((_plain(v) for v in x), key=repr)
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, str | int | float | bool) or x is None:
        return x
    return repr(x)


def content_sha256(doc: object) -> str:
    """sha256 of a document's value (for one built in memory, with no file)."""
    return hashlib.sha256(json.dumps(_plain(doc), sort_keys=True).encode()).hexdigest()


def document_digests(inputs: Inputs) -> dict[str, dict[str, str]]:
    """Role → {file, sha256} for every document a kernel is built from.

    A document read from a file is hashed as bytes; one built in memory (no file) is hashed
    as its value (documents are frozen dataclasses; see :func:`content_sha256`) and its file is ``<memory>``.
    """
    docs: dict[str, object] = {"scenario": inputs.scenario, "deployment": inputs.deployment,
                               "model": inputs.model, "chip": inputs.chip}
    if inputs.fabric is not None:
        docs["fabric"] = inputs.fabric
    if inputs.devices:
        docs["devices"] = inputs.devices
    for cset in inputs.coefficients:
        docs[f"coefficients:{cset.name}"] = cset
    out: dict[str, dict[str, str]] = {}
    for role, doc in docs.items():
        src = inputs.sources.get(role)
        if src is not None and src.file and os.path.isfile(src.file):
            out[role] = {"file": _display_path(src.file), "sha256": file_sha256(src.file)}
        else:
            out[role] = {"file": "<memory>", "sha256": content_sha256(doc)}
    out["rules"] = {"file": f"<rules pack {inputs.rules.version}>",
                    "sha256": content_sha256(inputs.rules)}
    return out


@dataclass(frozen=True)
class Stamp:
    """The provenance of one output file. ``from_metadata(s.to_metadata()) == s``."""

    kind: str
    scenario: str | None = None
    pool: int | None = None
    documents: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    trace: Mapping[str, Any] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)
    scenarios: tuple[str, ...] = ()  # a sweep summary or a SQL export may span several
    package_version: str = field(default_factory=package_version)
    engine_behaviour_version: str = ""
    engine_behaviour_commit: str = ""
    source_commit: str = field(default_factory=source_commit)
    command: tuple[str, ...] = ()  # the command line that wrote the file (the CLI's only addition)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise StampError(f"stamp kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.engine_behaviour_version:
            object.__setattr__(self, "engine_behaviour_version", ENGINE_BEHAVIOUR_VERSION)
            object.__setattr__(self, "engine_behaviour_commit", ENGINE_BEHAVIOUR_COMMIT)

    def to_metadata(self) -> dict[str, str]:
        """Flat ``blis.*`` string keys, ready for parquet/IPC key-value metadata."""
        md = {
            "kind": self.kind,
            "package_version": self.package_version,
            "engine_behaviour_version": self.engine_behaviour_version,
            "engine_behaviour_commit": self.engine_behaviour_commit,
            "source_commit": self.source_commit,
            "scenario": self.scenario or "",
            "pool": "" if self.pool is None else str(self.pool),
            "scenarios": json.dumps(list(self.scenarios)),
            "documents": json.dumps(self.documents, sort_keys=True),
            "options": json.dumps(self.options, sort_keys=True),
            "trace": json.dumps(self.trace, sort_keys=True),
            "counts": json.dumps(self.counts, sort_keys=True),
        }
        if self.command:
            md["command"] = json.dumps(list(self.command))
        return {PREFIX + k: v for k, v in md.items()}

    @classmethod
    def from_metadata(cls, metadata: Mapping[bytes, bytes] | Mapping[str, str] | None
                      ) -> Stamp | None:
        """The stamp in a file's key-value metadata, or None when it has none."""
        if not metadata:
            return None
        md = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
                                                           else v)
              for k, v in metadata.items()}
        if PREFIX + "kind" not in md:
            return None

        def get(key: str) -> str:
            return md.get(PREFIX + key, "")

        def js(key: str, default: Any) -> Any:
            raw = get(key)
            try:
                return json.loads(raw) if raw else default
            except json.JSONDecodeError as exc:
                raise StampError(f"metadata key {PREFIX}{key} is not JSON: {exc}") from None

        pool = get("pool")
        return cls(kind=get("kind"), scenario=get("scenario") or None,
                   pool=int(pool) if pool else None, documents=js("documents", {}),
                   options=js("options", {}), trace=js("trace", {}), counts=js("counts", {}),
                   scenarios=tuple(js("scenarios", [])), package_version=get("package_version"),
                   engine_behaviour_version=get("engine_behaviour_version"),
                   engine_behaviour_commit=get("engine_behaviour_commit"),
                   source_commit=get("source_commit"), command=tuple(js("command", [])))

    def as_kind(self, kind: str) -> Stamp:
        """The same stamp for a sibling output (the rejects beside a priced file)."""

        return replace(self, kind=kind)

    def with_command(self, argv: Sequence[str]) -> Stamp:
        """The same stamp with the command line that wrote the file (what the CLI adds)."""

        return replace(self, command=tuple(str(a) for a in argv))

    def with_counts(self, **counts: int) -> Stamp:

        return replace(self, counts={**self.counts, **counts})

    def lines(self) -> list[str]:
        """A short human-readable account (for the CLI and ``_repr_html_``)."""
        out = [f"{self.kind} by blis-kernel {self.package_version} (vLLM "
               f"{self.engine_behaviour_version})"]
        if self.scenario:
            out.append(f"scenario {self.scenario} pool {self.pool}")
        elif self.scenarios:
            out.append(f"scenarios {', '.join(self.scenarios)}")
        if self.options:
            out.append("options " + ", ".join(f"{k}={v}" for k, v in self.options.items()))
        if self.trace.get("source"):
            out.append(f"trace {self.trace['source']}")
        if self.counts:
            out.append("counts " + ", ".join(f"{k}={v:,}" for k, v in self.counts.items()))
        return out


def trace_identity(trace: object) -> dict[str, Any]:
    """How a trace is named in a stamp: a path (with its size) or the in-memory type."""
    if isinstance(trace, str | os.PathLike):
        p = Path(trace)
        ident: dict[str, Any] = {"source": str(trace)}
        if p.is_file():
            ident["bytes"] = p.stat().st_size
        return ident
    return {"source": f"<{type(trace).__module__}.{type(trace).__qualname__}>"}


def for_kernel(k: Pricer, kind: str = "priced", *, trace: object = None,
               decode_threshold: int | None = None, sm_budget: int | None = None,
               calibration: str | None = None, **extra_options: Any) -> Stamp:
    """The stamp of an output priced by ``k``."""
    options: dict[str, Any] = {}
    if decode_threshold is not None:
        options["decode_threshold"] = int(decode_threshold)
    if sm_budget is not None:
        options["sm_budget"] = int(sm_budget)
    cal = getattr(k, "calibration", None)
    if calibration:
        options["calibration"] = calibration
    elif cal is not None:  # the digest of the calibration document the kernel applies
        options["calibration"] = hashlib.sha256(cal.to_yaml().encode()).hexdigest()
        options["calibration_name"] = cal.name
    options.update({k: v for k, v in extra_options.items() if v not in (None, {}, [], ())})
    r = k.resolved_pool
    return Stamp(kind=kind, scenario=r.scenario, pool=r.pool_index, documents=k.documents(),
                 options=options, trace=trace_identity(trace) if trace is not None else {})


def for_pricing(k: Pricer, trace: object, *, decode_threshold: int = 1, sm_budget: int = 0,
                columns: Mapping[str, str] | None = None, batches: object = None,
                measured: str | None = None, measured_unit: str = "ns",
                **extra_options: Any) -> Stamp:
    """The stamp of a priced trace: the one :func:`kernel.bulk.price_file` writes by default
    and the CLI writes (the CLI adds only its command line, under ``blis.command``)."""
    return for_kernel(k, trace=trace, decode_threshold=decode_threshold, sm_budget=sm_budget,
                      columns=dict(columns) if columns else None,
                      batches=trace_identity(batches) if batches is not None else None,
                      measured=measured, measured_unit=measured_unit if measured else None,
                      **extra_options)


def counts_metadata(**counts: int) -> dict[str, str]:
    """The ``counts`` key alone (a writer adds it when it closes, once the counts are known)."""
    return {PREFIX + "counts": json.dumps({k: int(v) for k, v in counts.items()},
                                          sort_keys=True)}


def stamped(table: pa.Table, stamp: Stamp | None) -> pa.Table:
    """``table`` with the stamp merged into its schema metadata (unchanged for None)."""
    if stamp is None:
        return table
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          **stamp.to_metadata()})


def for_database(con: duckdb.DuckDBPyConnection, kind: str = "export",
                 scenarios: Sequence[str] | None = None, pool: int | None = None) -> Stamp:
    """The stamp of rows read from a resolution database: its scenarios and every document it
    holds (files hashed as bytes where they still exist, else the stored content digest)."""
    if scenarios is None:
        scenarios = [str(r[0]) for r in con.execute(
            "SELECT scenario FROM scenarios ORDER BY scenario").fetchall()]
    docs: dict[str, dict[str, str]] = {}
    for kind_, name, digest, file in con.execute(
            "SELECT kind, name, digest, file FROM loaded_documents ORDER BY kind, name"
    ).fetchall():
        if file and os.path.isfile(file):
            docs[f"{kind_}:{name}"] = {"file": _display_path(file), "sha256": file_sha256(file)}
        else:
            docs[f"{kind_}:{name}"] = {"file": str(file), "content_sha256": str(digest)}
    one = scenarios[0] if len(scenarios) == 1 else None
    return Stamp(kind=kind, scenario=one, pool=pool if one else None,
                 scenarios=tuple(scenarios), documents=docs)


def read_stamp(path: str | os.PathLike[str]) -> Stamp | None:
    """The stamp of a parquet or Arrow IPC file (by suffix), or None when it has none."""
    import pyarrow as pa  # (heavy: Arrow, loaded only on this path)
    import pyarrow.parquet as pq  # (heavy: Arrow, loaded only on this path)

    p = Path(path)
    if p.suffix.lower() in (".arrow", ".ipc", ".feather"):
        with pa.memory_map(str(p)) as mm:
            schema = pa.ipc.open_file(mm).schema
        return Stamp.from_metadata(schema.metadata)
    if p.suffix.lower() == ".csv":
        return None
    # The footer's key-value metadata, not the embedded Arrow schema's: a writer may add
    # keys (the row counts) when it closes, after the schema was fixed.
    return Stamp.from_metadata(pq.ParquetFile(p).metadata.metadata)


def check_kernel(stamp: Stamp | None, k: Pricer, what: str = "the file") -> list[str]:
    """Refuse a kernel whose scenario or pool contradicts the stamp (:class:`StampError`);
    return notes on documents whose content changed since the file was written."""
    if stamp is None or not stamp.scenario:
        return []
    r = k.resolved_pool
    if (r.scenario, r.pool_index) != (stamp.scenario, stamp.pool if stamp.pool is not None
                                      else r.pool_index):
        raise StampError(f"{what} was priced on scenario {stamp.scenario!r} pool {stamp.pool}, "
                         f"not {r.scenario!r} pool {r.pool_index}; leave the scenario out to "
                         "use the file's own")
    now = k.documents()
    return [f"{role}: {doc.get('file', '?')} changed since {what} was written (sha256 "
            f"{doc.get('sha256', '')[:12]} then, {now[role]['sha256'][:12]} now)"
            for role, doc in stamp.documents.items()
            if role in now and now[role].get("sha256") != doc.get("sha256")]
