"""Key names answered without Unicode's name database (gputop.tui.textual_fixes.key_names): every answer
is the one ``unicodedata`` gives, and the monitor's keys never need the database."""

from __future__ import annotations

import string
import unicodedata

import pytest
import textual.keys
from textual.keys import KEY_TO_UNICODE_NAME, Keys, format_key, key_to_character

from gputop.tui.fleet.fleet_app import FleetApp
from gputop.tui.fleet.prom_fleet_app import PromFleetApp
from gputop.tui.monitor.app import GputopApp
from gputop.tui.monitor.keys import KEYS
from gputop.tui.textual_fixes import key_names
from tests.tui_data import run_async, scenario_snapshots, screen_text, until


def answer(call, *args):
    try:
        return call(*args)
    except (KeyError, ValueError) as exc:
        return type(exc)


def test_the_table_is_unicodes_own():
    for name, char in key_names.CHARACTERS.items():
        assert unicodedata.lookup(name) == char
    for char, name in key_names.NAMES.items():
        assert unicodedata.name(char) == name
    not_names = [*key_names.NOT_NAMES, *(f"F{n}" for n in range(1, 25)),
                 *string.ascii_uppercase, *string.digits, ""]
    for name in not_names:
        assert key_names.is_not_a_name(name)
        with pytest.raises(KeyError):
            unicodedata.lookup(name)


def every_key() -> set[str]:
    keys = {k.value for k in Keys} | set(KEY_TO_UNICODE_NAME) | set(string.printable)
    for bindings in (KEYS, GputopApp.BINDINGS, FleetApp.BINDINGS, PromFleetApp.BINDINGS):
        for binding in bindings:
            keys |= set(binding.key.split(","))
    return keys


def test_textual_reads_every_key_as_with_the_database():
    known = key_names.KNOWN
    for key in sorted(every_key()):
        name = key.rpartition("+")[2].replace("_", " ")
        assert answer(known.lookup, name) == answer(unicodedata.lookup, name), key
        for case in (name.upper(), name.lower()):
            assert answer(known.lookup, case) == answer(unicodedata.lookup, case), key
    for char in string.printable:
        assert answer(known.name, char) == answer(unicodedata.name, char), repr(char)
    key_names.install()
    ours = {key: (format_key(key), key_to_character.__wrapped__(key)) for key in every_key()}
    textual.keys.unicodedata = unicodedata
    try:
        theirs = {key: (format_key(key), key_to_character.__wrapped__(key))
                  for key in every_key()}
    finally:
        key_names.install()
    assert ours == theirs


@run_async
async def test_the_monitor_never_reads_the_name_database():
    """The footer's keys and the bindings Textual gathers on every key press: 22 lookups in
    the name database on the tour, 0.74 MiB of it faulted in."""
    before = key_names.KNOWN.from_database
    app = GputopApp(snapshots=scenario_snapshots("tour", 10))
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.frames_rendered > 0 and app.table.row_count)
        await until(pilot, lambda: "Quit" in screen_text(app).splitlines()[-1])
        for key in ("down", "up", "s", "question_mark", "escape", "slash", "escape"):
            await pilot.press(key)
            await pilot.pause()
    assert textual.keys.unicodedata is key_names.KNOWN
    assert key_names.KNOWN.from_database == before
