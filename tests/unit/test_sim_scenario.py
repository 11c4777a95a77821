"""Scenario validation and TOML loading."""

from pathlib import Path

import pytest

from p2p_trainer.lab.sim.scenario import Scenario, ScenarioError, load_scenario


def test_defaults_are_valid() -> None:
    assert Scenario().validate() == Scenario()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_chips": 100, "num_peers": 16}, "multiple of num_peers"),
        ({"chips_per_slice": 512}, "lower chips_per_slice"),
        ({"step_s": 0.0}, "step_s=0.0"),
        ({"quorum_fraction": 1.5}, "quorum_fraction"),
        ({"allreduce": "mesh"}, "ring"),
        ({"methods": ("diloco", "magic")}, "subset"),
    ],
)
def test_invalid_values_say_what_to_change(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        Scenario(**kwargs).validate()  # type: ignore[arg-type]


def test_toml_loading(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[scenario]\nnum_chips = 1024\nnum_peers = 4\nmtbi_chip_s = 1e6\nmethods = ["noloco"]\n')
    s = load_scenario(path)
    assert (s.num_chips, s.num_peers, s.mtbi_chip_s, s.methods) == (1024, 4, 1e6, ("noloco",))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_chipz = 5\n", "unknown scenario keys"),
        ('num_chips = "many"\n', "must be an integer"),
        ("num_chips = [\n", "not valid TOML"),
        ("num_chips = 1000\nnum_peers = 3\n", "multiple"),
    ],
)
def test_toml_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_shipped_scenarios_load() -> None:
    shipped = sorted(Path(__file__).parents[2].glob("bench/scenarios/*.toml"))
    assert shipped, "bench/scenarios/*.toml should ship example scenarios"
    for path in shipped:
        load_scenario(path)
