"""The bootstrap's address file (written atomically, waited for), names in --announce-host, and the
container healthchecks."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from p2p_trainer import healthcheck
from p2p_trainer.cli import main
from p2p_trainer.net import address_file
from p2p_trainer.net.address_file import (
    AddressFileTimeout,
    read_address_file,
    remove_address_file,
    wait_for_address_file,
    write_address_file,
)
from p2p_trainer.net.addresses import AddressError, announce_maddr, check_announce_host, resolve_host

PEER = "12D3KooWQnzt8fuWAkZdLjt9HiEYGPEP1oSy6yFy4TSk4nRr1ZUr"
A = f"/ip4/127.0.0.1/tcp/31337/p2p/{PEER}"
B = f"/ip4/10.0.0.2/tcp/31337/p2p/{PEER}"


def test_announce_host_names_resolve_to_an_ip() -> None:
    assert resolve_host("localhost", "--announce-host") == "127.0.0.1"
    assert check_announce_host("localhost") == "127.0.0.1"
    assert announce_maddr("localhost", 4000) == "/ip4/127.0.0.1/tcp/4000"
    # addresses stay as given
    assert announce_maddr("203.0.113.5", 4000) == "/ip4/203.0.113.5/tcp/4000"
    assert announce_maddr("::1", 4000) == "/ip6/::1/tcp/4000"


def test_a_name_that_does_not_resolve_is_named_in_the_error() -> None:
    with pytest.raises(AddressError) as raised:
        check_announce_host("no-such-host.invalid")
    message = str(raised.value)
    assert "--announce-host 'no-such-host.invalid' does not resolve" in message
    assert "give an IP address" in message


def test_the_address_file_is_written_whole_and_readable(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "bootstrap.addr"
    write_address_file(path, [A, B])
    assert path.read_text() == f"{A}\n{B}\n"
    assert read_address_file(path) == [A, B]
    assert (path.stat().st_mode & 0o777) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["bootstrap.addr"]  # no temporary left
    remove_address_file(path)
    remove_address_file(path)  # twice is harmless
    assert read_address_file(path) is None


def test_the_address_file_appears_in_one_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bootstrap.addr"
    write_address_file(path, [A])
    seen: list[tuple[str, str, str]] = []
    real_replace = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        # at the rename the old file is still whole, and the new text is whole beside it
        seen.append((Path(src).parent.name, Path(dst).read_text(), Path(src).read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(address_file.os, "replace", replace)
    write_address_file(path, [B])
    assert seen == [(tmp_path.name, f"{A}\n", f"{B}\n")]
    assert read_address_file(path) == [B]


def test_a_reader_never_sees_half_a_file(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.addr"
    many = [f"/ip4/10.0.{i // 250}.{i % 250}/tcp/31337/p2p/{PEER}" for i in range(400)]
    write_address_file(path, many[:1])
    done = threading.Event()

    def writer() -> None:
        for i in range(100):
            write_address_file(path, many if i % 2 else many[:1])
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    sizes = set()
    while not done.is_set():
        found = read_address_file(path)
        assert found is not None
        sizes.add(len(found))
    thread.join()
    assert sizes <= {1, len(many)}


def test_printed_text_and_comments_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "peers.txt"
    path.write_text(f"# the swarm's bootstrap nodes\n--initial-peers {A} --initial-peers {B}\n")
    assert read_address_file(path) == [A, B]
    path.write_text("\n  \n")
    assert read_address_file(path) is None  # empty: not written yet
    path.write_text("127.0.0.1:31337\n")
    with pytest.raises(AddressError, match=rf"initial peers file {path}: malformed initial peer"):
        read_address_file(path)


def test_wait_returns_once_the_file_appears(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.addr"
    timer = threading.Timer(0.5, write_address_file, args=(path, [A]))
    timer.start()
    started = time.monotonic()
    assert wait_for_address_file(path, timeout_s=10, poll_s=0.05) == [A]
    assert 0.4 < time.monotonic() - started < 5
    timer.join()


def test_wait_gives_up_with_a_message_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "never.addr"
    started = time.monotonic()
    with pytest.raises(AddressFileTimeout) as raised:
        wait_for_address_file(path, timeout_s=0.3, poll_s=0.05)
    assert time.monotonic() - started < 3
    message = str(raised.value)
    assert str(path) in message and "0.3 s" in message
    assert f"--address-file {path}" in message and "--initial-peers" in message


def test_wait_stops_when_asked(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(InterruptedError):
        wait_for_address_file(tmp_path / "never.addr", timeout_s=60, stop=stop, poll_s=0.05)
    assert time.monotonic() - started < 5


def test_join_needs_initial_peers_or_their_file(tmp_path: Path) -> None:
    got = CliRunner().invoke(main, ["join", "--run-dir", str(tmp_path / "run")])
    assert got.exit_code == 2 and "--initial-peers-file" in got.output
    options = {o for p in main.commands["join"].params for o in getattr(p, "opts", [])}
    assert {"--initial-peers-file", "--initial-peers-timeout-s"} <= options
    assert "--address-file" in {o for p in main.commands["bootstrap"].params for o in getattr(p, "opts", [])}


def test_join_reports_a_file_that_never_appears(tmp_path: Path) -> None:
    argv = ["join", "--initial-peers-file", str(tmp_path / "none.addr"), "--initial-peers-timeout-s", "0.2"]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        got = CliRunner().invoke(main, [*argv, "--run-dir", str(tmp_path / "run")])
    finally:  # join installs its stop handlers in this process
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert got.exit_code == 1 and "did not appear within 0.2 s" in got.output, got.output


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_healthchecks_pass_and_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bootstrap.addr"
    assert healthcheck.main(["--file", str(path)]) == 1
    path.write_text("")
    assert healthcheck.main(["--file", str(path)]) == 1
    write_address_file(path, [A])
    assert healthcheck.main(["--file", str(path)]) == 0
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert healthcheck.main(["--file", str(path), "--tcp", f"127.0.0.1:{port}"]) == 0
    assert healthcheck.main(["--tcp", f"127.0.0.1:{port}", "--timeout-s", "1"]) == 1
    server = http.server.HTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert healthcheck.main(["--http", f"{url}/metrics"]) == 0
        assert healthcheck.main(["--http", f"{url}/other"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert "unhealthy:" in capsys.readouterr().err
