"""Multiaddr checks: a malformed value is named, with an example of a good one."""

from __future__ import annotations

import socket

import pytest

from p2p_trainer.net.addresses import (
    EXAMPLE_INITIAL_PEER,
    AddressError,
    announce_maddr,
    check_announce_host,
    free_port,
    host_maddr,
    unreachable_message,
    validate_initial_peer,
    validate_initial_peers,
)

PEER = "12D3KooWQnzt8fuWAkZdLjt9HiEYGPEP1oSy6yFy4TSk4nRr1ZUr"


@pytest.mark.parametrize(
    "value",
    [EXAMPLE_INITIAL_PEER, f"/ip6/::1/tcp/4000/p2p/{PEER}", f"/dns/boot.example.org/tcp/31337/p2p/{PEER}"],
)
def test_good_initial_peers_pass(value: str) -> None:
    assert validate_initial_peer(value) == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("127.0.0.1:31337", "malformed"),
        (f"/ip4/1.2.3/tcp/5/p2p/{PEER}", "malformed"),
        ("/ip4/127.0.0.1/tcp/31337", r"does not end with /p2p/<peer id>"),
        (f"/ip4/127.0.0.1/udp/31337/p2p/{PEER}", "needs a host"),
        ("/ip4/127.0.0.1/tcp/31337/p2p/notapeer0OIl", "malformed"),
        (f"/ip4/127.0.0.1/tcp/0/p2p/{PEER}", "port 0"),
    ],
)
def test_bad_initial_peers_are_named_with_an_example(value: str, reason: str) -> None:
    with pytest.raises(AddressError) as raised:
        validate_initial_peers([EXAMPLE_INITIAL_PEER, value])
    message = str(raised.value)
    assert repr(value) in message
    assert EXAMPLE_INITIAL_PEER in message
    assert reason.split(r"\(")[0].replace("\\", "") in message


def test_host_and_announce_addresses() -> None:
    assert host_maddr("0.0.0.0", 0) == "/ip4/0.0.0.0/tcp/0"
    assert host_maddr("::", 31337) == "/ip6/::/tcp/31337"
    assert announce_maddr("203.0.113.5", 31337) == "/ip4/203.0.113.5/tcp/31337"
    with pytest.raises(AddressError, match="needs the port the node listens on"):
        announce_maddr("203.0.113.5", 0)
    with pytest.raises(AddressError, match=r"--announce-host 'no-such-host\.invalid' does not resolve"):
        check_announce_host("no-such-host.invalid")
    with pytest.raises(AddressError, match="--host 'localhost' is not an IP address"):
        host_maddr("localhost", 0)
    with pytest.raises(AddressError, match="--port 70000 is out of range"):
        host_maddr("127.0.0.1", 70000)


def test_a_free_port_can_be_bound_and_announced() -> None:
    # --announce-host without --port: the node listens on, and announces, a port picked for it
    port = free_port("127.0.0.1")
    assert 0 < port <= 65535 and announce_maddr("203.0.113.5", port) == f"/ip4/203.0.113.5/tcp/{port}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_unreachable_message_names_every_address_and_what_to_check() -> None:
    first, second = f"/ip4/203.0.113.5/tcp/31337/p2p/{PEER}", f"/dns/boot.example/tcp/4000/p2p/{PEER}"
    message = unreachable_message((first, second), 3, "timed out")
    assert message.startswith(f"none of the initial peers answered after 3 attempt(s): {first}, {second} ")
    assert "(last error: timed out)" in message
    assert "firewalls" in message and "--announce-host" in message
