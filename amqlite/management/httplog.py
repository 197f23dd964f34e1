"""The management listener's aiohttp server logger: a malformed request is one line.

aiohttp logs every request its parser refuses (a NUL in a header, a bad request line)
at ERROR with a traceback, after answering it 400. The client was told; the operator's
log should not grow a traceback per bad request anyone on the network sends, so such a
record becomes one DEBUG line. Everything else aiohttp logs passes unchanged.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

#: Given to ``web.AppRunner(logger=...)`` instead of aiohttp's global ``aiohttp.server``.
LOGGER_NAME = "amqlite.management.http"


class MalformedRequestFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        lines = (exc.message or type(exc).__name__).strip().splitlines()
        record.msg, record.args = "%s: %s", (record.getMessage(), lines[0] if lines else "")
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def server_logger() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, MalformedRequestFilter) for f in logger.filters):
        logger.addFilter(MalformedRequestFilter())
    return logger
