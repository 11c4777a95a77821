"""Run configuration: one frozen dataclass per component, nested in `RunConfig`.

Every field is documented under it, type-checked against its annotation (`checks.check_fields`)
and validated in `__post_init__` with a message that says what to change. A method's reference
hyperparameters (`METHOD_DEFAULTS`) fill the `OuterConfig` fields left unset, in the constructor,
so Python, TOML and command-line flags give the same config. `load_config` reads a TOML file;
unknown keys are errors, not silently ignored. The default run ships inside the package
(`p2p_trainer/config/default.toml`), so an installed copy runs the same default as a checkout.
"""

from p2p_trainer.config.checks import ConfigError
from p2p_trainer.config.run import METHOD_DEFAULTS, METHODS, Method, OuterConfig, RunConfig
from p2p_trainer.config.sections import (
    WIRE_DTYPES,
    DataConfig,
    ExchangeConfig,
    InnerConfig,
    ModelConfig,
    NetworkConfig,
    WireDtype,
)
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.config.toml_io import (
    SECTIONS,
    config_from_dict,
    default_config_text,
    load_config,
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
    "ExchangeConfig",
    "InnerConfig",
    "Method",
    "ModelConfig",
    "NetworkConfig",
    "OuterConfig",
    "RunConfig",
    "SecurityConfig",
    "WireDtype",
    "config_from_dict",
    "default_config_text",
    "load_config",
    "read_toml",
    "to_toml",
]
