"""One entry, one line: control characters in what reaches the server's log or the audit log are
written as escapes, so a value a client chose (a sign-in name, a path, a header, a file name, a title)
cannot start a forged line or hide text.

`one_line` is the one function. The audit log passes every field through it (details.py), the
accounts command's table too (entries written before it), and `install_one_line_logs` makes every log
record of the process (ours, Chainlit's, uvicorn's, vLLM's serving layer's) format its message
through it, whichever call or library wrote it. A traceback stays the lines Python formats.
"""

from __future__ import annotations

import logging
import unicodedata

# Cc: C0, DEL and C1 controls (newline, carriage return, escape, NEL); Cf: invisible format characters
# (bidirectional overrides that reorder what is shown); Cs: lone surrogates (not UTF-8 at all);
# Zl, Zp: the line and paragraph separators.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

logger = logging.getLogger(__name__)


def _escape(character: str) -> str:
    if character in NAMED:
        return NAMED[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def one_line(text: str) -> str:
    """`text` with every control, format and separator character written as an escape (`\\n`,
    `\\x1b`, `\\u202e`): printable text comes back unchanged."""
    if text.isprintable():
        return text
    return "".join(
        _escape(character) if unicodedata.category(character) in ESCAPED_CATEGORIES else character
        for character in text
    )


class OneLineRecord(logging.LogRecord):
    """A log record whose message, once its arguments are put in, is one line (`one_line`)."""

    def getMessage(self) -> str:
        return one_line(super().getMessage())


def install_one_line_logs() -> None:
    """Make every log record of this process a `OneLineRecord` (idempotent)."""
    current = logging.getLogRecordFactory()
    if current is OneLineRecord:
        return
    if current is not logging.LogRecord:
        logger.warning("another log record factory is installed (%r): log lines are not escaped", current)
        return
    logging.setLogRecordFactory(OneLineRecord)
