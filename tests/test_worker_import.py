"""`cronkeeper worker --import MODULE`: a module the worker's Python cannot find says where it
looks (its own environment, not the current directory), which the `cronkeeper` script's path
does not hold; a module found that fails on an import of its own says only its error."""

import sys

import pytest

from cronkeeper.errors import UsageError
from cronkeeper.worker.registry import import_modules


@pytest.fixture
def app_dir(tmp_path, monkeypatch):
    """An application package in a directory that is not on sys.path (as the current
    directory is not for the `cronkeeper` script)."""
    pkg = tmp_path / "newcomer_app"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "jobs.py").write_text("import newcomer_missing_dependency\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("newcomer_app")]:
        del sys.modules[name]


@pytest.mark.parametrize("name", ["newcomer_app", "newcomer_app.jobs"])
def test_a_module_not_on_the_path_names_pythonpath(app_dir, name):
    with pytest.raises(UsageError) as caught:
        import_modules([name])
    message = str(caught.value)
    assert message.startswith(f"--import {name}: ModuleNotFoundError: No module named "
                              "'newcomer_app'"), message
    assert "PYTHONPATH" in message and "current directory" in message, message


def test_a_module_missing_a_dependency_of_its_own_says_only_that(app_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(app_dir))
    with pytest.raises(UsageError) as caught:
        import_modules(["newcomer_app.jobs"])
    message = str(caught.value)
    assert message == ("--import newcomer_app.jobs: ModuleNotFoundError: No module named "
                       "'newcomer_missing_dependency'"), message
