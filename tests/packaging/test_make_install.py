"""``make install`` / ``make install-dev`` run pip once per change of what they install from: a stamp in
the venv named by a hash of pyproject.toml and the lock makes the next install a no-op, and a changed
lock or pyproject runs pip again. Driven through real make on a throwaway venv directory and copies of the
files, with pip replaced by an echo (what ran is what make printed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIP = "echo PIP-RAN"


class Project:
    def __init__(self, tmp: Path) -> None:
        self.venv = tmp / "venv"
        self.files = {}
        for name, source in (
            ("PYPROJECT", "pyproject.toml"),
            ("RUNTIME_LOCK", "requirements/runtime.lock"),
            ("DEV_LOCK", "requirements/dev.lock"),
        ):
            self.files[name] = tmp / Path(source).name
            shutil.copy(ROOT / source, self.files[name])

    def make(self, target: str, *flags: str, fresh: bool = False) -> str:
        if not fresh:
            (self.venv / "bin").mkdir(parents=True, exist_ok=True)
            (self.venv / "bin" / "python").touch()
        done = subprocess.run(
            ["make", "--no-print-directory", *flags, target, f"VENV={self.venv}", f"PIP_INSTALL={PIP}"]
            + [f"{name}={path}" for name, path in self.files.items()],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def installs(self, target: str) -> list[str]:
        """The locks ``make target`` would install (a dry run)."""
        return [
            Path(line.split(" -r ")[1]).name
            for line in self.make(target, "-n").splitlines()
            if line.startswith(PIP)
        ]


def test_a_fresh_venv_installs_its_lock(tmp_path):
    project = Project(tmp_path)
    dry = project.make("install-dev", "-n", fresh=True)
    assert dry.index(" -m venv ") < dry.index(f"{PIP} -r {project.files['DEV_LOCK']}")
    assert project.installs("install") == ["runtime.lock"]


def test_an_install_runs_pip_once_until_its_lock_or_pyproject_changes(tmp_path):
    project = Project(tmp_path)
    assert "PIP-RAN" in project.make("install-dev")
    assert "PIP-RAN" not in project.make("install-dev")
    assert project.installs("install-dev") == []
    assert project.installs("install") == [], "the dev install holds the runtime pins"

    with project.files["DEV_LOCK"].open("a") as lock:
        lock.write("# a pin moved\n")
    assert project.installs("install-dev") == ["dev.lock"]
    assert "PIP-RAN" in project.make("install-dev")
    assert project.installs("install-dev") == []

    with project.files["PYPROJECT"].open("a") as pyproject:
        pyproject.write("# a dependency added\n")
    assert project.installs("install-dev") == ["dev.lock"]
    assert project.installs("install") == ["runtime.lock"]


def test_a_runtime_install_leaves_the_dev_install_to_run_again(tmp_path):
    project = Project(tmp_path)
    assert "PIP-RAN" in project.make("install")
    assert project.installs("install") == []
    assert project.installs("install-dev") == ["dev.lock"]

    with project.files["RUNTIME_LOCK"].open("a") as lock:
        lock.write("# a pin moved\n")
    assert project.installs("install") == ["runtime.lock"]
    assert project.installs("install-dev") == ["dev.lock"], "the dev lock holds the runtime pins"
    project.make("install-dev")
    assert project.installs("install") == []
