"""The suite's own layout: every folder of tests is a package, so a folder named like a project
package (tests/replay, tests/traces, ...) is only ever `tests.replay`, and the project's packages
resolve to the project from every test."""
import importlib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.mark.parametrize("package", ["native", "replay", "traces", "synth", "analysis", "bench"])
def test_the_projects_packages_are_the_projects_not_the_tests_folders(package):
    module = importlib.import_module(package)
    where = [Path(p).resolve() for p in module.__path__]
    # bench/ is a namespace package: other checkouts on sys.path may add folders after ours.
    assert where[0] == REPO / package and not any(TESTS in p.parents for p in where), where


def test_every_folder_of_tests_is_a_package():
    folders = {path.parent for path in TESTS.rglob("test_*.py")}
    missing = [str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()]
    assert not missing, f"add an __init__.py to: {missing}"
