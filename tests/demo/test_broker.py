"""The embedded broker hands a consumer whole messages only (config/broker.py): kombu's own filesystem
transport makes a message file visible before writing into it, and a consumer reading it then died on a
half-written file — the crash that stopped the demo."""

from __future__ import annotations

import os
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

import config.broker


def _connection(folder: Path) -> Connection:
    # Every folder under the test's own: kombu's default control folder is ./control, shared with
    # whatever else runs in the same directory (its exchange tables route the messages).
    return Connection(
        "filesystem://",
        transport="config.broker:Transport",
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        },
    )


def test_a_message_is_not_visible_to_a_consumer_until_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel's own put and get, as a Celery producer and worker call them: kombu's routing and its
    process-wide state (shared by every filesystem connection a test process made) stay out of it."""
    (tmp_path / "queue").mkdir()
    producer, consumer = _connection(tmp_path).default_channel, _connection(tmp_path).default_channel
    assert isinstance(producer, config.broker.Channel)  # the URL's transport, replaced by ours
    seen_while_writing: list[list[str]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        # the message is fully written under its temporary name: nothing a consumer would take yet
        seen_while_writing.append(sorted(os.listdir(tmp_path / "queue")))
        with pytest.raises(Empty):
            consumer._get("region.eu")
        real_replace(src, dst)

    monkeypatch.setattr(config.broker.os, "replace", replace)
    producer._put("region.eu", {"task": "42"})

    assert len(seen_while_writing) == 1 and seen_while_writing[0][0].endswith(".region.eu.msg.part")
    assert consumer._get("region.eu") == {"task": "42"}
    assert not [n for n in os.listdir(tmp_path / "queue") if n.endswith(".msg") or n.endswith(".part")]
