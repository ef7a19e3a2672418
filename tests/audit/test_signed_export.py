"""Signed exports, verified with the anchor public key alone: manage.py verify_export and the standalone
script (no Django, no chain key), against exports made by the console's real export view."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import CommandError, call_command
from django.test import Client

from audit import keys as audit_keys
from audit.export_check import read_public_keys, verify
from audit.keys import anchor_public_keys
from console import audit as audit_views
from tasks.models import Task
from tests.console.test_audit import tamper_head, task_with_history

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "verify_export.py"


def exported(user, task: Task, tmp_path: Path) -> Path:
    client = Client()
    client.force_login(user)
    response = client.get(f"/console/audit/tasks/{task.id}/export.json")
    assert response.status_code == 200
    path = tmp_path / f"export-{task.id}.json"
    path.write_bytes(b"".join(response.streaming_content))
    return path


def published_key(tmp_path: Path, capsys) -> Path:
    """The public key as an operator publishes it: ``manage.py audit_anchor --public-key``."""
    call_command("audit_anchor", "--public-key")
    path = tmp_path / "anchor.pub"
    path.write_text(capsys.readouterr().out)
    return path


def changed_byte(path: Path, version: int, field: str = "actor_id") -> None:
    """Change one byte inside the value of ``field`` of the event at ``version``."""
    lines = path.read_bytes().split(b"\n")
    number = next(n for n, line in enumerate(lines) if f'"state_version":{version},'.encode() in line)
    at = lines[number].index(f'"{field}":"'.encode()) + len(field) + 4
    line = bytearray(lines[number])
    line[at] = ord("X") if line[at] != ord("X") else ord("Y")
    lines[number] = bytes(line)
    path.write_bytes(b"\n".join(lines))


def test_a_real_export_verifies_with_the_published_public_key(auditor, acme, tmp_path, capsys):
    task = task_with_history(acme, steps=3)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)

    call_command("verify_export", str(path), "--public-key", str(key))
    out = capsys.readouterr().out
    assert out.startswith("ok:") and f"task {task.id}" in out and "4 events" in out
    call_command("verify_export", str(path))  # with the keys this host trusts
    assert "4 events" in capsys.readouterr().out
    document = json.loads(path.read_text())
    assert document["signature"]["key"] == document["signing"]["key"] in anchor_public_keys()
    assert document["chain"]["verified"] is True


def test_one_byte_changed_inside_an_event_names_that_event(auditor, acme, tmp_path, capsys):
    task = task_with_history(acme, steps=4)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)
    changed_byte(path, 3)

    with pytest.raises(CommandError) as refused:
        call_command("verify_export", str(path), "--public-key", str(key))
    assert "event v3" in str(refused.value) and refused.value.returncode == 1
    outcome = verify(path.read_bytes(), read_public_keys(key.read_text()))
    assert not outcome.ok and outcome.event == 3 and not outcome.signature


def test_a_byte_that_breaks_the_json_names_the_event_on_its_line(auditor, acme, tmp_path, capsys):
    task = task_with_history(acme, steps=2)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)
    text = path.read_bytes()
    at = text.index(b'"state_version":2,') + len(b'"state_version":2')
    path.write_bytes(text[:at] + b";" + text[at + 1 :])  # the comma after the version

    outcome = verify(path.read_bytes(), read_public_keys(key.read_text()))
    assert not outcome.ok and outcome.event == 2 and "not valid JSON" in outcome.message


def test_a_changed_signature_or_header_is_reported_as_the_signature(auditor, acme, tmp_path, capsys):
    task = task_with_history(acme, steps=1)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)
    keys = read_public_keys(key.read_text())
    original = path.read_bytes()
    document = json.loads(original)

    value = document["signature"]["value"]
    forged = value[:10] + ("A" if value[10] != "A" else "B") + value[11:]
    outcome = verify(original.replace(value.encode(), forged.encode()), keys)
    assert not outcome.ok and outcome.signature and outcome.message.startswith("signature:")

    moved = original.replace(document["exported_at"].encode(), b"2020-01-01T00:00:00.000000+00:00")
    outcome = verify(moved, keys)
    assert not outcome.ok and outcome.signature


def test_a_wrong_public_key_is_refused(auditor, acme, tmp_path, capsys):
    task = task_with_history(acme, steps=1)
    path = exported(auditor, task, tmp_path)
    other = tmp_path / "other.pub"
    other.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )

    with pytest.raises(CommandError) as refused:
        call_command("verify_export", str(path), "--public-key", str(other))
    assert str(refused.value).startswith("signature:") and "not a key you trust" in str(refused.value)


def test_an_export_from_a_host_without_the_signing_key_is_unsigned_and_refused(
    auditor, acme, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(audit_views, "export_signing_key", lambda: None)  # a web host with public keys only
    task = task_with_history(acme, steps=1)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)

    outcome = verify(path.read_bytes(), read_public_keys(key.read_text()))
    assert not outcome.ok and outcome.signature and "AUDIT_EXPORT_KEY" in outcome.message


def test_a_web_host_without_the_anchor_key_signs_with_its_export_key(
    auditor, acme, tmp_path, capsys, monkeypatch, settings
):
    """The production layout: the anchor key only on the anchor worker's host, the web tier with an
    export key of its own, whose public key the operator publishes beside the anchor keys."""
    monkeypatch.setattr(audit_keys, "held_signing_key", lambda: None)
    seed = Ed25519PrivateKey.generate()
    settings.AUDIT_EXPORT_KEY = audit_keys.encode_private(seed)
    task = task_with_history(acme, steps=2)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)

    exporter = audit_keys.fingerprint(seed.public_key())
    assert f"# export public key {exporter}" in key.read_text()
    document = json.loads(path.read_text())
    assert document["signature"]["key"] == exporter not in anchor_public_keys()
    call_command("verify_export", str(path), "--public-key", str(key))
    assert capsys.readouterr().out.startswith("ok:")
    assert run_script(str(path), "--public-key", str(key)).returncode == 0


def test_a_chain_broken_when_exported_is_signed_but_not_ok(auditor, acme, tmp_path, capsys):
    task = task_with_history(acme, steps=2)
    tamper_head(task)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)

    outcome = verify(path.read_bytes(), read_public_keys(key.read_text()))
    assert not outcome.ok and not outcome.signature
    assert json.loads(path.read_text())["chain"]["verified"] is False


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO") and k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd="/", env=env, capture_output=True, text=True, timeout=60
    )


def test_the_standalone_script_runs_without_django(auditor, acme, tmp_path, capsys):
    task = task_with_history(acme, steps=3)
    path, key = exported(auditor, task, tmp_path), published_key(tmp_path, capsys)

    ok = run_script(str(path), "--public-key", str(key))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok:") and f"task {task.id}" in ok.stdout and "4 events" in ok.stdout

    changed_byte(path, 2, field="to_state")
    failed = run_script(str(path), "--public-key", str(key))
    assert failed.returncode == 1 and "event v2" in failed.stderr

    probe = subprocess.run(  # importing and running it loads no Django
        [
            sys.executable,
            "-c",
            "import runpy, sys; script = sys.argv[1]\n"
            "sys.argv = ['v', sys.argv[2], '--public-key', sys.argv[3]]\n"
            "try:\n    runpy.run_path(script, run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code)\n"
            "print('django' in sys.modules)",
            str(SCRIPT),
            str(path),
            str(key),
        ],
        cwd="/",
        env={k: v for k, v in os.environ.items() if not k.startswith("DJANGO")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.split() == ["exit", "1", "False"], probe.stderr


def test_the_standalone_script_refuses_a_wrong_key_and_an_unreadable_file(auditor, acme, tmp_path):
    task = task_with_history(acme, steps=1)
    path = exported(auditor, task, tmp_path)
    other = tmp_path / "other.pub"
    raw = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    other.write_text(f"AUDIT_ANCHOR_PUBLIC_KEYS={base64.b64encode(raw).decode()}\n")
    wrong = run_script(str(path), "--public-key", str(other))
    assert wrong.returncode == 1 and wrong.stderr.startswith("signature:")
    missing = run_script(str(tmp_path / "nope.json"), "--public-key", str(other))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
