"""``blis-kernel calibrate --requests LOG``: the calibration law fitted through the serving
replay to a client's request log (issue 32 item 7, docs/calibration.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline import safe_output

F = TypeVar("F", bound=Callable[..., Any])


def request_log_options(f: F) -> F:
    """The options of a request-log calibration (added to ``calibrate``)."""
    opts = [
        click.option("--requests", "requests_log", default=None,
                     type=click.Path(exists=True, dir_okay=False),
                     help="Calibrate from a request log instead of step traces: a request "
                          "table (.parquet/.csv) with measured ttft_<unit>, itl_<unit> and/or "
                          "e2e_<unit> per request, or, with --stages, an inference-perf "
                          "config whose run the stage aggregates measured."),
        click.option("--stages", "stages_file", default=None,
                     type=click.Path(exists=True, dir_okay=False),
                     help="With --requests CONFIG: the run's stage aggregates (CSV or "
                          "parquet: stage_index, metric, actual_ms; metrics ttft_mean, "
                          "itl_mean, e2e_mean; stage -1 is the whole run)."),
        click.option("--fit-parameters", "fit_parameters", default="scale",
                     show_default=True,
                     help="Law parameters to fit, comma-separated: scale, per_request_ns, "
                          "constant_ns."),
        click.option("--refine", default=10, show_default=True, type=click.IntRange(0, 50),
                     help="Golden-section steps after each parameter's grid."),
        click.option("--arrival-unit", "arrival_unit", default="s", show_default=True,
                     type=click.Choice(["ns", "us", "ms", "s"]),
                     help="Unit of the log's arrival column when it has no suffix."),
        click.option("--duration-scale", "duration_scale", default=1.0, show_default=True,
                     type=click.FloatRange(min=0.0, min_open=True),
                     help="With --stages: replay every load stage this many times as long "
                          "(a subsample at the same rates)."),
        click.option("--load-seed", "load_seed", default=0, show_default=True,
                     type=click.IntRange(0, 2**63 - 1),
                     help="With --stages: the seed of the generated load."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _read_table(path: str) -> Any:
    import polars as pl

    p = Path(path)
    if p.suffix == ".parquet":
        return pl.read_parquet(p)
    if p.suffix == ".csv":
        return pl.read_csv(p)
    raise click.UsageError(f"{p}: stage aggregates are .csv or .parquet")


def calibrate_from_requests(scenarios: tuple[str, ...], pool: int, start: str,
                            engine: str | None, name: str | None, output: str, repos: Any,
                            *, requests_log: str, stages_file: str | None,
                            fit_parameters: str, refine: int, arrival_unit: str,
                            duration_scale: float, load_seed: int) -> None:
    from kernel import open as open_kernel
    from kernel.calibration import CalibrationError
    from kernel.calibration.requests_fit import (
        RequestRun,
        from_requests,
        measured_stages,
        request_log_run,
    )
    from kernel.io.calibration_identity import parse_engine

    if len(scenarios) != 1:
        raise click.UsageError("--requests takes one --scenario (the deployment that served "
                               "the log)")
    reads = [("--requests", requests_log), *((("--stages", stages_file),) if stages_file
                                             else ()),
             *(("--scenario", s) for s in scenarios if Path(s).exists())]
    safe_output.check_outputs(reads, [("-o", output)])
    params = tuple(p.strip() for p in fit_parameters.split(",") if p.strip())
    try:
        who = parse_engine(engine)
        eng = ({"name": who[0], "version": who[1], "stated_by": "--engine"} if who[0]
               else None)
        k = open_kernel(scenarios[0], repos, pool)
        if stages_file:
            from kernel.replay import generate, inference_perf_spec
            from kernel.replay.simtoreal.run import scaled_workload

            spec_cfg: Any = requests_log
            if duration_scale != 1.0:
                import yaml
                cfg = yaml.safe_load(Path(requests_log).read_text())
                spec_cfg = scaled_workload(cfg, duration_scale)
            reqs = generate(inference_perf_spec(spec_cfg), seed=load_seed)
            run = RequestRun(requests_log, k, reqs, None,
                             stages=measured_stages(_read_table(stages_file), stages_file))
        else:
            run = request_log_run(k, requests_log, arrival_unit=arrival_unit)
        cal = from_requests(run, parameters=params,
                            start="no_overlap" if start == "auto" else start,
                            refine=refine, name=name, engine=eng)
    except (CalibrationError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    cal.write(output)
    fit = cal.document["fit"]
    vals = ", ".join(f"{p} {v:.6g}" for p, v in fit["parameters"].items())
    click.echo(f"request-log calibration of {cal.model} on {cal.chip} from "
               f"{cal.law.start}: {vals}")
    click.echo(f"loss {fit['loss']:.4g} (uncalibrated {fit['loss_at_start']:.4g}); "
               f"{fit['evaluations']} evaluations, {fit['replays']} replays, "
               f"{fit['seconds']:.1f} s")
    if cal.document.get("warning"):
        click.secho(f"WARNING: {cal.document['warning']}; the document says so "
                    "(improved: false)", err=True, fg="red", bold=True)
    click.echo(f"-> {output}")
