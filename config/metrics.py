"""Metrics for Prometheus at ``/metrics``: the OpenTelemetry meter provider, the database gauges, the view.

``configure()`` (called once per process by ``config.otel.configure``, and by
the view itself) sets a ``MeterProvider`` whose ``PrometheusMetricReader``
writes into this module's own registry. Two kinds of series come out:

- counters and histograms recorded where things happen (``tasks.metrics``):
  per process, so a worker's live only in that worker's memory;
- gauges read from the database when scraped (``runtime.gauges.snapshot``,
  cached ``METRICS_CACHE_SECONDS``): the ones that matter across processes,
  whatever process answers. The age of waiting tasks is a real Prometheus
  histogram written by a small collector: the OpenTelemetry API has no
  asynchronous histogram, and buckets counted by the database are exactly that.

This module sits at the bottom of the layers (beside ``audit``, below the
kernel: pyproject's ``[tool.importlinter]``) and reads no model itself. The
layer that knows the models hands it their reading at app loading
(``provide_readings``, from ``runtime.apps``); until then, and in a process
without it, the database gauges say nothing and the rest is served as usual.

Who may scrape: a request with ``Authorization: Bearer <METRICS_TOKEN>``, or
one from an address in ``METRICS_ALLOW_IPS`` (CIDRs, loopback by default) that
did not come through a proxy. A console session counts for nothing.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_safe
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=False)
# Headers a proxy adds: a request carrying one is not from the address it seems to come from.
FORWARDED = ("HTTP_FORWARDED", "HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP")

_lock = threading.Lock()
_configured = False
_scrape = threading.local()  # the snapshot of the scrape in progress on this thread


def configure() -> bool:
    """Install the meter provider and the database gauges, once per process; False when the
    OpenTelemetry SDK is disabled (``OTEL_SDK_DISABLED=true``: every instrument stays a no-op)."""
    global _configured
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    with _lock:
        if _configured:
            return True
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
        from opentelemetry.sdk.resources import Resource

        reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=REGISTRY)
        provider = MeterProvider(
            metric_readers=[reader],
            resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "durable-agents")}),
            exemplar_filter=AlwaysOffExemplarFilter(),  # the text format carries none: do not collect them
        )
        metrics.set_meter_provider(provider)
        _database_gauges(provider.get_meter("durable.gauges"))
        REGISTRY.register(WaitAgeHistogram())
        _configured = True
        return True


# --- gauges read from the database --------------------------------------------------------------------


class TaskCount(Protocol):
    """Tasks of one state and type (a quarantine reason, a runnable task's region: "" otherwise)."""

    @property
    def state(self) -> str: ...
    @property
    def task_type(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def n(self) -> int: ...


class WaitAges(Protocol):
    """Waiting tasks of one state: how many per age bucket (then the rest), and their ages added up."""

    @property
    def state(self) -> str: ...
    @property
    def counts(self) -> Sequence[int]: ...
    @property
    def total_seconds(self) -> float: ...


class Snapshot(Protocol):
    """One reading of the database, for every series of a scrape (``runtime.gauges.Snapshot``)."""

    @property
    def read_at(self) -> datetime: ...
    @property
    def took(self) -> float: ...
    @property
    def tasks(self) -> Sequence[TaskCount]: ...
    @property
    def waits(self) -> Sequence[WaitAges]: ...
    @property
    def unknown(self) -> Sequence[tuple[int, int, datetime]]: ...
    @property
    def unleased(self) -> Sequence[tuple[str, datetime]]: ...
    @property
    def alerts(self) -> Sequence[tuple[int, str, int]] | None: ...


@dataclass(frozen=True)
class Readings:
    """What the database gauges need from the layer that reads the database."""

    snapshot: Callable[[], Snapshot]  # the latest reading (cached by its provider)
    alert_kinds: Callable[[], Sequence[str]]  # every kind of alert, each reported even when none is open
    waiting_states: Sequence[str]  # the histogram's states, in order
    age_buckets: Sequence[int]  # the histogram's upper bounds in seconds (a last bucket holds the rest)


_readings: Readings | None = None


def provide_readings(readings: Readings) -> None:
    """Serve the database gauges from ``readings`` (``runtime.apps``, at app loading).

    Providing the same readings again changes nothing (``ready()`` may run twice);
    different ones are refused: one process has one source of truth for its gauges.
    """
    global _readings
    if _readings is not None and _readings != readings:
        raise ValueError("the database gauges already have their readings")
    _readings = readings


def provided_readings() -> Readings | None:
    """The readings the database gauges are served from, or None before any was provided."""
    return _readings


def _current() -> Snapshot | None:
    """The snapshot the view took for this scrape (one for every series), or None:
    the database could not be read, or this is a worker's own endpoint (``serve``), which leaves the
    database's numbers to the web processes rather than repeat them once per worker."""
    snapshot: Snapshot | None = getattr(_scrape, "snapshot", None)
    return snapshot


def _sum_by(rows: Iterable[tuple[tuple[str, ...], int]], names: tuple[str, ...]) -> list[Observation]:
    totals: dict[tuple[str, ...], int] = {}
    for key, n in rows:
        totals[key] = totals.get(key, 0) + n
    return [Observation(n, dict(zip(names, key, strict=True))) for key, n in sorted(totals.items())]


def _tasks(options: CallbackOptions) -> Iterator[Observation]:
    snapshot = _current()
    if snapshot is not None:
        yield from _sum_by((((r.state, r.task_type), r.n) for r in snapshot.tasks), ("state", "task_type"))


def _quarantined(options: CallbackOptions) -> Iterator[Observation]:
    snapshot = _current()
    if snapshot is not None:
        rows = (((r.reason,), r.n) for r in snapshot.tasks if r.state == "quarantined")
        yield from _sum_by(rows, ("reason",))


def _unknown(options: CallbackOptions) -> Iterator[Observation]:
    snapshot = _current()
    if snapshot is not None:
        yield Observation(sum(n for _, n, _ in snapshot.unknown))


def _unknown_oldest(options: CallbackOptions) -> Iterator[Observation]:
    snapshot = _current()
    if snapshot is not None:
        oldest = min((since for _, _, since in snapshot.unknown), default=None)
        yield Observation(0.0 if oldest is None else (timezone.now() - oldest).total_seconds())


def _unleased(options: CallbackOptions) -> Iterator[Observation]:
    snapshot = _current()
    if snapshot is None:
        return
    oldest = dict(snapshot.unleased)
    now = timezone.now()
    for region in sorted({r.region for r in snapshot.tasks if r.region} | {settings.WORKER_REGION}):
        entered = oldest.get(region)
        yield Observation(0.0 if entered is None else (now - entered).total_seconds(), {"region": region})


def _alerts(options: CallbackOptions) -> Iterator[Observation]:
    snapshot, readings = _current(), _readings
    if snapshot is None or snapshot.alerts is None or readings is None:
        return  # no reading, or no alert table in this deployment
    none_open = [((kind,), 0) for kind in readings.alert_kinds()]
    yield from _sum_by(none_open + [((kind,), n) for _, kind, n in snapshot.alerts], ("kind",))


def _reading(options: CallbackOptions) -> Iterator[Observation]:
    if not hasattr(_scrape, "snapshot"):
        return  # a worker's own endpoint: the web processes report the reading
    snapshot = _current()
    yield Observation(0 if snapshot is None else 1, {"check": "up"})
    if snapshot is not None:
        yield Observation(snapshot.took, {"check": "read_seconds"})
        yield Observation((timezone.now() - snapshot.read_at).total_seconds(), {"check": "age_seconds"})


def _database_gauges(meter: metrics.Meter) -> None:
    gauge = meter.create_observable_gauge
    gauge("durable_tasks", [_tasks], description="Tasks by state and task type (database)")
    gauge(
        "durable_quarantined_tasks",
        [_quarantined],
        description="Quarantined tasks by state reason (database)",
    )
    gauge("durable_unknown_outcomes", [_unknown], description="Effects whose outcome is unknown (database)")
    gauge(
        "durable_unknown_outcome_oldest_age_seconds",
        [_unknown_oldest],
        description="How long the oldest unknown outcome has been in doubt, 0 if none (database)",
    )
    gauge(
        "durable_runnable_unleased_oldest_age_seconds",
        [_unleased],
        description="Age of the oldest runnable task no worker holds, per region: doorbell and sweep lag",
    )
    gauge("durable_alerts_open", [_alerts], description="Open alerts by kind (database)")
    gauge(
        "durable_gauges",
        [_reading],
        description="The database reading behind these gauges: up, its cost, age",
    )


class WaitAgeHistogram:
    """``durable_task_wait_age_seconds``: time in state of the waiting tasks, bucketed by the database."""

    name = "durable_task_wait_age_seconds"

    def describe(self) -> list[Metric]:
        return []  # nothing read at registration

    def collect(self) -> Iterator[Metric]:
        snapshot, readings = _current(), _readings
        if snapshot is None or readings is None:
            return
        family = HistogramMetricFamily(
            self.name, "Time in state of waiting tasks, by waiting state (database)", labels=["state"]
        )
        bounds = readings.age_buckets
        for state in readings.waiting_states:
            rows = [row for row in snapshot.waits if row.state == state]
            counts = [sum(row.counts[i] for row in rows) for i in range(len(bounds) + 1)]
            buckets: list[tuple[str, float]] = []
            seen = 0
            for bound, n in zip([*map(str, map(float, bounds)), "+Inf"], counts, strict=True):
                seen += n
                buckets.append((bound, seen))
            family.add_metric([state], buckets, sum_value=sum(row.total_seconds for row in rows))
        yield family


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Serve this process's registry on ``address:port`` (``run_worker --metrics-port``): its own
    counters and histograms, for a Prometheus agent beside it. No token there, hence loopback."""
    if configure():
        from prometheus_client import start_http_server

        start_http_server(port, addr=address, registry=REGISTRY)


# --- the view -----------------------------------------------------------------------------------------


def networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``METRICS_ALLOW_IPS``, parsed (settings refuse a malformed one at start-up)."""
    return [ipaddress.ip_network(cidr, strict=False) for cidr in settings.METRICS_ALLOW_IPS]


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, credentials = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def _from_allowed_address(request: HttpRequest) -> bool:
    if any(request.META.get(header) for header in FORWARDED):
        return False  # a proxy on this host would make every outside caller look like loopback
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in networks())


def refusal(request: HttpRequest) -> HttpResponse | None:
    """None when ``request`` may scrape; else 401 (a token is configured and was not presented, or
    was wrong) or 403 (no token is configured and the address is not allowed)."""
    token, offered = settings.METRICS_TOKEN, _bearer(request)
    if token and offered is not None:
        if hmac.compare_digest(offered.encode(), token.encode()):
            return None
    elif _from_allowed_address(request):
        return None
    if token:
        log.warning("metrics refused: %s token", "wrong" if offered else "no")
        response = HttpResponse("A valid metrics token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    log.warning("metrics refused: address %s is not in METRICS_ALLOW_IPS", request.META.get("REMOTE_ADDR"))
    return HttpResponse("Metrics are not served to this address.\n", status=403, content_type="text/plain")


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = refusal(request)
    if refused is not None:
        return refused
    if not configure():
        return HttpResponse("# metrics are off: OTEL_SDK_DISABLED=true\n", content_type=CONTENT_TYPE_LATEST)
    try:
        _scrape.snapshot = None if _readings is None else _readings.snapshot()
    except DatabaseError:
        log.warning("metrics: the database reading failed", exc_info=True)
        _scrape.snapshot = None
    try:
        body = generate_latest(REGISTRY)
    finally:
        del _scrape.snapshot
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
