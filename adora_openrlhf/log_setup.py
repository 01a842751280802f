"""Log handlers of the command-line tools.

Library code logs through ``logging.getLogger(__name__)`` and never configures handlers; each CLI
(``adora_openrlhf.train``, ``eval.run``, ``adora_openrlhf.demo``, the ``data_prep`` converters, the ``bench``
scripts) calls :func:`setup_logging` once, through :func:`adora_openrlhf.cli_errors.run_cli` or directly.

Records of this project's packages (:data:`PACKAGES`) go to stderr: INFO and above by default, DEBUG with
``--debug`` (or ``ADORA_DEBUG=1``). An INFO record is its bare message; WARNING and above are prefixed with
their level (``warning: ...``). Other libraries' loggers are left as they are. What a CLI produces (a table,
JSON) stays on stdout, and tqdm progress bars are unchanged.
"""

from __future__ import annotations

import logging
import sys

PACKAGES = ("adora_openrlhf", "eval", "data_prep", "bench")


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler that writes to the ``sys.stderr`` of the moment (so a redirected or captured stderr is used)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _LevelPrefixFormatter(logging.Formatter):
    """``message`` for INFO and below, ``warning: message`` / ``error: message`` above."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def setup_logging(debug: bool = False) -> None:
    """Send this project's log records to stderr at INFO (DEBUG when ``debug``). Calling it again replaces the
    handler it installed before, so a process that runs several CLIs (tests) keeps one."""
    handler = _StderrHandler()
    handler.setFormatter(_LevelPrefixFormatter("%(name)s: %(message)s" if debug else "%(message)s"))
    handler._adora_cli = True  # type: ignore[attr-defined]
    for name in PACKAGES:
        log = logging.getLogger(name)
        for old in [h for h in log.handlers if getattr(h, "_adora_cli", False)]:
            log.removeHandler(old)
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if debug else logging.INFO)


def ensure_logging() -> None:
    """:func:`setup_logging` at INFO unless a handler is already installed (a Ray actor process, which runs no CLI)."""
    if not any(getattr(h, "_adora_cli", False) for h in logging.getLogger(PACKAGES[0]).handlers):
        setup_logging()
