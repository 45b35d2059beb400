"""A user's project, for running pytest on its tests as a user would: the package
"installed" with the entry points pyproject.toml declares, so pytest finds the
`axa_queue` plugin by itself (no `-p`, no conftest).

Installing for real (`pip install`) would change the shared environment, so the project
gets a `site` folder first on its `PYTHONPATH` with a distribution's metadata
(`axa_queue-<version>.dist-info`, its `entry_points.txt` written from pyproject.toml's
`[project.entry-points.*]` tables, as a wheel's would be) and the sources next to it
through `PYTHONPATH`. `importlib.metadata` reads the first distribution of a name on
the path, so this one is what pytest sees even where the package is installed too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent

PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""
"""The user's pytest settings: pytest-asyncio runs `async def` tests."""


def entry_points_text(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """`entry_points.txt` as a wheel built from `pyproject` holds it."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    groups = dict(project.get("entry-points", {}))
    if "scripts" in project:
        groups = {"console_scripts": project["scripts"], **groups}
    lines: list[str] = []
    for group, entries in groups.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
        lines.append("")
    return "\n".join(lines)


def install(site: Path) -> None:
    """Write the distribution's metadata into `site` (see the module)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    info = site / f"axa_queue-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n",
        encoding="utf-8",
    )
    (info / "entry_points.txt").write_text(entry_points_text(), encoding="utf-8")
    (info / "top_level.txt").write_text("axa_queue\n", encoding="utf-8")


@dataclass(frozen=True)
class Outcome:
    """How pytest ended on the user's project."""

    status: int
    output: str


def run_pytest(project: Path, database_url: str, *args: str, timeout: float = 180) -> Outcome:
    """Run `python -m pytest` in `project` (its tests already written there) with the
    package installed as above and `AXA_TEST_DATABASE_URL` set to `database_url`."""
    site = project / "_site"
    install(site)
    if not (project / "pytest.ini").exists():
        (project / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "AXA_", "COV_"))
        and name not in ("DATABASE_URL", "PYTHONPATH")
    }
    env["AXA_TEST_DATABASE_URL"] = database_url
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT / "src")])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Outcome(done.returncode, done.stdout + done.stderr)
