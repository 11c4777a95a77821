"""`p2p-trainer tokenizer train`, `sample` and `evaluate`: thin commands over train/tokenizer.py and
run/use_checkpoints.py. torch and tokenizers are imported inside the commands, so `--help` is fast."""

from __future__ import annotations

from pathlib import Path

import click

from p2p_trainer.config import ConfigError, DataConfig, load_config


@click.group()
def tokenizer() -> None:
    """Tokenizers for `data.tokenizer`."""


@tokenizer.command("train")
@click.option(
    "--corpus",
    required=True,
    help="Text to train on: a text or .jsonl file or a directory of them (as data.corpus), or shakespeare.",
)
@click.option(
    "--vocab-size", required=True, type=click.IntRange(min=256), help="Tokens, the 256 bytes included."
)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write tokenizer.json.")
@click.option(
    "--format",
    "fmt",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "text", "jsonl", "parquet", "datasets"]),
    help="How the corpus is read (as data.format).",
)
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="jsonl, parquet, datasets: the field holding the text.",
)
def train(corpus: str, vocab_size: int, out: str, fmt: str, text_field: str) -> None:
    """Train a byte-level BPE tokenizer on a corpus, offline, and save it as a tokenizer.json."""
    from p2p_trainer.train.corpus_readers import DataError, resolve_format
    from p2p_trainer.train.corpus_splits import corpus_texts
    from p2p_trainer.train.tokenizer import train_bpe

    try:
        cfg = DataConfig(corpus=corpus, format=fmt, text_field=text_field)  # type: ignore[arg-type]
        resolved = resolve_format(cfg)
        if resolved == "tokens":
            raise DataError(
                f"data.corpus={corpus} holds token ids, not text: train on the text they came from"
            )
        size = train_bpe(corpus_texts(cfg, resolved), vocab_size, Path(out))
    except (ConfigError, DataError) as exc:
        raise click.ClickException(str(exc)) from None
    short = f" (the corpus had merges for {size} of the {vocab_size} asked for)" if size < vocab_size else ""
    click.echo(
        f"wrote {out}: a byte-level BPE of {size} tokens{short}; train with it by setting\n"
        f'  [data] tokenizer = "{out}"\n  [model] vocab_size = {size}'
    )


def _device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


device_option = click.option(
    "--device", default=None, help="torch device (default: cuda if available, else cpu)."
)
run_dir_argument = click.argument("run_dir", type=click.Path(exists=True, file_okay=False))


@click.command()
@run_dir_argument
@click.option("--prompt", default="", help="Text to continue (default: a new line).")
@click.option(
    "--tokens", default=200, show_default=True, type=click.IntRange(min=1), help="Tokens to generate."
)
@click.option(
    "--temperature",
    default=0.8,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Softmax temperature; 0 always takes the likeliest token.",
)
@click.option(
    "--peer", default=None, type=click.IntRange(min=0), help="Use peerK's checkpoint (default: the first)."
)
@device_option
def sample(
    run_dir: str, prompt: str, tokens: int, temperature: float, peer: int | None, device: str | None
) -> None:
    """Print text generated from a run's checkpoint, with the run's tokenizer (the same each time)."""
    from p2p_trainer.run import use_checkpoints
    from p2p_trainer.train.corpus_readers import DataError

    try:
        text = use_checkpoints.sample(
            Path(run_dir), prompt, tokens, temperature, peer, device=_device(device)
        )
    except (use_checkpoints.RunDirError, DataError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(text)


@click.command()
@run_dir_argument
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    default=None,
    help="The run's config TOML (default: RUN_DIR/config.toml, which `local` writes).",
)
@click.option("--data", default=None, help="Evaluate on this corpus's validation split instead of the run's.")
@device_option
def evaluate(run_dir: str, config: str | None, data: str | None, device: str | None) -> None:
    """Print the validation loss of every peer's checkpoint and of their average."""
    from p2p_trainer.run import use_checkpoints
    from p2p_trainer.train.corpus_readers import DataError

    path = Path(config) if config else Path(run_dir) / "config.toml"
    if not path.is_file():
        raise click.ClickException(f"{path}: no such config; give the run's config with --config")
    try:
        result = use_checkpoints.evaluate(Path(run_dir), load_config(path), data, device=_device(device))
    except (use_checkpoints.RunDirError, DataError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    for name, loss in result.per_peer.items():
        click.echo(f"{name}: val loss {loss:.4f}")
    click.echo(f"average of {len(result.per_peer)} peer(s): val loss {result.average:.4f}")
    click.echo(f"(nats per token, over {result.tokens} validation tokens)")
