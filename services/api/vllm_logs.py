"""vLLM's log of a client's mistake: one line, not a traceback.

vLLM's serving layer applies the chat template with what a request sends (`messages`,
`chat_template_kwargs`, `tools`) and, when transformers raises, logs the whole traceback before it
answers 400 (`vllm/renderers/hf.py`, `safe_apply_chat_template`): anyone with a key could fill the
server's log with tracebacks, and the request's own text came with them. Records with an exception
from the loggers in CLIENT_ERROR_LOGGERS are written as one line instead: the message, the
exception's type and its first characters (escaped: services/audit/log_lines.py). The client's
answer is vLLM's, unchanged.
"""

from __future__ import annotations

import logging

from services.audit.log_lines import one_line

# vLLM's loggers that log a traceback for an error the request caused (and then answer 400).
CLIENT_ERROR_LOGGERS = ("vllm.renderers.hf",)
ERROR_CHARS = 300  # of the exception's text, in the line


class OneLineTraceback(logging.Filter):
    """Writes a record's exception as part of its one line instead of a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text = one_line(str(error))
            text = text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"
            record.msg, record.args = "%s (%s: %s)", (record.getMessage(), type(error).__name__, text)
            record.exc_info = record.exc_text = None
        return True


def one_line_client_errors() -> None:
    """Put the filter on CLIENT_ERROR_LOGGERS (once each)."""
    for name in CLIENT_ERROR_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, OneLineTraceback) for f in target.filters):
            target.addFilter(OneLineTraceback())
