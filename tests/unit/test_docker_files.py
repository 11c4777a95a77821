"""The compose file, Dockerfiles and systemd unit, checked without a Docker engine or systemd.

No engine runs here, so what `docker compose up` would do is checked on the files: the services,
volumes and healthchecks, peers that read the bootstrap's address from a shared volume, identities
in volumes, and images that install the pinned torch build before the package.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from p2p_trainer.cli import main

ROOT = Path(__file__).resolve().parents[2]
TORCH_PIN = "torch==2.13.0"


def _compose(name: str = "docker-compose.yml") -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def _option(command: list[str], name: str) -> str:
    assert name in command, (name, command)
    return command[command.index(name) + 1]


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """{container path: volume} of a service's named-volume mounts."""
    return {spec.split(":")[1]: spec.split(":")[0] for spec in service["volumes"]}


def _peers(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if s["command"][0] == "join"}


def test_compose_runs_a_bootstrap_node_and_peers_with_nothing_to_copy() -> None:
    compose = _compose()
    services = compose["services"]
    boot = services["bootstrap"]
    peers = _peers(services)
    assert len(peers) >= 2
    command = [str(c) for c in boot["command"]]
    assert command[0] == "bootstrap"
    address = _option(command, "--address-file")
    assert _option(command, "--announce-host") == "bootstrap"  # the service name: resolved at start
    shared = _mounts(boot)[str(Path(address).parent)]
    for name, peer in peers.items():
        cmd = [str(c) for c in peer["command"]]
        assert _option(cmd, "--initial-peers-file") == address, name
        assert "--initial-peers" not in cmd and "INITIAL_PEERS" not in str(peer.get("environment"))
        assert _mounts(peer)[str(Path(address).parent)] == shared
        assert peer["depends_on"]["bootstrap"]["condition"] == "service_healthy"
        assert _option(cmd, "--announce-host") == name
        assert int(_option(cmd, "--wait-for-peers")) == len(peers)
        assert "--resume" in cmd
    # every service is built from the CPU Dockerfile, at the repository root's context
    for service in services.values():
        assert service["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}


def test_every_identity_sits_in_its_own_named_volume() -> None:
    compose = _compose()
    services = compose["services"]
    volumes = set(compose["volumes"])
    seen = set()
    for name, service in services.items():
        key = _option([str(c) for c in service["command"]], "--identity")
        assert not key.startswith("/tmp"), name
        volume = _mounts(service)[str(Path(key).parent)]
        assert volume in volumes, (name, volume)
        assert volume not in seen, f"{name} shares its identity volume {volume}"
        seen.add(volume)
    for service in services.values():  # and every mount is a declared volume, not a host path
        assert set(_mounts(service).values()) <= volumes


def test_every_service_has_a_healthcheck_on_what_it_serves() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        check = service["healthcheck"]
        test = [str(t) for t in check["test"]]
        assert test[:4] == ["CMD", "python", "-m", "p2p_trainer.healthcheck"], name
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name
        command = [str(c) for c in service["command"]]
        if command[0] == "bootstrap":
            assert _option(test, "--file") == _option(command, "--address-file")
            assert _option(test, "--tcp") == f"127.0.0.1:{_option(command, '--port')}"
        else:
            port = _option(command, "--metrics-port")
            assert _option(test, "--http") == f"http://127.0.0.1:{port}/metrics"


def test_the_cuda_override_swaps_the_peers_image() -> None:
    override = _compose("docker/compose.cuda.yml")
    peers = _peers(_compose()["services"])
    assert set(override["services"]) == set(peers)
    for service in override["services"].values():
        assert service["build"]["dockerfile"] == "docker/Dockerfile.cuda"
        assert service["build"]["context"] == "."  # relative to the first file: the repository root
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


def _run_lines(dockerfile: Path) -> list[str]:
    text = dockerfile.read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip().startswith("RUN ")]


@pytest.mark.parametrize(
    ("name", "index"),
    [("Dockerfile", "https://download.pytorch.org/whl/cpu"), ("Dockerfile.cuda", "$TORCH_INDEX")],
)
def test_dockerfiles_install_the_pinned_torch_before_the_package(name: str, index: str) -> None:
    path = ROOT / "docker" / name
    runs = _run_lines(path)
    torch_at = next(i for i, line in enumerate(runs) if TORCH_PIN in line)
    package_at = next(i for i, line in enumerate(runs) if re.search(r"pip install (\S+ )*\.(\s|$)", line))
    assert torch_at < package_at, runs
    assert re.search(rf'--index-url "?{re.escape(index)}"?', runs[torch_at]), runs[torch_at]
    text = path.read_text()
    assert text.index("COPY p2p_trainer") > text.index(TORCH_PIN)  # torch's layer survives code changes
    if name == "Dockerfile":
        assert "/whl/cu" not in text
    else:
        assert re.search(r"ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cu\d+", text)
    assert 'ENTRYPOINT ["p2p-trainer"]' in text


def test_the_build_context_leaves_out_the_venv_and_keys() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and "**/*.key" in ignore
    assert {"!p2p_trainer/", "!pyproject.toml", "!README.md", "!peers/"} <= set(ignore)
    copied = {
        line.split()[1]
        for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY")
    }
    assert copied <= {"pyproject.toml", "p2p_trainer", "peers"}


def test_compose_commands_are_options_the_cli_knows() -> None:
    for service in _compose()["services"].values():
        command = [str(c) for c in service["command"]]
        known = {o for p in main.commands[command[0]].params for o in getattr(p, "opts", [])}
        used = {word for word in command[1:] if word.startswith("--")}
        assert used <= known, used - known


UNIT = ROOT / "bootstrap" / "p2p-trainer-bootstrap.service"


def test_the_systemd_unit_keeps_the_key_and_writes_the_address() -> None:
    text = UNIT.read_text()
    joined = text.replace("\\\n", " ")  # systemd's line continuations
    exec_start = re.search(r"^ExecStart=(.*)$", joined, re.M)
    assert exec_start is not None
    command = exec_start.group(1).split()
    assert command[1] == "bootstrap"
    assert _option(command, "--identity").startswith("%S/p2p-trainer/")  # StateDirectory: kept
    assert _option(command, "--address-file").startswith("%t/p2p-trainer/")  # RuntimeDirectory
    for line in ("StateDirectory=p2p-trainer", "RuntimeDirectory=p2p-trainer", "Restart=on-failure"):
        assert line in text.splitlines()
    assert "143" in re.search(r"^SuccessExitStatus=(.*)$", text, re.M).group(1)  # type: ignore[union-attr]
    known = {o for p in main.commands["bootstrap"].params for o in getattr(p, "opts", [])}
    assert {w for w in command if w.startswith("--")} <= known


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # the unit's binary path is where the install steps put it; point it at this venv's to verify
    venv_cli = Path(shutil.which("p2p-trainer") or ROOT / ".venv" / "bin" / "p2p-trainer")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/p2p-trainer/bin/p2p-trainer", str(venv_cli)))
    got = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
