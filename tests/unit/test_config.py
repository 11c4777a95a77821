"""One config whatever its source: Python, TOML and command-line flags agree; wrong types name the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

from p2p_trainer.cli import main, resolve_config
from p2p_trainer.config import (
    METHOD_DEFAULTS,
    METHODS,
    ConfigError,
    DataConfig,
    ExchangeConfig,
    InnerConfig,
    NetworkConfig,
    OuterConfig,
    RunConfig,
    config_from_dict,
    default_config_text,
    load_config,
    to_toml,
)
from p2p_trainer.config.file_check import check_config_file
from p2p_trainer.config.toml_io import MOVED_TO_EXCHANGE

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("method", METHODS)
def test_python_toml_and_flags_give_the_same_config(method: str, tmp_path: Path) -> None:
    # a file is read over the default run: what it leaves unset is the default run's (written out
    # here, as default.toml has them), not the fields' own defaults
    python = RunConfig(
        rounds=3,
        seed=5,
        inner=InnerConfig(eval_every=20),
        outer=OuterConfig(
            method=method,  # type: ignore[arg-type]
            num_inner_steps=20,
            overlap=True,
            land_at_step=3,
            mix2_rounds=2,
        ),
        exchange=ExchangeConfig(
            timeout_s=9.0, quorum_fraction=1.0, wire_dtype="float16", update_codec="int8"
        ),
    )
    in_file = _write(
        tmp_path,
        f'rounds = 3\nseed = 5\n[outer]\nmethod = "{method}"\nmix2_rounds = 2\n[exchange]\ntimeout_s = 9\n',
    )
    assert load_config(in_file) == python
    # the same file without a method, rounds or seed (so the defaults, 8 and 0, would differ), and
    # those three given as flags
    no_method = tmp_path / "no_method.toml"
    no_method.write_text("[outer]\nmix2_rounds = 2\n[exchange]\ntimeout_s = 9\n")
    assert load_config(no_method).rounds != 3 and load_config(no_method).seed != 5
    assert resolve_config(str(no_method), method, rounds=3, seed=5) == python
    flags = ["--method", method, "--rounds", "3", "--seed", "5"]
    shown = CliRunner().invoke(main, ["config", "--config", str(no_method), *flags])
    assert shown.exit_code == 0, shown.output
    assert config_from_dict(tomllib.loads(shown.output)) == python
    assert shown.output == to_toml(python)


@pytest.mark.parametrize("method", METHODS)
def test_method_defaults_apply_in_the_constructor(method: str) -> None:
    cfg = OuterConfig(method=method)  # type: ignore[arg-type]
    assert cfg == OuterConfig.for_method(method) == config_from_dict({"outer": {"method": method}}).outer
    assert {k: getattr(cfg, k) for k in METHOD_DEFAULTS[method]} == METHOD_DEFAULTS[method]
    # explicit values win over the method's
    assert OuterConfig(method=method, outer_momentum=0.2, align_rounds=True).outer_momentum == 0.2  # type: ignore[arg-type]


def test_each_method_gets_its_own_reference_values_not_another_methods() -> None:
    assert OuterConfig(method="diloco").outer_momentum == 0.9
    assert OuterConfig().align_rounds and OuterConfig(method="factored").align_rounds
    assert not OuterConfig(method="noloco").align_rounds
    assert RunConfig().outer == OuterConfig(method="factored")


def test_method_flag_changes_only_the_method(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[outer]\nmethod = "factored"\nnum_inner_steps = 7\nouter_momentum = 0.3\nmix2_every = 4\n'
        "overlap = false\n[exchange]\nquorum_fraction = 1.0\nmix1_grace_s = 2.5\n",
    )
    cfg = resolve_config(str(path), "diloco")
    file_cfg = load_config(path)
    assert cfg.outer.method == "diloco"
    assert (cfg.outer.num_inner_steps, cfg.outer.outer_momentum, cfg.outer.mix2_every) == (7, 0.3, 4)
    in_file = ExchangeConfig(quorum_fraction=1.0, mix1_grace_s=2.5, wire_dtype="float16", update_codec="int8")
    assert cfg.exchange == file_cfg.exchange == in_file  # the codecs: the default run's
    # factored's default (on), not set in the file: DiLoCo's applies, off without overlap
    assert not cfg.outer.align_rounds
    # a value the file leaves unset takes the default run's value, else the new method's reference
    path.write_text('[outer]\nmethod = "factored"\nnum_inner_steps = 7\n')
    assert resolve_config(str(path), "diloco").outer == OuterConfig(
        method="diloco", num_inner_steps=7, overlap=True, land_at_step=3
    )
    assert resolve_config(str(path), "diloco").outer.align_rounds  # DiLoCo's own, with overlap


def test_rounds_and_seed_flags_override_the_file() -> None:
    cfg = resolve_config(None, rounds=2, seed=5)
    default = load_config()
    assert cfg == dataclasses.replace(default, rounds=2, seed=5)


def test_the_packaged_default_is_the_default_run() -> None:
    cfg = load_config()
    assert (cfg.rounds, cfg.outer.num_inner_steps, cfg.outer.method) == (15, 20, "diloco")
    # the shipped exchange: the whole group, int8 pseudo-gradients, 16-bit models
    ex = cfg.exchange
    assert (ex.quorum_fraction, ex.update_codec, ex.wire_dtype) == (1.0, "int8", "float16")
    assert resolve_config(None) == cfg == config_from_dict(tomllib.loads(default_config_text()))
    assert not (ROOT / "peers" / "default.toml").exists(), "one default config, not two that can drift"


def test_to_toml_round_trips_every_section() -> None:
    cfg = RunConfig(
        inner=InnerConfig(betas=(0.8, 0.99), bf16=True),
        outer=OuterConfig(method="noloco", gamma=0.3),
        exchange=ExchangeConfig(wire_dtype="float16", quorum_fraction=1.0),
        network=NetworkConfig(view_period_s=1.0, heartbeat_ttl_s=5.0),
    )
    assert config_from_dict(tomllib.loads(to_toml(cfg))) == cfg


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[data]\nbatch_size = 8.5", r"data\.batch_size=8\.5: expected an integer"),
        ("rounds = 2.5", r"rounds=2\.5: expected an integer"),
        ('[inner]\nbf16 = "yes"', r"inner\.bf16='yes': expected true or false"),
        ("[inner]\nbetas = 0.9", r"inner\.betas=0\.9: expected a list of 2 values"),
        ('[inner]\nbetas = [0.9, "x"]', r"inner\.betas\[1\]='x': expected a number"),
        ("[data]\nbatch_size = true", r"data\.batch_size=True: expected an integer"),
        ("[data]\ncorpus = 3", r"data\.corpus=3: expected a string"),
        (
            '[outer]\nmethod = "allreduce"',
            r"outer\.method='allreduce': choose one of factored, noloco, diloco",
        ),
        ('[exchange]\nwire_dtype = "int8"', r"exchange\.wire_dtype='int8': choose one of float32, float16"),
        ('[outer]\ngamma = "big"', r"outer\.gamma='big': expected a number or unset"),
        (
            "[network]\nheartbeat_ttl_s = 1.0",
            r"network\.heartbeat_ttl_s=1\.0 must exceed network\.view_period_s",
        ),
    ],
)
def test_wrong_types_name_the_field(toml: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, toml))


def test_wrong_types_from_python_name_the_field_too() -> None:
    with pytest.raises(ConfigError, match=r"data\.batch_size=8\.5: expected an integer"):
        DataConfig(batch_size=8.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"rounds=2\.5: expected an integer"):
        RunConfig(rounds=2.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"inner\.betas=0\.9: expected a list of 2 values"):
        InnerConfig(betas=0.9)  # type: ignore[arg-type]


def test_numbers_are_normalised_so_sources_compare_equal() -> None:
    assert InnerConfig(lr=1, betas=[0.9, 0.95]) == InnerConfig(lr=1.0, betas=(0.9, 0.95))  # type: ignore[arg-type]
    assert isinstance(InnerConfig(lr=1).lr, float)  # type: ignore[arg-type]
    assert isinstance(InnerConfig(betas=[0.9, 0.95]).betas, tuple)  # type: ignore[arg-type]


def test_unknown_keys_and_sections_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['exchange_timeout_s'\]"):
        config_from_dict({"outer": {"exchange_timeout_s": 5.0}})
    with pytest.raises(ConfigError, match="unknown key 'net'"):
        config_from_dict({"net": {}})


def test_old_outer_exchange_keys_say_where_they_moved() -> None:
    with pytest.raises(ConfigError, match=r"exchange_timeout_s -> \[exchange\] timeout_s"):
        config_from_dict({"outer": {"exchange_timeout_s": 5.0}})
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"outer": {"method": "diloco", "quorum_fraction": 1.0, "grace_min_s": 0.5}})
    assert "moved to the [exchange] table: grace_min_s -> [exchange] grace_min_s, quorum_fraction" in str(
        caught.value
    )
    with pytest.raises(ConfigError, match=r"pause_bound_s is not set: it follows from \[exchange\]"):
        config_from_dict({"outer": {"pause_bound_s": 30.0}})
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"exchange": {"exchange_timeout_s": 5.0}})
    assert "moved" not in str(caught.value)  # only [outer] keys of the old layout get the hint
    # every new name is a real [exchange] key, and each one loads there with its old value
    exchange_fields = {f.name for f in dataclasses.fields(ExchangeConfig)}
    assert set(MOVED_TO_EXCHANGE.values()) <= exchange_fields
    assert config_from_dict({"exchange": {"timeout_s": 5.0}}).exchange.timeout_s == 5.0


def test_pause_bound_comes_from_the_exchange_section() -> None:
    assert ExchangeConfig(quorum_wait_max_s=4.0, grace_max_s=2.0).pause_bound_s == 10.0
    assert ExchangeConfig(timeout_s=3.0).pause_bound_s == 3.0


def test_a_file_is_read_over_the_default_run(tmp_path: Path) -> None:
    """A file that names only its model still gets the default run's method, H, codecs and quorum
    (as default.toml has them), not the fields' own defaults (factored, float32, quorum 0.5)."""
    path = _write(tmp_path, '[model]\narch = "llama"\nd_model = 64\n')
    cfg = load_config(path)
    assert (cfg.model.arch, cfg.model.d_model, cfg.model.n_layers) == ("llama", 64, 4)
    assert (cfg.rounds, cfg.outer.method, cfg.outer.num_inner_steps) == (15, "diloco", 20)
    assert (cfg.exchange.quorum_fraction, cfg.exchange.wire_dtype, cfg.exchange.update_codec) == (
        1.0,
        "float16",
        "int8",
    )
    assert check_config_file(path) == []
    # the file's own values win, field by field; [outer] fields neither sets take the method's
    path.write_text('[exchange]\nupdate_codec = "int4"\n[outer]\nmethod = "noloco"\n')
    cfg = load_config(path)
    assert (cfg.exchange.update_codec, cfg.exchange.wire_dtype) == ("int4", "float16")
    assert (cfg.outer.method, cfg.outer.num_inner_steps, cfg.outer.outer_momentum) == ("noloco", 20, 0.5)
