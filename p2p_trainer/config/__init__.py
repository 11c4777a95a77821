"""Run configuration: one frozen dataclass per component, nested in `RunConfig`.

Every field is documented under it, type-checked against its annotation (`checks.check_fields`)
and validated in `__post_init__` with a message that says what to change. A method's reference
hyperparameters (`METHOD_DEFAULTS`) fill the `OuterConfig` fields left unset, in the constructor,
so Python, TOML and command-line flags give the same config. `load_config` reads a TOML file;
unknown keys are errors, not silently ignored. The default run ships inside the package
(`p2p_trainer/config/default.toml`), so an installed copy runs the same default as a checkout.

Precedence, highest first (`sources.effective_config`, which also says where each value came from):

1. a flag: `--method` ([outer] method), `--rounds`, `--seed`, `--tensorboard-dir` ([log]
   tensorboard_dir, on `join` and `local`);
2. the environment: `P2PT_<FIELD>` for the top-level fields (P2PT_SEED, P2PT_ROUNDS) and
   `P2PT_<TABLE>__<FIELD>` for a table's field (P2PT_OUTER__METHOD, P2PT_DATA__BATCH_SIZE): string
   fields as written, others as a TOML value (16, 0.5, true, [0.9, 0.95]); a wrong type or an
   unknown table or field is an error naming the variable;
3. the file: `--config FILE`, or P2PT_CONFIG where no `--config` is given;
4. the default: the packaged default run (a file is read over it, `sources.over_default_run`),
   then each field's own default, and for [outer] fields left unset the method's reference values.

`file_check.check_config_file` lists every wrong field of a file at once (`p2p-trainer config check`).
"""

from p2p_trainer.config.checks import ConfigError
from p2p_trainer.config.run import METHOD_DEFAULTS, METHODS, Method, OuterConfig, RunConfig
from p2p_trainer.config.sections import (
    WIRE_DTYPES,
    DataConfig,
    ExchangeConfig,
    InnerConfig,
    LogConfig,
    ModelConfig,
    NetworkConfig,
    WireDtype,
)
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.config.sources import EffectiveConfig, Source, effective_config, load_config
from p2p_trainer.config.toml_io import (
    SECTIONS,
    annotated_toml,
    config_from_dict,
    default_config_text,
    read_toml,
    to_toml,
)

__all__ = [
    "METHODS",
    "METHOD_DEFAULTS",
    "SECTIONS",
    "WIRE_DTYPES",
    "ConfigError",
    "DataConfig",
    "EffectiveConfig",
    "ExchangeConfig",
    "InnerConfig",
    "LogConfig",
    "Method",
    "ModelConfig",
    "NetworkConfig",
    "OuterConfig",
    "RunConfig",
    "SecurityConfig",
    "Source",
    "WireDtype",
    "annotated_toml",
    "config_from_dict",
    "default_config_text",
    "effective_config",
    "load_config",
    "read_toml",
    "to_toml",
]
