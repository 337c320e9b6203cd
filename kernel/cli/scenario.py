"""``blis-kernel scenario from-vllm-config``: the Scenario + Deployment of a measured run's
vLLM engine config (kernel/calibration/vllm_config.py, docs/calibration.md)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline import safe_output


def register(group: click.Group) -> None:
    @group.group("scenario")
    def scenario_group() -> None:
        """Write scenario documents from other descriptions of a deployment."""

    @scenario_group.command("from-vllm-config")
    @click.argument("config", type=click.Path(exists=True, dir_okay=False))
    @click.option("--hardware", required=True, help="The catalog chip it ran on (e.g. h100).")
    @click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
                  help="Directory for <name>.yaml (Scenario + Deployment).")
    @click.option("--name", default=None, help="Scenario name (default from model, chip, "
                                               "layout and version).")
    @click.option("--model", default=None, help="Catalog model or HF id, when the config's "
                                                "is not in the catalog under its name.")
    @click.option("--engine-version", default=None,
                  help="The vLLM version, when the config does not state it.")
    @click.option("--rules-version", default=None, help="Price with this rules pack.")
    @click.option("--gpus-per-node", default=8, show_default=True, type=click.IntRange(1))
    def from_vllm_config_cmd(config: str, hardware: str, output: str, name: str | None,
                             model: str | None, engine_version: str | None,
                             rules_version: str | None, gpus_per_node: int) -> None:
        """Write the Scenario + Deployment YAML for the vLLM engine CONFIG (JSON or YAML)
        of a measured run, and say which rules pack prices it."""
        from kernel.calibration.vllm_config import ConfigError, from_vllm_config

        try:
            made = from_vllm_config(config, hardware, name=name, model=model,
                                    engine_version=engine_version,
                                    rules_version=rules_version, gpus_per_node=gpus_per_node)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        out = Path(output)
        target = out / f"{made.name}.yaml"
        safe_output.check_outputs([("CONFIG", config)], [("-o", target)])
        out.mkdir(parents=True, exist_ok=True)
        safe_output.write_text(target, made.text, "-o")
        for n in made.notes:
            click.echo(f"note: {n}", err=True)
        click.echo(f"rules pack {made.rules_version} (measured vllm "
                   f"{made.measured_version or 'version not stated'}) -> {target}")
