"""Read replicas (``config/db_router.py``) without a replica: what routes where, and when a page may read it.

In ``make test`` (no ``cluster`` marker): WAL positions compared, the decision
of a page between replica and primary, the ``replica`` alias the settings build
from ``DATABASE_REPLICA_URL`` (none when it is empty), and the router. No
``replica`` alias exists here, so a query the router sent to the replica would
fail (``ConnectionDoesNotExist``): the claims, heartbeats, the worker's steps and
an approval's decision, run *inside* a page marked to read the replica, prove
they stay on the primary. The real standby is ``test_replica_reads.py`` (``make
cluster-test``).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import environ
import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from audit.models import TransitionEvent
from config import db_router, dsn
from config.db_router import ReplicaRouter, ReplicaState, choose, lsn, lsn_text
from tasks import leases
from tasks.models import Task
from tenancy.models import Membership
from tests.cluster.test_pooler_settings import settings_printed

ROUTERS = ["config.db_router.ReplicaRouter"]


@contextlib.contextmanager
def inside_a_replica_page() -> Iterator[None]:
    """What the middleware does for a GET of a listed page while the replica may be read."""
    token = db_router._page.set(db_router.Page(None, use=True))
    try:
        yield
    finally:
        db_router._page.reset(token)


# --- WAL positions and the decision ---------------------------------------------------------------


def test_wal_positions_compare_as_postgresql_orders_them():
    assert lsn("0/0") == 0
    assert lsn("0/16B3748") < lsn("0/16B3750") < lsn("1/0") < lsn("1/1") < lsn("A/0")
    assert lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    for text in ("0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF"):
        assert lsn_text(lsn(text)) == text
    for bad in ("", "16", "16/", "/1", "G/0", "1/2/3"):
        with pytest.raises(ValueError, match="not a WAL position"):
            lsn(bad)


def test_a_page_reads_the_replica_only_when_it_answers_keeps_up_and_has_the_callers_write():
    caught_up = ReplicaState(replayed=lsn("0/3000"), lag=0.2)
    assert choose(caught_up, None, 5) == (True, "")
    assert choose(caught_up, lsn("0/3000"), 5) == (True, "")  # the write itself replayed
    assert choose(caught_up, lsn("0/3001"), 5) == (False, "replica behind your write")
    assert choose(None, None, 5) == (False, "replica unavailable")
    assert choose(ReplicaState(None, 0.0), None, 5) == (False, "replica is not a standby")
    assert choose(ReplicaState(lsn("0/3000"), 5.01), None, 5) == (False, "replica lags")
    assert choose(ReplicaState(lsn("0/3000"), 5.0), None, 5) == (True, "")
    assert choose(ReplicaState(lsn("0/3000"), None), None, 5) == (False, "replica lags")  # unknown
    assert choose(ReplicaState(lsn("0/3000"), 0.0), None, 0) == (True, "")


# --- settings ------------------------------------------------------------------------------------


def _settings_with(**env: str) -> subprocess.CompletedProcess[str]:
    script = (
        "from django.conf import settings; r = settings.DATABASES.get('replica'); "
        "print(sorted(settings.DATABASES), getattr(settings, 'DATABASE_ROUTERS', []), "
        "settings.DATABASE_REPLICA_MAX_LAG, r and r['TEST']['MIRROR'], r and r['PORT'], "
        "r and r['OPTIONS'].get('options'))"
    )
    return settings_printed(script, **env)


def test_without_a_replica_url_there_is_no_replica_and_no_router():
    done = _settings_with(DATABASE_URL="postgres://app@127.0.0.1:5432/app")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['default'] [] 5.0 None None None"


def test_a_replica_url_adds_the_alias_and_the_router():
    done = _settings_with(DATABASE_URL="postgres://app@127.0.0.1:5432/app",
                          DATABASE_REPLICA_URL="postgres://app@127.0.0.1:5433/app",
                          DATABASE_REPLICA_MAX_LAG="2.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "['default', 'replica'] ['config.db_router.ReplicaRouter'] 2.5 default 5433 "
        "-c default_transaction_read_only=on -c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 "
        "-c tcp_keepalives_count=3 -c tcp_user_timeout=15000"  # read-only, and a dead peer given up on
    )


def test_a_replica_that_is_not_postgresql_or_a_negative_lag_refuses_to_start():
    sqlite = _settings_with(DATABASE_URL="postgres://app@127.0.0.1:5432/app",
                            DATABASE_REPLICA_URL="sqlite:////tmp/replica.sqlite3")  # fmt: skip
    assert sqlite.returncode != 0
    assert "DATABASE_REPLICA_URL: the primary (DATABASE_URL) and the replica must both be PostgreSQL" in (
        sqlite.stderr
    )
    negative = _settings_with(DATABASE_URL="postgres://app@127.0.0.1:5432/app",
                              DATABASE_REPLICA_URL="postgres://app@127.0.0.1:5433/app",
                              DATABASE_REPLICA_MAX_LAG="-1")  # fmt: skip
    assert negative.returncode != 0
    assert "DATABASE_REPLICA_MAX_LAG must be 0 or more seconds" in negative.stderr


def test_the_replica_alias_keeps_the_primarys_connection_settings_and_never_gets_a_test_database():
    primary = {"ENGINE": "django.db.backends.postgresql", "CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True}
    replica = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "standby", "PORT": 5432}
    made = db_router.replica_settings(primary, replica, "none")
    assert made["CONN_MAX_AGE"] == 60 and made["CONN_HEALTH_CHECKS"] is True
    assert made["OPTIONS"] == {"connect_timeout": 2, "options": "-c default_transaction_read_only=on"}
    assert made["TEST"] == {"MIRROR": "default"}
    pooled = db_router.replica_settings(
        primary, {**replica, "OPTIONS": {"connect_timeout": 9}}, "transaction"
    )
    assert pooled["OPTIONS"] == {"connect_timeout": 9}  # PgBouncer refuses startup options
    with pytest.raises(ImproperlyConfigured):
        db_router.replica_settings({"ENGINE": "django.db.backends.sqlite3"}, replica, "none")


def test_several_standbys_prefer_a_standby_unless_the_url_says_otherwise():
    env = environ.Env()
    url = "postgres://app@standby1:5432,standby2:5433/app"
    primary = dsn.database_settings(env, "postgres://app@db1/app")
    several = db_router.replica_settings(primary, dsn.database_settings(env, url), "none", url)
    assert (several["HOST"], several["PORT"]) == ("standby1,standby2", "5432,5433")
    assert several["OPTIONS"]["target_session_attrs"] == "prefer-standby"
    said = f"{url}?target_session_attrs=standby"
    assert (
        db_router.replica_settings(primary, dsn.database_settings(env, said), "none", said)["OPTIONS"][
            "target_session_attrs"
        ]
        == "standby"
    )


# --- the router ----------------------------------------------------------------------------------


def test_the_router_sends_only_reads_of_the_task_apps_inside_a_marked_page_to_the_replica():
    router = ReplicaRouter()
    assert router.db_for_read(Task) == "default"  # not inside a marked page: a worker, a POST…
    with inside_a_replica_page():
        assert router.db_for_read(Task) == "replica"
        assert router.db_for_read(TransitionEvent) == "replica"
        assert router.db_for_read(ApprovalRequest) == "replica"
        # Who may see what, and who is signed in, is read on the primary.
        for model in (Session, get_user_model(), Membership):
            assert router.db_for_read(model) == "default", model
        assert router.db_for_write(Task) == "default"
        # A relation followed from a row read on the primary stays there; from the replica, it stays there.
        on_primary, on_replica = Task(), Task()
        on_primary._state.db, on_replica._state.db = "default", "replica"
        assert router.db_for_read(TransitionEvent, instance=on_primary) == "default"
        assert router.db_for_read(TransitionEvent, instance=on_replica) == "replica"
    assert router.db_for_read(Task) == "default"  # the mark ends with the page
    assert router.allow_migrate("replica", "tasks") is False
    assert router.allow_migrate("default", "tasks") is None


@pytest.mark.django_db(transaction=True)
def test_inside_a_marked_page_locks_transactions_and_writes_stay_on_the_primary():
    with override_settings(DATABASE_ROUTERS=ROUTERS), inside_a_replica_page():
        assert Task.objects.all().db == "replica"  # the control: a plain read is routed
        assert Task.objects.select_for_update().db == "default"  # a lock is routed as a write
        with transaction.atomic():
            assert Task.objects.all().db == "default"  # inside a transaction on the primary


@pytest.mark.django_db(transaction=True)
def test_claims_heartbeats_and_decisions_never_reach_the_replica_even_inside_a_marked_page(
    live_server, settings, acme, operator, approver
):
    """No ``replica`` alias exists: a query routed there would raise. Each of these runs whole."""
    from tests.approvals.conftest import drive_to_approval, fresh, pending_request
    from tests.workflow import put_order

    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    put_order("A-1")
    waiting = drive_to_approval(acme, operator)  # the worker's steps, outside any page: the primary
    with override_settings(DATABASE_ROUTERS=ROUTERS), inside_a_replica_page():
        assert Task.objects.all().db == "replica"  # the control: this context does route plain reads
        held = leases.claim_next(worker_id="w-replica-test", region="default", limit=5)
        for lease in held:
            assert leases.heartbeat(lease)
    request = pending_request(waiting)
    with override_settings(DATABASE_ROUTERS=ROUTERS), inside_a_replica_page():
        decided = approval_decide(
            request, user=fresh(approver), decision="approve", digest_seen=request.digest
        )
    assert decided.applied
    assert ApprovalRequest.objects.get(pk=request.pk).status == "approved"
