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


def test_the_kernels_read_boolean_switches_with_the_same_rule():
    """atom_kernels cannot import atom_core: its copy of the "on" values must stay the one rule's."""
    from atom_core.env import ON
    from atom_kernels import dispatch

    assert dispatch.SWITCH_ON == ON


@pytest.mark.parametrize("value", ["1", "yes", "TRUE", " on "])
def test_kernels_switch_on_follows_the_rule(monkeypatch, value):
    from atom_kernels.dispatch import switch_on

    monkeypatch.setenv(NAME, value)
    assert switch_on(NAME)
    monkeypatch.setenv(NAME, "off")
    assert not switch_on(NAME)


def test_check_environment_checks_every_switch(monkeypatch):
    from atom_core.env import BOOLEAN_SWITCHES, KERNEL_BACKEND, check_environment

    for name in BOOLEAN_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(KERNEL_BACKEND, raising=False)
    check_environment("cpu")
    for name in BOOLEAN_SWITCHES:
        monkeypatch.setenv(name, "perhaps")
        with pytest.raises(UsageError, match=f"{name}='perhaps'"):
            check_environment()
        monkeypatch.setenv(name, "off")
    monkeypatch.setenv(KERNEL_BACKEND, "silu_and_mul=reference,rms_norm=triton")
    check_environment()  # names and backends exist
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UsageError, match="asks for 'triton' on cpu"):
        check_environment("cpu")  # but triton cannot run CPU tensors without the interpreter


@pytest.mark.parametrize("value, items", [("", ()), (" , ", ()), ("a", ("a",)), (" a, b ,,c", ("a", "b", "c"))])
def test_items(monkeypatch, value, items):
    monkeypatch.setenv(NAME, value)
    assert env_items(NAME) == items


def test_items_unset(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_items(NAME) == ()
