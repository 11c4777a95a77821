"""`p2p-trainer simulate`: the scale simulator as a command (the only module of the simulator using click).

Every Scenario field is an option (`--num-chips`, `--mtbi-chip-s`, ...); `--scenario FILE.toml`
gives the starting values and options override them. `--published` runs the comparison with
Decoupled DiLoCo's published goodput figures instead.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

# The engine, the surrogate and the report (numpy, matplotlib) load inside the command, so that
# `p2p-trainer --help` stays quick; only the scenario's fields are needed to build the options.
from p2p_trainer.lab.sim.scenario import (
    ALLREDUCES,
    METHODS,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_from_dict,
)


def _scenario_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """One `--field-name` option per Scenario field, documented with the field's docstring name."""
    for f in reversed(dataclasses.fields(Scenario)):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "methods":
            func = click.option(
                "--method",
                "methods",
                multiple=True,
                type=click.Choice(METHODS),
                help="Methods to run (repeat).",
            )(func)
            continue
        default = getattr(Scenario(), f.name)
        kind: Any = click.Choice(ALLREDUCES) if f.name == "allreduce" else type(default)
        func = click.option(flag, f.name, type=kind, default=None, help=f"[default: {default}]")(func)
    return func


@click.command("simulate")
@click.option("--scenario", "scenario_path", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Write results here.")
@click.option("--published", is_flag=True, help="Compare with Decoupled DiLoCo's published goodput figures.")
@click.option(
    "--surrogate", is_flag=True, help="Also optimise noisy quadratics: loss and consensus per method."
)
@_scenario_options
def simulate(
    scenario_path: str | None, out_dir: str | None, published: bool, surrogate: bool, **overrides: Any
) -> None:
    """Simulate goodput, utilisation and round times of each method for a swarm under failures."""
    from p2p_trainer.lab.sim.engine import simulate as run_simulation
    from p2p_trainer.lab.sim.output import results_table, surrogate_table, write_report
    from p2p_trainer.lab.sim.surrogate import run_surrogate

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if published:
        _run_published(out_dir)
        return
    values = load_scenario(scenario_path).to_dict() if scenario_path else {}
    values.update({k: v for k, v in overrides.items() if v is not None and v != ()})
    try:
        scenario = scenario_from_dict(values)
    except ScenarioError as e:
        raise click.UsageError(str(e)) from e
    results = run_simulation(scenario)
    click.echo(results_table(results), nl=False)
    quality = run_surrogate(scenario, results) if surrogate else None
    if quality:
        click.echo("\n" + surrogate_table(quality), nl=False)
    if out_dir:
        for path in write_report(Path(out_dir), scenario, results, quality):
            click.echo(f"wrote {path}")


def _run_published(out_dir: str | None) -> None:
    from p2p_trainer.lab.sim.calibration import PUBLISHED, published_scenario
    from p2p_trainer.lab.sim.engine import simulate as run_simulation
    from p2p_trainer.lab.sim.output import published_table
    from p2p_trainer.train.atomic_files import atomic_write_bytes

    rows = []
    for point in PUBLISHED:
        result = run_simulation(published_scenario(point))[point.method]
        rows.append((point, result.goodput))
    table = published_table(rows)
    click.echo(table, nl=False)
    if out_dir:
        atomic_write_bytes(Path(out_dir) / "published.md", table.encode())
        click.echo(f"wrote {Path(out_dir) / 'published.md'}")


if __name__ == "__main__":
    simulate()
