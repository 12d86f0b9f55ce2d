"""The test bed's ports: picked where no outgoing connection can take them first."""

from __future__ import annotations

import socket

import pytest

from pdscale.testbed.localcluster import FREE_PORT_LOW, _ephemeral_ports, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_can_be_listened_on() -> None:
    # the kernel gives ephemeral ports to clients' source ends: a port picked there can be
    # taken by any connection before the component that was to listen on it starts
    low, _ = _ephemeral_ports()
    for host in ("127.0.0.1", "127.7.0.3"):  # the loop tests bind pod IPs of 127.X/16
        ports = {free_port(host) for _ in range(20)}
        assert all(FREE_PORT_LOW <= p < low for p in ports), (ports, low)
        assert len(ports) > 1  # drawn, not one fixed port
        port = ports.pop()
        with socket.socket() as s:
            s.bind((host, port))
            s.listen()


def test_a_port_someone_listens_on_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # a range of 1,000 ports of which 50 are held: 200 unchecked draws would hit one ~10 times
    from pdscale.testbed import localcluster

    low = 20000
    monkeypatch.setattr(localcluster, "FREE_PORT_LOW", low)
    monkeypatch.setattr(localcluster, "_ephemeral_ports", lambda: (low + 1000, 60999))
    taken = []
    try:
        for port in range(low, low + 1000):
            if len(taken) == 50:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            s.listen()
            taken.append(s)
        held = {s.getsockname()[1] for s in taken}
        drawn = [localcluster.free_port() for _ in range(200)]
        assert all(low <= p < low + 1000 for p in drawn)
        assert not held & set(drawn)
    finally:
        for s in taken:
            s.close()
