"""The crash tests' fixtures: the sandbox over HTTP (the payment system whose records survive ours);
worker hosts in network namespaces and the private PostgreSQL they reach (``tests.cluster.netns``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.chaos.conftest import sandbox
from tests.chaos.standby import workspace
from tests.cluster import netns

__all__ = ["sandbox", "network", "private_server", "sandbox_relay"]

HOSTS = 2


@pytest.fixture
def network() -> Iterator[netns.Network]:
    """Two worker hosts (namespaces on veth links); deleted, with every rule cut, whatever the test did."""
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    made = netns.Network.create(HOSTS)
    try:
        yield made
    finally:
        made.destroy()


@pytest.fixture
def private_server(network) -> Iterator[netns.PrivateServer]:
    """A PostgreSQL server of this test's own, reachable from every worker host, with a ``durable``
    database (empty: ``tests.chaos.test_standby_failover.copy_schema`` fills it)."""
    root = workspace()
    server = netns.PrivateServer.create(root, listen=[h.host_ip for h in network.hosts], cidr=network.cidr)
    try:
        server.query("CREATE DATABASE durable")
        yield server
    finally:
        server.destroy()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sandbox_relay(network, sandbox, settings) -> Iterator[str]:
    """The sandbox's URL as the worker hosts dial it (a relay on each link's host end), ``{host}`` in it
    standing for the link's host-end address (which the live server is told to accept as its name)."""
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, *(h.host_ip for h in network.hosts)]
    parts = urlsplit(sandbox)
    relay = netns.Relay([h.host_ip for h in network.hosts], (parts.hostname or "127.0.0.1", parts.port or 80))
    try:
        yield f"http://{{host}}:{relay.port}{parts.path}"
    finally:
        relay.close()
