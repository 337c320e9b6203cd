"""``blis-kernel step`` and ``blis-kernel memory``: price one batch, size one rank.

* ``step SCENARIO --batch SPEC [--pool i] [--decode-threshold N] [--sm-budget N]``: SPEC is
  comma-separated groups ``COUNTxSCHEDULED@COMPUTED`` (``32x1@4095,1x512@0``; ``COUNTx`` may
  be omitted for one request), or a path to a JSON/YAML file holding a list of
  ``{scheduled, computed, prompt_len?}``. Prints Overlap and NoOverlap (µs and ns), the
  per-resource breakdown, the bottleneck and, per layer kind, the term that set its stage.
* ``memory SCENARIO [--pool i]``: the FixedBytes breakdown, PreSnapshotBytes, per-request
  bytes at a few lengths and the KV capacity.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from kernel.cli.common import make_repos, with_repos
from kernel.cli.output import TEXT_FORMATS, emit_rows, format_options, resolve_format

from .dialect import DialectCommand, complete_scenario

if TYPE_CHECKING:
    from kernel.facade.kernel import Kernel
    from kernel.model.types import Request

GIB = 2**30
MIB = 2**20
_GROUP = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?(\d+)\s*@\s*(\d+)\s*$")


# A batch spec names at most this many requests (vLLM's max_num_seqs is far below it).
MAX_SPEC_REQUESTS = 1 << 20
INT64_MAX = 2**63 - 1


def _count(text: str, what: str, where: str) -> int:
    value = int(text)
    if value > INT64_MAX:
        raise click.BadParameter(f"{where}: {what} {text} is beyond 2^63-1; a token count is "
                                 "a non-negative int64", param_hint="--batch")
    return value


def _field(item: dict[str, Any], key: str, i: int, spec: str) -> int:
    value = item.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise click.BadParameter(f"{spec}: entry {i}: {key} must be a non-negative integer, "
                                 f"got {value!r}", param_hint="--batch")
    text = str(value).strip()
    if not text.isdigit():
        raise click.BadParameter(f"{spec}: entry {i}: {key} must be a non-negative integer, "
                                 f"got {value!r}", param_hint="--batch")
    return _count(text, key, f"{spec}: entry {i}")


def _read_batch_file(path: Path, spec: str) -> Any:
    from pipeline.errors import DocumentError
    from pipeline.yamlio import read_documents, to_plain

    if path.suffix.lower() == ".json":
        try:
            return json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            raise click.BadParameter(f"{spec}: not UTF-8 text; a batch file is JSON or YAML",
                                     param_hint="--batch") from None
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{spec}: not valid JSON at line {exc.lineno} column "
                                     f"{exc.colno}: {exc.msg}", param_hint="--batch") from None
    try:  # the documents' reader: alias and depth limits, UTF-8, one-line problems
        docs = read_documents(path)
    except DocumentError as exc:
        raise click.BadParameter(str(exc.problems[0]).removeprefix("error: "),
                                 param_hint="--batch") from None
    return to_plain(docs[0])


def parse_batch_spec(spec: str) -> list[Request]:
    """``COUNTxSCHEDULED@COMPUTED[,…]`` or a JSON/YAML file → requests, in order."""
    from kernel.model.types import Request

    path = Path(spec)
    if path.suffix.lower() in (".json", ".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise click.BadParameter(f"no such batch file: {spec}")
        data = _read_batch_file(path, spec)
        if isinstance(data, dict) and "requests" in data:
            data = data["requests"]
        if not isinstance(data, list):
            raise click.BadParameter(f"{spec}: a batch file holds a list of "
                                     "{scheduled, computed}", param_hint="--batch")
        if len(data) > MAX_SPEC_REQUESTS:
            raise click.BadParameter(f"{spec}: {len(data):,} requests; at most "
                                     f"{MAX_SPEC_REQUESTS:,}", param_hint="--batch")
        out = []
        for i, item in enumerate(data):
            if not isinstance(item, dict) or "scheduled" not in item or "computed" not in item:
                raise click.BadParameter(f"{spec}: entry {i} needs scheduled and computed",
                                         param_hint="--batch")
            out.append(Request(*(_field(item, key, i, spec) for key in
                                 ("scheduled", "computed", "prompt_len", "cached_tokens"))))
        return out
    out = []
    for group in spec.split(","):
        if not group.strip():
            continue
        m = _GROUP.match(group)
        if m is None:
            raise click.BadParameter(
                f"{group!r} is not COUNTxSCHEDULED@COMPUTED (e.g. 32x1@4095)")
        count = _count(m.group(1), "COUNT", group) if m.group(1) else 1
        if len(out) + count > MAX_SPEC_REQUESTS:
            raise click.BadParameter(f"{spec[:80]}: more than {MAX_SPEC_REQUESTS:,} requests",
                                     param_hint="--batch")
        out.extend([Request(_count(m.group(2), "SCHEDULED", group),
                            _count(m.group(3), "COMPUTED", group))] * count)
    return out


def _open(scenario: str, pool: int, repos: Any) -> Kernel:
    import kernel

    if pool == 0:
        return kernel.open(scenario, repos)
    return kernel.open_pool(scenario, repos, pool)


def _us(ns: int) -> str:
    return f"{ns / 1000:,.3f}"


def memory_row(k: Kernel, pool: int) -> dict[str, Any]:
    """Everything ``memory`` prints, as one flat row of integers (bytes) and floats."""
    fb, cap = k.fixed_bytes(), k.kv_capacity()
    return {
        "scenario": k.resolved_pool.scenario, "pool": pool, "weights": fb.weights,
        "activation_peak": fb.activation_peak, "cuda_graph": fb.cuda_graph,
        "comm_buffers": fb.comm_buffers, "eplb_redundant": fb.eplb_redundant,
        "fixed_total": fb.total(), "pre_snapshot": k.pre_snapshot_bytes(),
        "sequence_fixed": k.sequence_fixed_bytes(),
        "sequence_admission": k.sequence_admission_bytes(),
        "kv_budget": cap.budget_bytes, "kv_page": cap.page_bytes, "kv_blocks": cap.num_blocks,
        "kv_tokens": cap.tokens, "max_concurrency": cap.max_concurrency,
        "gpu_memory_utilization": cap.utilization,
        "gpu_memory_utilization_assumed": cap.utilization_assumed,
    }


def register(group: click.Group) -> None:
    @group.command("step", cls=DialectCommand, positional="--scenario")
    @click.option("-s", "--scenario", required=True, shell_complete=complete_scenario,
                  help="Scenario name or path.")
    @click.option("--batch", "spec", required=True,
                  help="COUNTxSCHEDULED@COMPUTED groups, comma-separated "
                       "(e.g. 32x1@4095,1x512@0), or a JSON/YAML file.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index of a disaggregated deployment.")
    @click.option("--decode-threshold", default=1, show_default=True, type=click.IntRange(0),
                  help="A request scheduling more tokens than this is a prefill.")
    @click.option("--sm-budget", default=0, show_default=True, type=click.IntRange(0),
                  help="SMs available to the step (0 = all).")
    @format_options(TEXT_FORMATS, output=False)
    @with_repos
    def step_cmd(scenario: str, spec: str, pool: int, decode_threshold: int, sm_budget: int,
                 fmt: str | None, scenarios_root: str | None, catalog_root: str | None,
                 registry_root: str | None) -> None:
        """Price one forward pass of SCENARIO over the batch SPEC."""
        from kernel.model import step
        from kernel.model.types import Batch

        reqs = parse_batch_spec(spec)
        k = _open(scenario, pool, make_repos(scenarios_root, catalog_root, registry_root))
        batch = Batch(reqs, decode_threshold=decode_threshold, sm_budget=sm_budget)
        est = k.step_time(batch)
        breaches = k.check(batch)
        for breach in breaches:  # priced as the reference does, but impossible
            click.echo(f"warning: over a deployment limit: {breach}", err=True)
        n_pre = sum(1 for q in reqs if q.scheduled > decode_threshold
                    and q.scheduled + q.computed > 0)
        if resolve_format(fmt, None, TEXT_FORMATS) != "table":
            emit_rows([{
                "scenario": k.resolved_pool.scenario, "pool": pool, "requests": len(reqs),
                "prefill_requests": n_pre, "tokens": batch.tokens(),
                "decode_threshold": decode_threshold, "sm_budget": sm_budget,
                "overlap_ns": est.overlap, "no_overlap_ns": est.no_overlap,
                "bottleneck": est.bottleneck.value,
                "limits": ",".join(x.limit for x in breaches),
                **{f"{res.value}_ns": ns for res, ns in (est.per_resource or {}).items()}}],
                fmt, None)
            return
        console = Console()
        console.print(f"[bold]{k!r}[/bold]")
        console.print(f"batch: {len(reqs)} requests ({n_pre} prefill), {batch.tokens()} tokens, "
                      f"decode threshold {decode_threshold}, SM budget {sm_budget or 'all'}")
        head = Table(title="step time")
        head.add_column("estimate")
        head.add_column("µs", justify="right")
        head.add_column("ns", justify="right")
        head.add_row("Overlap", _us(est.overlap), f"{est.overlap:,}")
        head.add_row("NoOverlap", _us(est.no_overlap), f"{est.no_overlap:,}")
        console.print(head)
        per = Table(title=f"per resource (bottleneck: {est.bottleneck.value})")
        per.add_column("resource")
        per.add_column("µs", justify="right")
        per.add_column("ns", justify="right")
        per.add_column("share", justify="right")
        for res, ns in (est.per_resource or {}).items():
            mark = " *" if res is est.bottleneck else ""
            share = f"{ns / est.no_overlap:.1%}" if est.no_overlap else "-"
            per.add_row(res.value + mark, _us(ns), f"{ns:,}", share)
        console.print(per)
        rows = step.layer_breakdown(k.resolved_pool, batch)
        if rows:
            lt = Table(title="per layer kind: one layer, µs (stage = max of the dense terms "
                             "+ routed)")
            for col in ("kind", "×", "sm", "hbm", "nvlink", "nic", "routed", "stage",
                        "dominant"):
                lt.add_column(col, justify="left" if col in ("kind", "dominant") else "right")
            for row in rows:
                routed = float(row["routed_sm"]) + float(row["routed_hbm"])
                lt.add_row(row["kind"], str(row["count"]),
                           *(f"{float(row[c]) * 1e6:,.1f}" for c in
                             ("dense_sm", "dense_hbm", "nvlink", "nic")),
                           f"{routed * 1e6:,.1f}", f"{float(row['stage']) * 1e6:,.1f}",
                           row["dominant"].replace("dense_", ""))
            console.print(lt)

    @group.command("memory", cls=DialectCommand, positional="--scenario")
    @click.option("-s", "--scenario", required=True, shell_complete=complete_scenario,
                  help="Scenario name or path.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index of a disaggregated deployment.")
    @format_options(TEXT_FORMATS, output=False)
    @with_repos
    def memory_cmd(scenario: str, pool: int, fmt: str | None, scenarios_root: str | None,
                   catalog_root: str | None, registry_root: str | None) -> None:
        """Per-rank memory of SCENARIO: fixed bytes, pre-snapshot bytes, KV per request."""

        k = _open(scenario, pool, make_repos(scenarios_root, catalog_root, registry_root))
        r = k.resolved_pool
        if resolve_format(fmt, None, TEXT_FORMATS) != "table":
            emit_rows([memory_row(k, pool)], fmt, None)
            return
        console = Console()
        console.print(f"[bold]{k!r}[/bold]")
        fb = k.fixed_bytes()
        pre = k.pre_snapshot_bytes()
        t = Table(title="fixed bytes per rank (inside the gpu_memory_utilization budget)")
        t.add_column("part")
        t.add_column("bytes", justify="right")
        t.add_column("GiB", justify="right")
        for name, v in (("weights", fb.weights), ("activation peak", fb.activation_peak),
                        ("CUDA graphs", fb.cuda_graph), ("comm buffers", fb.comm_buffers),
                        ("EPLB redundant", fb.eplb_redundant), ("total", fb.total())):
            t.add_row(name, f"{v:,}", f"{v / GIB:5.1f}")
        t.add_row("pre-snapshot (communicator + workspace)", f"{pre:,}", f"{pre / GIB:5.1f}")
        t.add_row("total + pre-snapshot", f"{fb.with_pre_snapshot():,}",
                  f"{fb.with_pre_snapshot() / GIB:5.1f}")
        console.print(t)
        s = Table(title="per request")
        s.add_column("tokens", justify="right")
        s.add_column("variable bytes", justify="right")
        s.add_column("MiB", justify="right")
        lengths = sorted({1, r.block_size, 1024, 4096, 32768, r.max_model_len} - {0})
        for n in lengths:
            v = k.sequence_variable_bytes(n)
            s.add_row(f"{n:,}", f"{v:,}", f"{v / MIB:,.1f}")
        console.print(s)
        console.print(f"sequence fixed bytes {k.sequence_fixed_bytes():,}; admission "
                      f"{k.sequence_admission_bytes():,}")
        if r.caches is not None:
            kinds = ", ".join(
                f"{t.kind}{f' w{t.window}' if t.window else ''} {t.layers} layers"
                f" in {t.groups} group(s) of {t.block}-token pages" for t in r.caches.types)
            console.print(f"caches as vLLM's hybrid allocator holds them: {kinds}; group size "
                          f"{r.caches.group_size}, pool block {r.caches.pool_block_bytes:,} B")
        else:
            console.print("caches: legacy (one uniform KV group; no rings or state groups)")
        cap = k.kv_capacity()
        note = " (vLLM default, unstated)" if cap.utilization_assumed else ""
        c = Table(title=f"KV capacity (gpu_memory_utilization {cap.utilization}{note})")
        c.add_column("item")
        c.add_column("value", justify="right")
        c.add_row("budget bytes", f"{cap.budget_bytes:,}")
        c.add_row("page bytes (one block)", f"{cap.page_bytes:,}")
        c.add_row("blocks", f"{cap.num_blocks:,}")
        c.add_row("tokens", f"{cap.tokens:,}")
        if cap.max_concurrency is None:
            c.add_row("max concurrency", "unknown: the pool states no max_model_len")
        else:
            c.add_row(f"max concurrency at {r.max_model_len:,} tokens",
                      f"{cap.max_concurrency:.2f}")
        console.print(c)
