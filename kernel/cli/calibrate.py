"""``blis-kernel calibrate``: fit a calibration to measured step times (docs/calibration.md),
and ``blis-kernel measurements splitwise``: SplitwiseSim's profile as traces to try it on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline import safe_output

from .common import make_repos, with_repos

F = TypeVar("F", bound=Callable[..., Any])


def _columns(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise click.BadParameter(f"{p!r}: expected CANONICAL=SOURCE, e.g. scheduled=n_sched",
                                     param_hint="--column")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def describe(cal: object) -> str:
    """A plain-text account of a calibration: per phase, each term and its status, then
    the training and held-out errors."""
    doc = getattr(cal, "document", {})
    lines = [f"calibration {doc.get('name')!r}: {doc.get('model')} on {doc.get('chip')}"]
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
        cst = terms.get("constant", {}).get("status", "")
        parts.append(f"+{ph['constant_ns'] / 1e3:.4g} us" + ("" if cst == "fitted"
                                                             else f" ({cst})"))
        tr, ho = ph.get("training", {}), ph.get("held_out", {})
        lines.append(f"  {phase:<8} {rows:>7,} steps  " + ", ".join(parts))
        lines.append(f"  {'':<8} {'':>7}        training MAPE {_pct(tr.get('mape'))} "
                     f"(bias {_pct(tr.get('bias'), True)}); held out MAPE "
                     f"{_pct(ho.get('mape'))} (bias {_pct(ho.get('bias'), True)})")
    tr, ho = doc.get("training") or {}, doc.get("held_out") or {}
    fit = doc.get("fit", {})
    folds = fit.get("folds", 0)
    by = f" by {fit['fold_by']}" if fit.get("fold_by") else ""
    held = (f"held out ({folds} folds{by}) MAPE {_pct(ho.get('mape'))} (bias "
            f"{_pct(ho.get('bias'), True)}, p90 {_pct(ho.get('p90'))})" if folds
            else "no cross-validation (--folds < 2)")
    lines.append(f"  all      {tr.get('rows', 0):>7,} steps  training MAPE {_pct(tr.get('mape'))}"
                 f" (bias {_pct(tr.get('bias'), True)}); {held}")
    return "\n".join(lines)


def register(group: click.Group) -> None:
    @group.command("calibrate")
    @click.argument("traces", nargs=-1, required=True, type=click.Path(exists=True))
    @click.option("--scenario", "-s", "scenarios", multiple=True, required=True,
                  help="Scenario name or path: once for every trace, or once per trace.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @click.option("--measured", required=True,
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
    @click.option("--name", default=None, help="The calibration's name (default model-chip).")
    @click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1),
                  help="Fold assignment seed.")
    @click.option("--decode-threshold", default=1, show_default=True, type=click.IntRange(0),
                  help="scheduled > N is a prefill (unless the trace has decode_threshold).")
    @click.option("--column", "column_map", multiple=True, metavar="NAME=SOURCE",
                  help="Map a trace column, e.g. --column scheduled=num_scheduled_tokens.")
    @click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
                  help="The calibration document (YAML).")
    @with_repos
    def calibrate_cmd(traces: tuple[str, ...], scenarios: tuple[str, ...], pool: int,
                      measured: str, unit: str, trace_format: str, folds: int,
                      fold_by: str | None, name: str | None, seed: int,
                      decode_threshold: int, column_map: tuple[str, ...], output: str,
                      scenarios_root: str | None, catalog_root: str | None,
                      registry_root: str | None) -> None:
        """Fit a calibration of the kernel's per-resource terms to the measured step times in
        TRACE(s), cross-validate it, and write it to OUTPUT (docs/calibration.md)."""
        from kernel.calibration import CalibrationError, calibrate
        from kernel.fpm import FpmError
        from kernel.trace import TraceError

        if len(scenarios) not in (1, len(traces)):
            raise click.UsageError(f"{len(scenarios)} --scenario for {len(traces)} traces: "
                                   "give one, or one per trace")
        repos = make_repos(scenarios_root, catalog_root, registry_root)
        safe_output.check_outputs([("TRACE", t) for t in traces], [("-o", output)])
        try:
            cal = calibrate(list(scenarios), list(traces), measured, unit=unit, repos=repos,
                            pool=pool, columns=_columns(column_map) or None,
                            trace_format=trace_format, folds=folds, fold_by=fold_by,
                            name=name, seed=seed, decode_threshold=decode_threshold)
        except (CalibrationError, TraceError, FpmError) as exc:
            raise click.ClickException(str(exc)) from None
        cal.write(output)
        click.echo(describe(cal))
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
        (hardware, TP), each with a ``measured_ms`` and a ``config`` column, and print the
        scenario each is priced on."""
        import polars as pl

        from kernel.calibration.splitwise import splitwise_trace

        requests, batches = splitwise_trace()
        if not keep_suspect:
            batches = batches.filter(~pl.col("suspect"))
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        cols = ["batch_id", "measured_ms", "config", "phase", "tp", "hardware"]
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
                 help="Apply a calibration made for another model or chip."),
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
        from kernel.calibration import CalibrationError
        from kernel.calibration.columns import producers_for

        self.measured = options.get("measured")
        self.unit = options.get("measured_unit", "ns")
        self.k = k
        cal = options.get("calibration")
        if cal:
            try:
                self.k = k.with_calibration(cal, bool(options.get("force_calibration")))
            except CalibrationError as exc:
                raise click.ClickException(str(exc)) from None
        law = self.k.calibration.law if self.k.calibration is not None else None
        self.producers = producers_for(law, self.measured, self.unit)
        self.src: Any = trace
        self.keep: list[str] = []
        self.fpm_rejects = 0
        self.fpm_passes = 0
        if options.get("trace_format") == "fpm":
            self._fpm(trace, rejects)

    def _fpm(self, trace: str, rejects: Path | None) -> None:
        from kernel.fpm import FpmError, fpm_to_requests

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
        if self.measured is None:
            return
        import polars as pl

        from kernel.calibration.accuracy import accuracy_table, format_table

        cols = ["measured_ns", "no_overlap_ns", "overlap_ns", "prefill_requests",
                "decode_requests", "tokens", "bottleneck"]
        if self.k.calibration is not None:
            cols.append("calibrated_ns")
        priced = (pl.read_csv(out, columns=cols) if out.suffix.lower() == ".csv"
                  else pl.read_parquet(out, columns=cols))
        table = accuracy_table(priced.with_columns(pl.col("bottleneck").cast(pl.String)))
        path = out.with_name(out.stem + ".accuracy.csv")
        table.write_csv(path)
        click.echo(format_table(table, ("all", "phase")))
        click.echo(f"accuracy by phase, batch tokens and bottleneck -> {path}")
