"""`p2p-trainer dashboard` of a running 3-peer swarm, loaded in a real headless browser (Debian's
chromium: `make test` installs it where it runs as root), and its bad input."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from p2p_trainer.config import to_toml
from p2p_trainer.net.addresses import EXAMPLE_INITIAL_PEER
from p2p_trainer.net.records import REACHABILITY
from p2p_trainer.round_log import EXCHANGE_OUTCOMES
from p2p_trainer.run.launcher import LOOPBACK, LocalSwarm, local_options
from tests.conftest import Tracker, tiny_config, wait_until

pytestmark = pytest.mark.timeout(240)

PEER_COLOURS = ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C))
"""The page's first three peer colours (`COLORS` in page.html): drawn curves show in these."""


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Dom(HTMLParser):
    """The attributes of the elements the checks read: those with an id, and the peer rows."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str]] = {}
        self.peer_rows: list[dict[str, str]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if "id" in found:
            self.by_id[found["id"]] = found
        if tag == "tr" and found.get("class") == "peer":
            self.peer_rows.append(found)

    def points(self, element_id: str) -> int:
        return int(self.by_id[element_id]["data-points"])


class Browser:
    def __init__(self, binary: str, tmp_path: Path, tracked: Tracker) -> None:
        self.binary, self.tmp_path, self.tracked, self.runs = binary, tmp_path, tracked, 0

    def run(self, url: str, *args: str) -> str:
        """Load `url`, let the page poll for 4 s of its (virtual) time, then do what `args` ask."""
        self.runs += 1
        argv = [self.binary, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars"]
        argv += [f"--user-data-dir={self.tmp_path / f'profile{self.runs}'}", "--virtual-time-budget=4000"]
        proc = self.tracked(
            subprocess.Popen(
                [*argv, *args, url],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err[-2000:]
        return out

    def dom(self, url: str) -> Dom:
        return Dom(self.run(url, "--dump-dom"))


def api(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "api/swarm", timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_the_dashboard_shows_a_running_swarm_in_a_browser(tmp_path: Path, tracked: Tracker) -> None:
    binary = chromium()
    if binary is None:
        pytest.skip("no chromium binary on PATH: `apt-get install chromium` (`make test` does, as root)")
    browser = Browser(binary, tmp_path, tracked)
    run = tmp_path / "run"
    opts = local_options(run, tiny_config("diloco", rounds=100_000), 3)
    with LocalSwarm(opts) as swarm:
        swarm.start_bootstrap()
        for i in range(3):
            swarm.start_peer(i, ["--minutes", "3"])  # stopped by the test; the bound ends a hung one
        url = swarm.start_dashboard(0)  # what `local --dashboard-port` starts
        assert url.startswith(f"http://{LOOPBACK}:")
        assert wait_until(lambda: len(api(url)["peers"]) == 3, 120), api(url)
        ids = sorted(p["peer_id"] for p in api(url)["peers"])

        first = browser.dom(url)
        assert first.by_id["app"]["data-state"] == "live" and first.by_id["app"]["data-peers"] == "3"
        assert sorted(row["data-peer-id"] for row in first.peer_rows) == ids
        # the curves grow between two loads: the server keeps the history, new heartbeats add points
        before = first.points("chart-round")
        assert wait_until(lambda: api(url)["points"] >= before + 6, 60)
        assert wait_until(lambda: api(url)["exchanges"]["recent"], 60)  # a round ended, from --run-dir
        second = browser.dom(url)
        assert sorted(row["data-peer-id"] for row in second.peer_rows) == ids
        assert second.points("chart-round") > before, (before, second.by_id["chart-round"])
        assert int(second.by_id["app"]["data-points"]) > int(first.by_id["app"]["data-points"])
        assert second.points("chart-loss") > 0 and second.points("chart-exchanges") > 0
        rounds = [int(row["data-round"]) for row in second.peer_rows]
        assert max(rounds) >= 1, rounds
        # each peer's heartbeat progress, in the API and on the page
        assert wait_until(lambda: all(p["last_exchange"] for p in api(url)["peers"]), 60), api(url)
        for p in api(url)["peers"]:
            assert p["round_steps"] == 5 and p["step"] > 0 and p["bytes_sent"] > 0, p
            assert p["reachability"] in REACHABILITY and p["last_exchange"] in EXCHANGE_OUTCOMES, p
        third = browser.dom(url)
        assert all(row["data-reachability"] in REACHABILITY for row in third.peer_rows), third.peer_rows
        assert all(row["data-last-exchange"] in EXCHANGE_OUTCOMES for row in third.peer_rows)
        assert all(int(row["data-bytes-sent"]) > 0 and int(row["data-step"]) > 0 for row in third.peer_rows)

        shot = tmp_path / "dashboard.png"
        browser.run(url, f"--screenshot={shot}", "--window-size=1200,800")
        with Image.open(shot) as image:
            assert image.size == (1200, 800)
            pixels = image.convert("RGB")
        colours = pixels.getcolors(1 << 24)
        assert colours is not None and len(colours) > 50, "a blank or uniform page"
        assert max(n for n, _ in colours) < 0.95 * 1200 * 800, "one colour fills the page"
        counts = {c: n for n, c in colours}
        assert all(counts.get(c, 0) > 50 for c in PEER_COLOURS), {c: counts.get(c) for c in PEER_COLOURS}
        dashboard = swarm.dashboard
    assert dashboard is not None and dashboard.proc.returncode == 130  # a clean stop on SIGINT


def _refused(argv: list[str], tracked: Tracker) -> str:
    proc = tracked(
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err[-2000:])
    assert not tracked.left(proc), tracked.left(proc)
    return err


def test_an_occupied_port_is_named_and_nothing_stays(tmp_path: Path, tracked: Tracker) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        cli = [sys.executable, "-m", "p2p_trainer"]
        board = [*cli, "dashboard", "--initial-peers", EXAMPLE_INITIAL_PEER, "--host", LOOPBACK]
        err = _refused([*board, "--port", str(port)], tracked)
        assert f"--port {port}: the port is already in use on {LOOPBACK}" in err, err[-2000:]
        run, config = tmp_path / "run", tmp_path / "tiny.toml"
        config.write_text(to_toml(tiny_config("diloco", rounds=2)))
        local = [*cli, "local", "--config", str(config), "--peers", "2", "--run-dir", str(run), "--no-live"]
        err = _refused([*local, "--dashboard-port", str(port)], tracked)
        assert f"--dashboard-port {port}: the port is not free" in err, err[-2000:]
    assert not (run / "bootstrap.log").exists()  # refused before the swarm started


def test_a_malformed_initial_peer_is_named_and_nothing_stays(tracked: Tracker) -> None:
    bad = "/ip4/127.0.0.1/tcp/31337"  # no /p2p/ peer id
    argv = [sys.executable, "-m", "p2p_trainer", "dashboard", "--initial-peers", bad, "--port", "0"]
    err = _refused([*argv, "--host", LOOPBACK], tracked)
    assert bad in err, err[-2000:]
