"""`p2p-trainer config` (print the resolved config), `config show` (with where each value came
from) and `config check FILE` (every wrong field of a file); and `resolve_config`, the config every
command runs: flag > environment > file > default (`p2p_trainer.config`'s docstring).

Only click and the config are imported, so these answer without loading torch or hivemind.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from click.core import ParameterSource

from p2p_trainer.cli_options import run_config_options
from p2p_trainer.config import (
    ConfigError,
    EffectiveConfig,
    RunConfig,
    annotated_toml,
    effective_config,
    to_toml,
)


def effective(
    config: str | None,
    method: str | None = None,
    rounds: int | None = None,
    seed: int | None = None,
    use_env: bool = True,
    tensorboard_dir: str | None = None,
) -> EffectiveConfig:
    """The config file (or the packaged default), the P2PT_ environment variables on top (unless
    `use_env` is off), the command-line flags on top of those; a bad value is a usage error."""
    try:
        return effective_config(
            config,
            environ=os.environ if use_env else None,
            method=method,
            rounds=rounds,
            seed=seed,
            tensorboard_dir=tensorboard_dir,
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def resolve_config(
    config: str | None,
    method: str | None = None,
    rounds: int | None = None,
    seed: int | None = None,
    use_env: bool = True,
    tensorboard_dir: str | None = None,
) -> RunConfig:
    """The run config a command runs (see `effective`).

    `--method` changes only the method: the file's other [outer] values stay, and the method's
    reference values fill only what the file leaves unset (`load_config`).
    """
    return effective(config, method, rounds, seed, use_env, tensorboard_dir).config


@click.group("config", invoke_without_command=True)
@run_config_options
@click.pass_context
def config_group(
    ctx: click.Context, config: str | None, method: str | None, rounds: int | None, seed: int | None
) -> None:
    """Print the resolved run config (every field) as TOML: what `local` and `join` would run.

    Precedence: flag > environment (P2PT_SEED, P2PT_<TABLE>__<FIELD>, e.g. P2PT_OUTER__METHOD) >
    file (--config or P2PT_CONFIG) > default. `config show` says where each value came from;
    `config check FILE` lists every wrong field of a file.
    """
    if ctx.invoked_subcommand is None:
        click.echo(to_toml(resolve_config(config, method, rounds, seed)), nl=False)


@config_group.command("show")
@run_config_options
@click.pass_context
def show(
    ctx: click.Context, config: str | None, method: str | None, rounds: int | None, seed: int | None
) -> None:
    """Print the effective config as TOML, each value with where it came from (default, file,
    env VARIABLE or flag --FLAG)."""
    found = effective(
        _own_or_group(ctx, "config", config),
        _own_or_group(ctx, "method", method),
        _own_or_group(ctx, "rounds", rounds),
        _own_or_group(ctx, "seed", seed),
    )
    click.echo("# precedence: flag > environment (P2PT_...) > file > default")
    click.echo(annotated_toml(found.config, {k: str(v) for k, v in found.sources.items()}), nl=False)


def _own_or_group(ctx: click.Context, name: str, value: Any) -> Any:
    """`config show`'s own option, or the group's (`config --seed 3 show`); one given on the command
    line wins over one that came from the environment (P2PT_CONFIG)."""
    group = ctx.parent
    if group is None or group.params.get(name) is None:
        return value
    if value is None or (
        ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE
        and group.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ):
        return group.params[name]
    return value


@config_group.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def check(path: str) -> None:
    """Validate config file PATH (the file alone: no environment, no flags); name every wrong field
    at once. Exit status 1 if any."""
    from p2p_trainer.config.file_check import check_config_file
    from p2p_trainer.train.data import DataError

    problems = check_config_file(path)
    if not problems:
        cfg = effective(path, use_env=False).config
        try:  # the run id hashes the corpus and tokenizer files: a missing one is a problem too
            click.echo(f"{path}: valid (method {cfg.outer.method}, run id {cfg.run_id()})")
            return
        except DataError as exc:
            problems = [str(exc)]
    click.echo(f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}", err=True)
    for problem in problems:
        click.echo(f"  - {problem}", err=True)
    sys.exit(1)
