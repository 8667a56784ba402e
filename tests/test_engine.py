"""Database URLs: accepted forms, and the password never shown."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.db.engine import normalize_url, redact
from cronkeeper.errors import UsageError


@pytest.mark.parametrize("url", ["postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"])
def test_every_accepted_form_drives_psycopg(url):
    assert normalize_url(url).drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql://postgres:s3cret@127.0.0.1:1/test", "s3cret"),
        ("postgresql://postgres@127.0.0.1/test?password=xyzzy&sslmode=disable", "xyzzy"),
        ("postgresql://u:p%40ss@h/db?sslpassword=zz", "zz"),
    ],
)
def test_redact_hides_every_password(url, secret):
    assert secret not in redact(url)
    assert secret not in redact(normalize_url(url))


def test_an_unencoded_at_sign_in_the_password_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="%40"):
        normalize_url("postgresql://postgres:s3c@ret@127.0.0.1:1/test")


@pytest.mark.parametrize("command", [["migrate"], ["status"], ["history"], ["pause", "x"]])
def test_commands_against_an_unreachable_database_never_print_the_password(command):
    result = CliRunner().invoke(
        cli, [*command, "--database-url", "postgresql://postgres:s3cret@127.0.0.1:1/test?password=xyzzy"]
    )
    assert result.exit_code != 0
    assert "s3cret" not in result.output and "xyzzy" not in result.output
    assert "Traceback" not in result.output
