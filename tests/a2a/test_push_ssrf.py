"""The SSRF screen of push URLs (interop.ssrf): only global unicast, unless an operator allow-lists a host."""

from __future__ import annotations

import pytest
from django.test import override_settings

from interop import push, ssrf
from interop.models import PushDelivery
from tests.a2a.push_receiver import Receiver
from tests.conftest import make_task


def _resolves_to(*addresses: str) -> ssrf.Resolver:
    return lambda host, port: list(addresses)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/hook",
        "http://127.0.0.1/hook",
        "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped loopback
        "http://[::ffff:10.0.0.1]/hook",
        "http://[2002:a00:1::]/hook",  # 6to4 carrying 10.0.0.1
        "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 carrying 169.254.169.254
        "http://100.64.0.1/hook",  # shared address space
        "http://224.0.0.1/hook",
        "http://0.0.0.0/hook",
        "http://[fe80::1]/hook",
        "http://[fc00::1]/hook",
    ],
)
def test_screen_refuses_non_global_addresses(url: str) -> None:
    with pytest.raises(ssrf.UrlRefused) as refused:
        ssrf.screen(url)
    assert refused.value.reason == "address"


def test_screen_refuses_a_name_resolving_to_loopback() -> None:
    with pytest.raises(ssrf.UrlRefused, match="127.0.0.1"):
        ssrf.screen("https://rebind.example/hook", resolver=_resolves_to("127.0.0.1"))


def test_screen_refuses_a_name_with_one_private_address_among_public_ones() -> None:
    with pytest.raises(ssrf.UrlRefused):
        ssrf.screen("https://mixed.example/", resolver=_resolves_to("93.184.216.34", "192.168.1.5"))


def test_screen_accepts_a_global_address_and_returns_what_it_judged() -> None:
    screened = ssrf.screen("https://hooks.example/x", resolver=_resolves_to("93.184.216.34"))
    assert screened.addresses == ("93.184.216.34",)
    assert (screened.host, screened.port, screened.allow_listed) == ("hooks.example", 443, False)


def test_localhost_really_resolves_and_is_refused() -> None:
    with pytest.raises(ssrf.UrlRefused):
        ssrf.screen("http://localhost:9/hook")


@pytest.mark.parametrize(
    "url,reason",
    [
        ("ftp://93.184.216.34/x", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("http://user:pw@93.184.216.34/", "credentials"),
        ("http:///nohost", "host"),
        ("http://[::1/", "malformed"),
        ("", "malformed"),
        ("http://no-such-host.invalid/", "unresolved"),
    ],
)
def test_screen_refuses_malformed_urls(url: str, reason: str) -> None:
    with pytest.raises(ssrf.UrlRefused) as refused:
        ssrf.screen(url)
    assert refused.value.reason == reason


@override_settings(A2A_PUSH_ALLOWED_HOSTS=["127.0.0.1", "[::1]", "Internal.Example"])
@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/hook", "http://[::1]:8000/hook", "http://internal.example/hook"]
)
def test_allow_listed_hosts_pass(url: str) -> None:
    assert ssrf.screen(url, resolver=_resolves_to("10.0.0.1")).allow_listed


@override_settings(A2A_PUSH_ALLOWED_HOSTS=["127.0.0.1"])
def test_allow_list_is_exact_not_a_suffix_or_other_address() -> None:
    for url in ("http://10.0.0.1/", "http://127.0.0.2/"):
        with pytest.raises(ssrf.UrlRefused):
            ssrf.screen(url)


@pytest.mark.django_db
def test_the_send_goes_to_the_address_screened_not_to_a_second_lookup(acme, monkeypatch, settings) -> None:
    """DNS rebinding: the name passed the screen; a second lookup at connect time could name anything.
    The sender connects to the screened address, with the name in ``Host``. (The name here resolves
    only through the screen's resolver: re-resolved by the HTTP client, the send would fail.)"""
    settings.A2A_PUSH_ALLOWED_HOSTS = []
    receiver = Receiver().start()
    try:
        port = receiver.url.split(":")[2].split("/")[0]
        monkeypatch.setattr(
            ssrf, "resolve", lambda host, port: ["127.0.0.1"] if host == "rebind.test" else []
        )
        monkeypatch.setattr(ssrf, "address_refusal", lambda text: None)  # as if 127.0.0.1 were public
        task = make_task(acme)
        push.configure(task, config_id="c", url=f"http://rebind.test:{port}/hook?x=1", token="t")
        push.deliver_due()
        assert PushDelivery.objects.get(task=task).status == "delivered"
        assert receiver.received[0].headers["Host"] == f"rebind.test:{port}"
    finally:
        receiver.stop()
