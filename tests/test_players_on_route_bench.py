"""diagnostics/players_on_route.py reads a reflection's hint as the menu command it quotes last."""

from __future__ import annotations

from diagnostics.players_on_route import hinted

MENU = ["ls", "ls -la", "cat a.py", "cd src"]


def test_the_last_quoted_menu_command_is_the_hint() -> None:
    # The reflection quotes the last command first, then its suggestion.
    assert hinted('"cat a.py" showed a.py; that was a mistake. Next: "cd src".', MENU) == "cd src"
    assert hinted('Then "ls -la".', MENU) == "ls -la"  # not its prefix "ls"
    assert hinted('Start with "ls".', MENU) == "ls"


def test_no_menu_command_quoted_is_no_hint() -> None:
    assert hinted('Now do "cat b.py".', MENU) is None  # a command the menu does not hold
    assert hinted("Now do cat a.py.", MENU) is None  # unquoted
