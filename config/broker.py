"""The embedded broker, with messages that appear whole.

kombu's filesystem transport creates a message file under its final name and then writes into it, while a
consumer in another process lists the folder, moves the file away and reads it without a lock: it can read
an empty or half-written file, fail to decode it, and take the Celery worker down (the demo lost its web
server and beat this way). Here a message is written under a name no consumer matches and renamed into
place, which the filesystem does atomically, so a consumer sees either nothing or the whole message.
``settings.CELERY_BROKER_TRANSPORT`` names this transport when the broker URL is ``filesystem://``.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

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
