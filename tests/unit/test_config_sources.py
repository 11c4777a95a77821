"""Config precedence (flag > environment > file > default), `config show` and `config check`."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

from p2p_trainer.cli import main
from p2p_trainer.config import ConfigError, OuterConfig, config_from_dict, effective_config, load_config
from p2p_trainer.config.file_check import check_config_file
from p2p_trainer.config.sources import env_var, read_environment
from p2p_trainer.run.launcher import JoinArgs, join_argv

ROOT = Path(__file__).resolve().parents[2]
PEER = "12D3KooWQnzt8fuWAkZdLjt9HiEYGPEP1oSy6yFy4TSk4nRr1ZUr"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    path = _file(tmp_path, "rounds = 4\nseed = 2\n[data]\nbatch_size = 8\n[inner]\nlr = 0.002\n")
    env = {"P2PT_ROUNDS": "5", "P2PT_SEED": "3", "P2PT_DATA__BATCH_SIZE": "6"}
    found = effective_config(path, environ=env, seed=9)
    cfg = found.config
    assert (cfg.seed, cfg.rounds, cfg.data.batch_size, cfg.inner.lr, cfg.inner.weight_decay) == (
        9,
        5,
        6,
        0.002,
        0.0,
    )
    sources = {k: str(v) for k, v in found.sources.items()}
    assert sources["seed"] == "flag --seed"
    assert sources["rounds"] == "env P2PT_ROUNDS"
    assert sources["data.batch_size"] == "env P2PT_DATA__BATCH_SIZE"
    assert sources["inner.lr"] == f"file {path}"
    assert sources["inner.weight_decay"] == "default"
    # without the environment the file holds; without a file the packaged default run does
    assert effective_config(path).config.rounds == 4 == load_config(path).rounds
    assert str(effective_config(None).sources["rounds"]) == "default (default.toml)"


def test_method_from_the_environment_changes_only_the_method(tmp_path: Path) -> None:
    path = _file(tmp_path, '[outer]\nmethod = "factored"\nnum_inner_steps = 7\n')
    found = effective_config(path, environ={"P2PT_OUTER__METHOD": "diloco"})
    # overlap and land_at_step are the default run's (default.toml)
    assert found.config.outer == OuterConfig(method="diloco", num_inner_steps=7, overlap=True, land_at_step=3)
    assert str(found.sources["outer.outer_momentum"]) == "default (method diloco)"
    # DiLoCo aligns rounds because this run overlaps, and the source says so
    assert found.config.outer.align_rounds
    assert str(found.sources["outer.align_rounds"]) == "default (method diloco, overlapped, one fragment)"
    assert str(found.sources["outer.num_inner_steps"]) == f"file {path}"
    # the flag wins over the variable, and the method's own defaults follow the flag's method
    flagged = effective_config(path, environ={"P2PT_OUTER__METHOD": "diloco"}, method="noloco")
    noloco = OuterConfig(method="noloco", num_inner_steps=7, overlap=True, land_at_step=3)
    assert flagged.config.outer == noloco and not noloco.align_rounds  # NoLoCo ignores the overlap
    assert str(flagged.sources["outer.method"]) == "flag --method"


def test_environment_values_take_each_fields_type() -> None:
    env = {
        "P2PT_INNER__BETAS": "[0.8, 0.9]",
        "P2PT_INNER__BF16": "true",
        "P2PT_EXCHANGE__WIRE_DTYPE": "bfloat16",  # strings as written, no TOML quotes
        "P2PT_DATA__CORPUS": "data/my corpus",
        "p2pt_network__view_period_s": "1",  # not the prefix: ignored
        "P2PT_exchange__timeout_s": "12",  # any case after the prefix
        "P2PT_SECURITY__ALLOW": f'["{PEER}"]',
        "P2PT_OUTER__GAMMA": "",  # empty: unset
        "P2PT_SOMETHING_ELSE": "x",  # not a config field: left alone
        "HOME": "/root",
    }
    cfg = effective_config(None, environ=env).config
    assert cfg.inner.betas == (0.8, 0.9) and cfg.inner.bf16 is True
    assert cfg.exchange.wire_dtype == "bfloat16" and cfg.exchange.timeout_s == 12.0
    assert cfg.data.corpus == "data/my corpus" and cfg.security.allow == (PEER,)
    assert cfg.network.view_period_s == 2.0 and cfg.outer.gamma is None
    assert env_var(("data", "batch_size")) == "P2PT_DATA__BATCH_SIZE" and env_var(("", "seed")) == "P2PT_SEED"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("P2PT_DATA__BATCH_SIZE", "eight", "expected an integer"),
        ("P2PT_ROUNDS", "2.5", "expected an integer"),
        ("P2PT_INNER__BF16", "yes", "expected true or false"),
        ("P2PT_INNER__BETAS", "0.9", "expected a list of 2 values"),
        ("P2PT_OUTER__METHOD", "allreduce", "choose one of factored"),
    ],
)
def test_a_variable_of_the_wrong_type_is_named_with_its_value(name: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        read_environment({name: value})
    message = str(raised.value)
    assert f"environment variable {name}={value!r}" in message and expected in message
    assert "unset it" in message
    # and on the command line: a message, exit status 1, no traceback
    got = CliRunner().invoke(main, ["config"], env={name: value})
    assert got.exit_code == 1 and name in got.output and repr(value) in got.output, got.output
    assert "Traceback" not in got.output


def test_wrong_type_message_shows_a_good_value() -> None:
    with pytest.raises(ConfigError, match=r"e\.g\. P2PT_DATA__BATCH_SIZE=16"):
        read_environment({"P2PT_DATA__BATCH_SIZE": "eight"})


def test_unknown_table_or_field_is_an_error_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"P2PT_OUTR__METHOD: there is no table \[outr\]"):
        read_environment({"P2PT_OUTR__METHOD": "diloco"})
    with pytest.raises(ConfigError, match=r"P2PT_DATA__BATCHSIZE: \[data\] has no field 'batchsize'"):
        read_environment({"P2PT_DATA__BATCHSIZE": "4"})


def test_a_value_out_of_range_names_the_variable() -> None:
    with pytest.raises(ConfigError) as raised:
        effective_config(None, environ={"P2PT_DATA__BATCH_SIZE": "-1"})
    assert "data.batch_size=-1" in str(raised.value)
    assert "environment variable P2PT_DATA__BATCH_SIZE" in str(raised.value)


def test_p2pt_config_names_the_file_and_config_flag_wins(tmp_path: Path) -> None:
    a = _file(tmp_path, "rounds = 4\n")
    b = tmp_path / "b.toml"
    b.write_text("rounds = 6\n")
    runner = CliRunner()
    got = runner.invoke(main, ["config"], env={"P2PT_CONFIG": str(a)})
    assert got.exit_code == 0 and tomllib.loads(got.output)["rounds"] == 4
    got = runner.invoke(main, ["config", "--config", str(b)], env={"P2PT_CONFIG": str(a)})
    assert tomllib.loads(got.output)["rounds"] == 6
    # `config show` takes the group's --config over its own from P2PT_CONFIG, and says so
    got = runner.invoke(main, ["config", "--config", str(b), "show"], env={"P2PT_CONFIG": str(a)})
    assert tomllib.loads(got.output)["rounds"] == 6 and f"# file {b}" in got.output


def test_config_show_prints_the_effective_config_and_each_source(tmp_path: Path) -> None:
    path = _file(tmp_path, "rounds = 4\n[data]\nbatch_size = 8\n")
    env = {"P2PT_INNER__LR": "0.005", "P2PT_ROUNDS": "5"}
    got = CliRunner().invoke(main, ["config", "show", "--config", str(path), "--seed", "3"], env=env)
    assert got.exit_code == 0, got.output
    cfg = config_from_dict(tomllib.loads(got.output))  # comments aside, the same TOML as `config`
    assert cfg == effective_config(path, environ=env, seed=3).config
    lines = {line.split("=")[0].strip(): line for line in got.output.splitlines() if "=" in line}
    assert lines["seed"].endswith("# flag --seed")
    assert lines["rounds"].endswith("# env P2PT_ROUNDS")
    assert lines["lr"].endswith("# env P2PT_INNER__LR")
    assert lines["batch_size"].endswith(f"# file {path}")
    assert lines["weight_decay"].endswith("# default")
    # what the file leaves unset comes from the default run, then the method's reference values
    assert lines["method"].endswith("# default (default.toml)") and '"diloco"' in lines["method"]
    assert lines["update_codec"].endswith("# default (default.toml)") and '"int8"' in lines["update_codec"]
    assert lines["outer_momentum"].endswith("# default (method diloco)")
    # the group's options reach the subcommand too
    got = CliRunner().invoke(main, ["config", "--config", str(path), "show"], env={})
    assert "# file " in got.output and tomllib.loads(got.output)["rounds"] == 4


def test_config_check_names_every_wrong_field_at_once(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "rounds = 0\ncolour = 1\n"
        "[data]\nbatch_size = 8.5\nval_fraction = 2\n"
        '[outer]\nmethod = "allreduce"\nwire_dtype = "float16"\nmix2_every = 0\n'
        "[network]\nview_period_s = 10\n"
        '[inner]\nbetas = [0.9, "x"]\nlr = 0.002\n',
    )
    problems = check_config_file(path)
    text = "\n".join(problems)
    for expected in (
        "unknown key 'colour'",
        "[outer] unknown key 'wire_dtype'",
        "wire_dtype -> [exchange] wire_dtype",
        "data.batch_size=8.5: expected an integer",
        "data.val_fraction=2.0",
        "outer.method='allreduce'",
        "outer.mix2_every",
        "network.view_period_s=10.0",
        "inner.betas[1]='x'",
        "rounds=0",
    ):
        assert expected in text, (expected, problems)
    assert len(problems) == 9, problems  # the moved key's hint is part of its own line
    got = CliRunner().invoke(main, ["config", "check", str(path)])
    assert got.exit_code == 1 and "9 problems" in got.output and "rounds=0" in got.output


def test_config_check_passes_good_files_and_refuses_missing_ones(tmp_path: Path) -> None:
    for path in [ROOT / "p2p_trainer" / "config" / "default.toml", *sorted((ROOT / "peers").glob("*.toml"))]:
        assert check_config_file(path) == [], path
        got = CliRunner().invoke(main, ["config", "check", str(path)], env={"P2PT_ROUNDS": "bad"})
        assert got.exit_code == 0 and "valid" in got.output, got.output  # the file alone
    missing = CliRunner().invoke(main, ["config", "check", str(tmp_path / "none.toml")])
    assert missing.exit_code == 1 and "does not exist" in missing.output
    broken = _file(tmp_path, "[data\n")
    assert "not valid TOML" in check_config_file(broken)[0]


def test_launched_peers_do_not_apply_the_environment_again(tmp_path: Path) -> None:
    # `local --method X` writes X into the peers' config; a P2PT_OUTER__METHOD in the environment
    # the peers inherit must not turn it back
    argv = join_argv(JoinArgs(tmp_path / "c.toml", tmp_path / "k.key", tmp_path / "run"), "--initial-peers A")
    assert argv[argv.index("join") + 1] == "--ignore-env"


def test_diloco_alignment_source_names_the_blocking_case(tmp_path: Path) -> None:
    path = _file(tmp_path, "[outer]\noverlap = false\nland_at_step = 0\n")
    found = effective_config(path)
    assert found.config.outer.method == "diloco" and not found.config.outer.align_rounds
    assert str(found.sources["outer.align_rounds"]) == "default (method diloco, not overlapped)"
