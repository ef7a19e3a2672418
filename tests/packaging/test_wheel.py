"""The wheel ships the tree: built from pyproject.toml, installed in a clean venv, ``check`` passes there.

The build is pip's (``pip wheel``, the PEP 517 front end the dev lock has; ``build``
is not in it), with build isolation: pyproject's ``[build-system]`` wants setuptools
>= 69, newer than the one in the venv, and pip fetches it from the package index it
is configured with. It builds a copy of the tree (what git would keep: no venv, no
``var/``), so the build's own ``build/`` and ``*.egg-info`` never land in the work tree.

The clean venv has none of the project but the wheel. Its dependencies come from
the project's own venv through a ``.pth`` line (the same interpreter, the versions
the locks pin, nothing downloaded): ``--system-site-packages`` would not isolate
anything, and installing every dependency again would take minutes. The project
itself is not installed in that venv (checked below), so every project module the
clean venv imports comes from the wheel; ``python -m django check`` runs outside
the source tree to be sure of it. It runs as an installed copy is meant to, with ``VAR_DIR``
outside the install and nothing else saying where to write: the SQLite file, the static root
and the embedded broker land there, and nothing is written under the venv (before, they were
written into site-packages, beside the installed packages).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_SHIPPED = {"tests", "bench", "scripts"}  # code that is not the product (pyproject's exclude)
DATA_DIRS = {"templates", "static"}  # read by settings beside the packages (BASE_DIR)
# What says where the probe's process writes: unset, so only its VAR_DIR does.
WHERE_TO_WRITE = {
    "DATABASE_URL", "CELERY_BROKER_URL", "BROKER_DIR", "AUDIT_ANCHOR_DIR",
    "CELERY_BEAT_SCHEDULE_FILENAME", "STATICFILES_COLLECTED", "VAR_DIR",
}  # fmt: skip

# Run by the clean venv's interpreter: ``python -m django check``, then what the installed copy holds.
PROBE = """
import json, sys
from django.core import management

management.execute_from_command_line(["django", "check"])  # what `python -m django check` runs

from django.apps import apps
from django.conf import settings
from django.contrib.staticfiles import finders
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.template.loader import get_template

packages = json.loads(sys.argv[1])
ours = {app.label for app in apps.get_app_configs() if app.name.split(".")[0] in packages}
on_disk = MigrationLoader(None, ignore_no_migrations=True).disk_migrations
connection.ensure_connection()  # the embedded SQLite file is created on first use
print(json.dumps({
    "written": [str(path) for path in (settings.VAR_DIR, connection.settings_dict["NAME"],
                settings.STATIC_ROOT, settings.BROKER_DIR, settings.AUDIT_ANCHOR_DIR,
                settings.CELERY_BEAT_SCHEDULE_FILENAME)],
    "modules": {name: __import__(name).__path__[0] for name in packages},
    "template": str(get_template("base.html").origin.name),
    "static": finders.find("console/console.css"),
    "migrations": sum(label in ours for label, _ in on_disk),
}))
"""


def files_under(root: Path) -> set[Path]:
    """Every file and directory under ``root``."""
    return set(root.rglob("*"))


def source_files() -> list[Path]:
    """The tree's files as git sees them (tracked or new, never ignored), relative to the root."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    return [Path(name) for name in listed.split("\0") if name and (ROOT / name).is_file()]


def package_data() -> list[str]:
    """pyproject's package-data patterns: the files besides modules a package ships."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-data"]["*"]


def shipped_from_source(name: Path, packages: set[str], patterns: list[str]) -> bool:
    """Whether the wheel should hold ``name``: all of templates/ and static/, and a package's modules
    and data files."""
    if name.parts[0] in DATA_DIRS:
        return True
    return name.parts[0] in packages and any(fnmatch(name.name, pattern) for pattern in ["*.py", *patterns])


def top_level_packages() -> set[str]:
    return {path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()} - NOT_SHIPPED


def build_wheel(tree: Path, out: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--quiet",
        "--wheel-dir",
        str(out),
        str(tree),
    ]
    built = subprocess.run(command, capture_output=True, text=True, timeout=240)
    if (
        built.returncode != 0
        and "No matching distribution found for setuptools" in built.stdout + built.stderr
    ):
        pytest.skip(
            "pyproject's build backend (setuptools>=69) cannot be fetched: no package index is reachable"
        )
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = out.glob("*.whl")
    return wheel


def clean_venv(at: Path) -> Path:
    """A venv of this interpreter without the project; the dependencies from the project's venv."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(at)], check=True, timeout=120)
    python = at / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_installs_in_a_clean_venv_and_passes_check_from_the_installed_copy(tmp_path):
    dependencies = Path(sysconfig.get_paths()["purelib"])
    packages = top_level_packages()
    assert not {name for name in packages | DATA_DIRS if (dependencies / name).exists()}, (
        "the project's venv holds a copy of the project: the clean venv would import it"
    )
    tree = tmp_path / "tree"
    files = source_files()
    for name in files:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)

    wheel = build_wheel(tree, tmp_path / "dist")
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name}
    patterns = package_data()
    expected = {name.as_posix() for name in files if shipped_from_source(name, packages, patterns)}
    assert shipped == expected  # every module, migration and template; no test, bench, script or lock

    python = clean_venv(tmp_path / "venv")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    environment = {
        key: value for key, value in os.environ.items() if key != "PYTHONPATH" and key not in WHERE_TO_WRITE
    }
    var = tmp_path / "var"
    before = files_under(tmp_path / "venv")
    ran = subprocess.run(
        [str(python), str(probe), json.dumps(sorted(packages))],
        cwd=tmp_path, env={**environment, "DJANGO_SETTINGS_MODULE": "config.settings", "VAR_DIR": str(var)},
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "System check identified no issues" in ran.stdout
    facts = json.loads(ran.stdout.strip().splitlines()[-1])
    venv = str(tmp_path / "venv")
    assert files_under(tmp_path / "venv") - before == set()  # nothing written in the install
    assert all(path.startswith(str(var)) for path in facts["written"]), facts["written"]
    assert {"demo.sqlite3", "staticfiles", "broker"} <= {path.name for path in var.iterdir()}
    assert set(facts["modules"]) == packages
    assert all(path.startswith(venv) for path in facts["modules"].values()), facts["modules"]
    assert facts["template"].startswith(venv) and facts["static"].startswith(venv), facts
    assert facts["migrations"] == sum(1 for name in files if name.parent.name == "migrations" and (
        name.name[0].isdigit() and name.suffix == ".py" and name.parts[0] in packages
    ))  # fmt: skip
