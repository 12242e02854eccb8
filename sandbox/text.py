"""Text that crosses the sandbox boundary: what the host accepts, and how it shows it.

Python strings can hold lone surrogates (U+D800..U+DFFF), which are not Unicode text: a UTF-8
encoder, a fast tokenizer or a terminal writer raises on them. An environment can produce them
(or a forged frame can, through a JSON escape), so the host checks every string it takes from a
child (`is_text`) and turns a failure into a typed outcome. Reasons (an environment's own error
messages) are diagnostics and are repaired instead (`clean`). Human-readable output also
escapes control characters (`for_terminal`): ESC, CR, OSC 52 and friends would otherwise let an
environment rewrite the terminal, or the clipboard, of whoever reads the transcript.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, bidirectional and other invisible format
# controls, and lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069"
                     "\ufeff\ufff9-\ufffb\ud800-\udfff]")
_UNSAFE_LINE = re.compile(_UNSAFE.pattern[:-1] + "\t\n]")


def is_text(s: str) -> bool:
    """True if `s` is valid Unicode text (encodes as strict UTF-8)."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean(s: str) -> str:
    """`s` with lone surrogates replaced and control characters escaped: safe in a log line."""
    return _UNSAFE_LINE.sub(_escape, s)


def for_terminal(s: str, one_line: bool = False) -> str:
    """`s` with every character that could drive a terminal shown as an escape (\\x1b, \\u202e)."""
    return (_UNSAFE_LINE if one_line else _UNSAFE).sub(_escape, s)


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
