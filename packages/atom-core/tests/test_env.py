"""The one rule for ATOM's boolean environment switches (atom_core.env), as the CLI and the vLLM plugin read them."""

from __future__ import annotations

import pytest

from atom_core import cli
from atom_core.env import env_flag, env_items
from atom_core.errors import UsageError

NAME = "ATOM_TEST_SWITCH"


@pytest.mark.parametrize("value", ["1", "true", "TRUE", " yes ", "on"])
def test_on(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    assert env_flag(NAME) is True


@pytest.mark.parametrize("value", ["", "0", "false", "False", "no", "off", " 0 "])
def test_off(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    assert env_flag(NAME) is False


def test_unset_is_off(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_flag(NAME) is False


def test_other_values_are_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(NAME, "maybe")
    with pytest.raises(UsageError, match=f"{NAME}='maybe'"):
        env_flag(NAME)


def test_cli_reads_atom_debug_with_the_rule(monkeypatch, capsys):
    """ATOM_DEBUG=false keeps the traceback off; a value that is no switch is a usage error (exit 2)."""
    monkeypatch.setenv(cli.DEBUG_ENV, "false")
    assert cli.main(["generate", "--model", "/nonexistent-atom-dir", "--prompt", "x"]) == 3
    assert "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv(cli.DEBUG_ENV, "maybe")
    assert cli.main(["generate", "--model", "/nonexistent-atom-dir", "--prompt", "x"]) == 2
    assert "ATOM_DEBUG='maybe'" in capsys.readouterr().err


@pytest.mark.parametrize("value, items", [("", ()), (" , ", ()), ("a", ("a",)), (" a, b ,,c", ("a", "b", "c"))])
def test_items(monkeypatch, value, items):
    monkeypatch.setenv(NAME, value)
    assert env_items(NAME) == items


def test_items_unset(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_items(NAME) == ()
