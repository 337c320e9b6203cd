"""``blis-kernel calibrate``: fit a calibration to measured step times (docs/calibration.md),
and ``blis-kernel measurements splitwise``: SplitwiseSim's profile as traces to try it on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline import safe_output

from .calibrate_requests import calibrate_from_requests, request_log_options
from .common import make_repos, parse_column_options, with_repos
from .dialect import DialectCommand, complete_scenario

F = TypeVar("F", bound=Callable[..., Any])


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def describe(cal: object) -> str:
    """A plain-text account of a calibration: its start and engine, per phase each term and
    its status (tied groups with their shared multiplier), then the held-out table by phase
    for both starts, uncalibrated and calibrated."""
    doc = getattr(cal, "document", {})
    eng = doc.get("engine") or {}
    who = (f"{eng.get('name')} {eng.get('version') or '(version not stated)'} (stated by "
           f"{eng.get('stated_by', 'the option')})" if eng.get("name")
           else "engine not stated")
    lines = [f"calibration {doc.get('name')!r}: {doc.get('model')} on {doc.get('chip')}, "
             f"{who}, rules {doc.get('rules') or '-'}, "
             f"TP {', '.join(str(t) for t in (doc.get('layout') or {}).get('tp', [])) or '-'}",
             f"  starts from {doc.get('start', 'no_overlap')}"
             + (f" (chosen by {doc['fit']['start_chosen_by']})"
                if doc.get("fit", {}).get("start_chosen_by") not in (None, "given") else "")]
    for phase, ph in doc.get("phases", {}).items():
        rows = ph.get("rows", 0)
        if not rows or "note" in ph:
            lines.append(f"  {phase:<8} {rows:>7,} steps  ({ph.get('note', 'nothing fitted')})")
            continue
        terms = ph.get("terms", {})
        parts = []
        for t, m in ph["multipliers"].items():
            st = terms.get(t, {}).get("status", "")
            parts.append(f"{t} x{m:.3g}" + ("" if st == "fitted" else f" ({st})"))
        rst = terms.get("per_request", {}).get("status", "")
        parts.append(f"{ph.get('per_request_ns', 0.0) / 1e3:+.4g} us/request"
                     + ("" if rst == "fitted" else f" ({rst})"))
        cst = terms.get("constant", {}).get("status", "")
        parts.append(f"{ph['constant_ns'] / 1e3:+.4g} us" + ("" if cst == "fitted"
                                                             else f" ({cst})"))
        lines.append(f"  {phase:<8} {rows:>7,} steps  " + ", ".join(parts))
        for g in ph.get("tied", []):
            lines.append(f"  {'':<8} {'':>7}        tied: {' + '.join(g['terms'])} share "
                         f"x{g['multiplier']:.4g} (the data cannot tell them apart)")
        if ph.get("floor_bound"):
            lines.append(f"  {'':<8} {'':>7}        constant raised to the floor bound")
    lines.extend(held_out_table(doc))
    return "\n".join(lines)


def held_out_table(doc: dict[str, Any]) -> list[str]:
    """MAPE, bias and p90 by phase, uncalibrated and calibrated, for each start fitted."""
    fit = doc.get("fit", {})
    how = {"holdout": "on the holdout trace", "folds":
           f"held out ({fit.get('folds')} folds" + (f" by {fit['fold_by']})"
                                                    if fit.get("fold_by") else ")"),
           "none": "on the training steps (nothing held out)"}.get(fit.get("scored_by", ""),
                                                                    "held out")
    if "split" in (doc.get("sources") or {}):
        sp = doc["sources"]["split"]
        how = (f"on the split's held-out side ({sp['column']}:{sp['fraction']}, "
               f"{sp['held_out_steps']:,} steps)")
    out = [f"  error {how}:",
           f"    {'start':<11} {'estimate':<13} {'phase':<8} {'steps':>7} {'MAPE':>7} "
           f"{'bias':>7} {'p90':>7}"]
    for start, v in (doc.get("starts") or {}).items():
        mark = " *" if start == doc.get("start") else ""
        for est in ("uncalibrated", "calibrated"):
            for phase, s in v[est].items():
                out.append(f"    {start + mark:<11} {est:<13} {phase:<8} {s['rows']:>7,} "
                           f"{_pct(s['mape']):>7} {_pct(s['bias'], True):>7} "
                           f"{_pct(s['p90']):>7}")
    return out


def register(group: click.Group) -> None:
    @group.command("calibrate", cls=DialectCommand)
    @click.argument("traces", nargs=-1, required=False, type=click.Path(exists=True))
    @click.option("-s", "--scenario", "scenarios", multiple=True, required=True,
                  shell_complete=complete_scenario,
                  help="Scenario name or path: once for every trace, or once per trace.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @click.option("--measured", required=False, default=None,
                  help="The per-batch column of measured step times.")
    @click.option("--measured-unit", "unit", default="ns", show_default=True,
                  type=click.Choice(["ns", "us", "ms", "s"]), help="Its unit.")
    @click.option("--trace-format", "trace_format", default="requests", show_default=True,
                  type=click.Choice(["requests", "fpm"]),
                  help="requests: one row per request per step; fpm: one row per forward "
                       "pass with aggregates (docs/traces.md).")
    @click.option("--folds", default=5, show_default=True, type=click.IntRange(0),
                  help="Cross-validation folds (< 2: none).")
    @click.option("--fold-by", "fold_by", default=None,
                  help="A per-batch column whose values are held out whole (e.g. a "
                       "configuration label), instead of random steps.")
    @click.option("--holdout", "holdout", multiple=True, type=click.Path(exists=True),
                  help="A measured trace to score the calibration on instead of folds "
                       "(repeatable).")
    @click.option("--holdout-scenario", "holdout_scenarios", multiple=True,
                  help="The holdout's scenario(s) (default: the --scenario(s)).")
    @click.option("--split", default=None, metavar="COL:FRACTION",
                  help="Hold out the steps whose per-batch COL value hashes below FRACTION "
                       "(deterministic; e.g. config:0.5).")
    @click.option("--start", default="auto", show_default=True,
                  type=click.Choice(["auto", "no_overlap", "overlap"]),
                  help="The estimate the calibration corrects (auto: the lower held-out "
                       "MAPE).")
    @click.option("--engine", default=None, metavar="NAME[:VERSION]",
                  help="The engine that made the measurements, when the trace does not say "
                       "(columns engine, engine_version).")
    @click.option("--name", default=None, help="The calibration's name (default model-chip).")
    @click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1),
                  help="Fold assignment seed.")
    @click.option("--decode-threshold", default=1, show_default=True, type=click.IntRange(0),
                  help="scheduled > N is a prefill (unless the trace has decode_threshold).")
    @click.option("--column", "column_map", multiple=True, metavar="NAME=SOURCE",
                  help="Map a trace column, e.g. --column scheduled=num_scheduled_tokens.")
    @click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
                  help="The calibration document (YAML).")
    @request_log_options
    @with_repos
    def calibrate_cmd(traces: tuple[str, ...], scenarios: tuple[str, ...], pool: int,
                      measured: str | None, unit: str, trace_format: str, folds: int,
                      fold_by: str | None, holdout: tuple[str, ...],
                      holdout_scenarios: tuple[str, ...], split: str | None, start: str,
                      engine: str | None, name: str | None, seed: int,
                      decode_threshold: int, column_map: tuple[str, ...], output: str,
                      scenarios_root: str | None, catalog_root: str | None,
                      registry_root: str | None, **request_log: Any) -> None:
        """Fit a calibration of the kernel's per-resource terms to the measured step times in
        TRACE(s), cross-validate it, and write it to OUTPUT (docs/calibration.md)."""
        from kernel.calibration import CalibrationError, calibrate
        from kernel.io.fpm import FpmError
        from kernel.io.trace import TraceError

        if request_log.get("requests_log"):  # issue 32 item 7: through the serving replay
            if traces or measured:
                raise click.UsageError("--requests calibrates from a request log: give no "
                                       "TRACE and no --measured")
            calibrate_from_requests(scenarios, pool, start, engine, name, output,
                                    make_repos(scenarios_root, catalog_root, registry_root),
                                    **request_log)
            return
        if not traces or not measured:
            raise click.UsageError("give TRACE(s) and --measured (per-step times), or "
                                   "--requests LOG (a request log)")
        if len(scenarios) not in (1, len(traces)):
            raise click.UsageError(f"{len(scenarios)} --scenario for {len(traces)} traces: "
                                   "give one, or one per trace")
        repos = make_repos(scenarios_root, catalog_root, registry_root)
        if holdout and split:
            raise click.UsageError("give --holdout or --split, not both")
        safe_output.check_outputs([*(("TRACE", t) for t in traces),
                                   *(("--holdout", t) for t in holdout),
                                   *(("--scenario", s) for s in scenarios if Path(s).exists())],
                                  [("-o", output)])
        try:
            cal = calibrate(list(scenarios), list(traces), measured, unit=unit, repos=repos,
                            pool=pool, columns=parse_column_options(column_map) or None,
                            trace_format=trace_format, folds=folds, fold_by=fold_by,
                            name=name, seed=seed, decode_threshold=decode_threshold,
                            holdout=list(holdout) or None,
                            holdout_scenario=list(holdout_scenarios) or None, split=split,
                            start=start, engine=engine)
        except (CalibrationError, TraceError, FpmError) as exc:
            raise click.ClickException(str(exc)) from None
        cal.write(output)
        click.echo(describe(cal))
        if cal.document.get("warning"):
            click.secho(f"WARNING: {cal.document['warning']}; the document says so "
                        "(improved: false)", err=True, fg="red", bold=True)
        rejected = cal.document["sources"]["measured"]["rejected_steps"]
        if rejected:
            click.echo(f"{rejected:,} step(s) set aside for a bad measured value or "
                       "impossible aggregates", err=True)
        click.echo(f"-> {output}")

    @group.group("measurements")
    def measurements_group() -> None:
        """Measured data sets carried with the package (data/measurements/)."""

    @measurements_group.command("splitwise")
    @click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
                  help="Directory for one trace per configuration.")
    @click.option("--keep-suspect", is_flag=True,
                  help="Keep the TP 2 batch-64 rows (faster than batch 32; left out by "
                       "default).")
    def splitwise_cmd(output: str, keep_suspect: bool) -> None:
        """Write SplitwiseSim's profiled iteration times as measured traces, one parquet per
        (hardware, TP), each with a ``measured_ms``, a ``config`` (hardware and TP) and a
        ``shape`` (prompt, batch and tokens: one configuration of the sweep) column, and print
        the scenario each is priced on."""
        import polars as pl

        from kernel.calibration.splitwise import splitwise_trace

        requests, batches = splitwise_trace()
        if not keep_suspect:
            batches = batches.filter(~pl.col("suspect"))
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        cols = ["batch_id", "measured_ms", "config", "shape", "phase", "tp", "hardware"]
        for (config,), b in batches.group_by("config", maintain_order=True):
            t = requests.join(b.select(cols), on="batch_id", how="inner")
            path = out / f"{config}.parquet"
            with safe_output.atomic(path) as tmp:
                t.write_parquet(tmp)
            click.echo(f"{path}  {b.height:,} steps  --scenario {b['scenario'][0]}")


# -- the options ``blis-kernel price`` takes for measured traces and calibrations -----------------

PRICE_OPTIONS = [
    click.option("--measured", default=None,
                 help="A trace column of measured step times: adds measured_ns and each "
                      "estimate's relative error, and prints the accuracy summary."),
    click.option("--measured-unit", "measured_unit", default="ns", show_default=True,
                 type=click.Choice(["ns", "us", "ms", "s"]), help="Its unit."),
    click.option("--calibration", "calibration", default=None,
                 type=click.Path(exists=True, dir_okay=False),
                 help="A calibration (blis-kernel calibrate): adds calibrated_ns."),
    click.option("--force-calibration", is_flag=True,
                 help="Apply a calibration made for another model, chip, rules pack, layout "
                      "or engine (recorded in provenance)."),
    click.option("--engine", "engine", default=None, metavar="NAME[:VERSION]",
                 help="The engine these prices stand for: a calibration measured on another "
                      "is refused (unless --force-calibration)."),
    click.option("--trace-format", "trace_format", default="requests", show_default=True,
                 type=click.Choice(["requests", "fpm"]),
                 help="fpm: one row per forward pass with aggregates (docs/traces.md)."),
]


def price_options(func: F) -> F:
    for option in reversed(PRICE_OPTIONS):
        func = option(func)
    return func


class MeasuredRun:
    """What ``price`` does differently for a measured trace, a calibration or an FPM trace."""

    def __init__(self, k: Any, trace: str, options: dict[str, Any], rejects: Path | None):
        from kernel.bulk.calibrated import producers_for
        from kernel.calibration import CalibrationError

        self.measured = options.get("measured")
        self.unit = options.get("measured_unit", "ns")
        self.k = k
        cal = options.get("calibration")
        if cal:
            import warnings

            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    self.k = k.with_calibration(cal, bool(options.get("force_calibration")),
                                                options.get("engine"))
            except CalibrationError as exc:
                raise click.ClickException(str(exc)) from None
            for w in caught:
                click.echo(f"warning: {w.message}", err=True)
            if self.k.calibration is not None and self.k.calibration.forced:
                click.echo("warning: calibration applied by force despite: "
                           + "; ".join(self.k.calibration.forced)
                           + " (recorded in provenance as calibration.forced)", err=True)
        law = self.k.calibration.law if self.k.calibration is not None else None
        self.producers = producers_for(law, self.measured, self.unit)
        self.src: Any = trace
        self.keep: list[str] = []
        self.fpm_rejects = 0
        self.fpm_passes = 0
        if options.get("trace_format") == "fpm":
            self._fpm(trace, rejects)

    def _fpm(self, trace: str, rejects: Path | None) -> None:
        from kernel.io.fpm import FpmError, fpm_to_requests

        try:
            req, batches, rej = fpm_to_requests(trace)
        except FpmError as exc:
            raise click.ClickException(str(exc)) from None
        self.fpm_passes = batches.height + rej.height
        self.fpm_rejects = rej.height
        passthrough = [c for c in batches.columns if c != "batch_id"]
        self.src = req.join(batches, on="batch_id", how="left")
        self.keep = [c for c in passthrough if c != self.measured]
        self.fpm_reject_path: Path | None = None
        if rej.height and rejects is not None:
            self.fpm_reject_path = rejects.with_name(rejects.stem + ".fpm.parquet")
            with safe_output.atomic(self.fpm_reject_path, "--rejects") as tmp:
                rej.write_parquet(tmp)

    def report(self, out: Path) -> None:
        """After the run: FPM pass counts and the accuracy summary (printed and written)."""
        if self.fpm_passes:
            click.echo(f"forward passes in {self.fpm_passes:,} = rebuilt "
                       f"{self.fpm_passes - self.fpm_rejects:,} + rejected "
                       f"{self.fpm_rejects:,}" + (f" -> {self.fpm_reject_path}"
                                                  if self.fpm_rejects else ""))
        import polars as pl

        if self.k.calibration is not None:
            from kernel.io.calibration_identity import window_warnings

            req = (pl.read_csv(out, columns=["requests"]) if out.suffix.lower() == ".csv"
                   else pl.read_parquet(out, columns=["requests"]))["requests"].to_numpy()
            for m in window_warnings(self.k.calibration.document, req):
                click.echo(f"warning: {m}", err=True)
        if self.measured is None:
            return

        from kernel.calibration.accuracy import accuracy_table, format_table

        cols = ["measured_ns", "no_overlap_ns", "overlap_ns", "prefill_requests",
                "decode_requests", "tokens", "bottleneck"]
        if self.k.calibration is not None:
            cols.append("calibrated_ns")
        from kernel.io.outputs import read_table

        priced = pl.DataFrame(pl.from_arrow(read_table(out, cols)))  # any table format (RL3)
        table = accuracy_table(priced.with_columns(pl.col("bottleneck").cast(pl.String)))
        path = out.with_name(out.stem + ".accuracy.csv")
        with safe_output.atomic(path, "accuracy summary") as tmp:
            table.write_csv(tmp)
        click.echo(format_table(table, ("all", "phase")))
        click.echo(f"accuracy by phase, batch tokens and bottleneck -> {path}")
