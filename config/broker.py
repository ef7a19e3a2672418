"""The embedded broker, with messages that appear whole.

kombu's filesystem transport creates a message file under its final name and then writes into it, while a
consumer in another process lists the folder, moves the file away and reads it without a lock: it can read
an empty or half-written file, fail to decode it, and take the Celery worker down (the demo lost its web
server and beat this way). Here a message is written under a name no consumer matches and renamed into
place, which the filesystem does atomically, so a consumer sees either nothing or the whole message.
``settings.CELERY_BROKER_TRANSPORT`` names this transport when the broker URL is ``filesystem://``.

RabbitMQ (``amqp://``, several nodes of one cluster separated by ``;``): ``Consumer`` is Celery's worker
consumer with native delayed delivery set up through the node the worker is connected to, once. Celery's
own step sets it up on every URL listed, as if each were a broker of its own, and retries a node that does
not answer for about twenty seconds, during which the worker takes no message: after a node died, every
reconnect paid that. The exchanges, queues and bindings it declares are the cluster's, not one node's,
so one live node is enough. It also publishes no worker events (``Consumer`` below).
``settings.CELERY_WORKER_CONSUMER`` names it for an ``amqp://`` broker.
"""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic
from typing import Any

from celery.worker import consumer
from celery.worker.consumer import delayed_delivery
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        # The same name kombu gives a message (ordered by time, then a uuid, then the queue): a
        # consumer takes a file only when its name ends in ".<queue>.msg", so the ".part" file is
        # invisible to it until the rename.
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.part"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel


log = logging.getLogger(__name__)


class DelayedDelivery(delayed_delivery.DelayedDelivery):
    """Native delayed delivery declared through the consumer's own connection (its current node)."""

    def start(self, c: consumer.Consumer) -> None:
        # Celery's validation and set-up of one URL (private, untyped in celery-types): only the loop
        # over every URL listed, with its retries, is replaced.
        self._validate_configuration(c.app)  # type: ignore[attr-defined]
        if c.connection is None:
            return
        try:
            self._setup_delayed_delivery(c, c.connection.as_uri(include_password=True))  # type: ignore[attr-defined]
        except Exception:  # a countdown then waits in the worker instead; the doorbell itself is fine
            log.warning(
                "could not set up native delayed delivery; the next reconnect tries again", exc_info=True
            )


class Consumer(consumer.Consumer):
    """Celery's worker consumer with the ``DelayedDelivery`` step above in place of its own, and no worker
    events or start-up sync (``--without-heartbeat --without-gossip --without-mingle``, whatever the
    command line says).

    Nothing here reads worker events (no monitor; remote control is the pidbox, not events). They were
    published from the worker's event loop with confirms, and the worker-heartbeat one every 2 s retried
    without end: a hung node kept every node from confirming it (the worker's own event queue lived on
    it) until the cluster gave up on that node (Erlang's net_ticktime, 60-90 s), and on reconnecting the
    worker first closed its event connection to the hung node; meanwhile it took no doorbell and checked
    no AMQP heartbeat. Without them the event dispatcher never connects. Mingle, after each reconnect,
    broadcast to the other workers' pidbox queues and waited for the confirm the same way (30 s each
    time); it syncs revoked task ids and logical clocks, which nothing here uses.
    """

    Blueprint = type(
        "Blueprint",
        (consumer.Consumer.Blueprint,),
        {
            "default_steps": [
                f"{__name__}:DelayedDelivery" if step.endswith(":DelayedDelivery") else step
                for step in consumer.Consumer.Blueprint.default_steps
            ]
        },
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = dict(kwargs.pop("worker_options", None) or {})
        # The steps' options, wherever they came from (the command line, the worker's defaults).
        for name in ("without_heartbeat", "without_gossip", "without_mingle"):
            kwargs.pop(name, None)
            options[name] = True
        kwargs["worker_options"] = options
        super().__init__(*args, **kwargs)
