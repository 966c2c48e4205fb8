"""The Unicode names of the keys Textual looks up, answered without Unicode's name database.

Textual turns key names into characters with ``unicodedata.lookup``: for each key the footer
shows (``format_key``: "slash" -> "/"), for every key bound on the screen each time the key
bindings are gathered (``key_to_character``), and ``unicodedata.name`` for a typed
punctuation key. Each lookup probes the name database's hash table, and each probe faults
in pages of the ~1 MiB ``unicodedata`` extension: the tour's 22 lookups left 0.74 MiB of it
resident in the monitor (0.84 MiB against 0.10 for a bare Textual app).

``install`` gives ``textual.keys`` a stand-in for the module that answers those names from
the table below (ASCII punctuation, space and the control keys with a name alias) and knows
which key names are no character's name; anything else goes to ``unicodedata`` itself, so
every answer is the module's own (``tests/test_key_names.py`` checks the table against it).
"""

from __future__ import annotations

import re
import unicodedata

import textual.keys

CHARACTERS = {
    "BACKSPACE": "\x08",
    "TAB": "\t",
    "ESCAPE": "\x1b",
    "SPACE": " ",
    "EXCLAMATION MARK": "!",
    "QUOTATION MARK": '"',
    "NUMBER SIGN": "#",
    "DOLLAR SIGN": "$",
    "PERCENT SIGN": "%",
    "AMPERSAND": "&",
    "APOSTROPHE": "'",
    "LEFT PARENTHESIS": "(",
    "RIGHT PARENTHESIS": ")",
    "ASTERISK": "*",
    "PLUS SIGN": "+",
    "COMMA": ",",
    "HYPHEN-MINUS": "-",
    "FULL STOP": ".",
    "SOLIDUS": "/",
    "COLON": ":",
    "SEMICOLON": ";",
    "LESS-THAN SIGN": "<",
    "EQUALS SIGN": "=",
    "GREATER-THAN SIGN": ">",
    "QUESTION MARK": "?",
    "COMMERCIAL AT": "@",
    "LEFT SQUARE BRACKET": "[",
    "REVERSE SOLIDUS": "\\",
    "RIGHT SQUARE BRACKET": "]",
    "CIRCUMFLEX ACCENT": "^",
    "LOW LINE": "_",
    "GRAVE ACCENT": "`",
    "LEFT CURLY BRACKET": "{",
    "VERTICAL LINE": "|",
    "RIGHT CURLY BRACKET": "}",
    "TILDE": "~",
    "DELETE": "\x7f",
}
# Key names Textual tries that name no character (Textual's own names for keys).
NOT_NAMES = frozenset({
    "<ANY>", "<IGNORE>", "<SCROLL-DOWN>", "<SCROLL-UP>", "AT", "BACKSLASH", "CTRL-AT", "DOWN",
    "END", "ENTER", "GREATER THAN SIGN", "HOME", "HYPHEN MINUS", "INSERT", "LEFT",
    "LESS THAN SIGN", "MINUS", "PAGEDOWN", "PAGEUP", "PLUS", "RETURN", "RIGHT", "SLASH",
    "UNDERSCORE", "UP",
})
_FUNCTION_KEY = re.compile(r"F\d{1,2}")
# Characters' own names (control characters have only aliases: ``name`` has none for them).
NAMES = {char: name for name, char in CHARACTERS.items() if char.isprintable()}


def is_not_a_name(upper: str) -> bool:
    """No character has this (upper-case) name: one character (a letter or digit key) and
    the names of keys such as "enter" or "f5"."""
    return len(upper) <= 1 or upper in NOT_NAMES or bool(_FUNCTION_KEY.fullmatch(upper))


class KnownKeyNames:
    """What ``textual.keys`` uses of ``unicodedata``, from the table where it can."""

    from_database = 0  # questions the table could not answer

    def lookup(self, name: str) -> str:
        upper = name.upper()
        found = CHARACTERS.get(upper)
        if found is not None:
            return found
        if is_not_a_name(upper):
            raise KeyError(f"undefined character name '{name}'")
        self.from_database += 1
        return unicodedata.lookup(name)

    def name(self, char: str, *default: str) -> str:
        found = NAMES.get(char)
        if found is not None:
            return found
        self.from_database += 1
        return unicodedata.name(char, *default)

    def __getattr__(self, attribute: str):
        return getattr(unicodedata, attribute)


KNOWN = KnownKeyNames()


def install() -> None:
    textual.keys.unicodedata = KNOWN  # type: ignore[assignment]
