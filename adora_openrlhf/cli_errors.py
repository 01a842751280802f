"""One line on stderr for every user error, at every entry point (``train``, ``eval.run``, ``demo``, ``data_prep``).

:class:`OneLineParser` is an ``argparse.ArgumentParser`` whose usage errors are one line
(``prog: error: argument --k: invalid int value: 'x' (see --help)``) instead of the usage block.

:func:`run_cli` calls an entry point's body and turns what a user can cause into one line on stderr and an
exit status, with no traceback (``--debug`` or ``ADORA_DEBUG=1`` re-raises to show it, and turns on DEBUG logs):

| raised                                  | exit | line                                                  |
|-----------------------------------------|------|-------------------------------------------------------|
| ``ValueError`` (ConfigError, data file) | 2    | ``error: <field or file:line>: <what is wrong>``       |
| ``OSError`` (permissions, full disk...) | 1    | ``error: cannot write|read PATH: <reason>``            |
| ``KeyboardInterrupt`` (Ctrl-C)          | 130  | ``interrupted; <how to resume>``                       |
| ``FloatingPointError`` (diverged run)   | 1    | ``error: <message>``                                   |
| any other exception                     | 1    | ``error: <type>: <message> (run again with --debug...)`` |

:func:`stdout_to_stderr` keeps stdout for an entry point's result: whatever libraries print while it runs goes
to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator, Sequence

from adora_openrlhf.errors import is_disk_full

DEBUG_ENV = "ADORA_DEBUG"


class OneLineParser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are a single stderr line (exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def command_name(module_command: str) -> str:
    """The program name a command's messages show: the console script's name when it was started as one
    (``adora-eval``), else ``module_command`` (``python -m eval.run``)."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script if script.startswith("adora-") else module_command


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error instead of one line")


def wants_debug(argv: Sequence[str] | None) -> bool:
    args = sys.argv[1:] if argv is None else list(argv)
    return "--debug" in args or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def os_error_line(err: OSError) -> str:
    """``/x/y: No space left on device (free some space)`` style text for an OSError, followed by ``; ADVICE``
    when the error carries an ``advice`` attribute (what was lost, how to continue)."""
    reason = os.strerror(err.errno) if err.errno else str(err)
    if err.errno == errno.ENOSPC:
        reason += " (free some space)"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason += " (choose a writable location)"
    advice = getattr(err, "advice", "")
    if advice:
        reason += f"; {advice}"
    path = err.filename if err.filename is not None else ""
    return f"{path}: {reason}" if path else reason


def run_cli(
    body: Callable[[], int], argv: Sequence[str] | None = None, interrupted_hint: str | Callable[[], str] = ""
) -> int:
    """Run ``body()`` and map user-caused exceptions to one stderr line and an exit status (table above).
    ``interrupted_hint`` (text, or a function giving it at the time of the interrupt) says how to resume.
    Installs the CLI log handlers first (:func:`adora_openrlhf.log_setup.setup_logging`: INFO, DEBUG with --debug)."""
    from adora_openrlhf.log_setup import setup_logging

    setup_logging(debug=wants_debug(argv))
    if wants_debug(argv):
        return body()
    try:
        return body()
    except KeyboardInterrupt:
        hint = interrupted_hint() if callable(interrupted_hint) else interrupted_hint
        print(f"interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return 130
    except OSError as err:
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 1
    except (ValueError, FloatingPointError) as err:
        text = " ".join(str(err).split()) or type(err).__name__
        print(f"error: {text}", file=sys.stderr)
        return 2 if isinstance(err, ValueError) else 1
    except Exception as err:  # noqa: BLE001 - anything else: still one line, the traceback behind --debug
        text = " ".join(str(err).split())[:300]
        if is_disk_full(err):  # a library's own words for a full disk (safetensors, tokenizers, object stores)
            print(f"error: No space left on device (free some space): {type(err).__name__}: {text}", file=sys.stderr)
            return 1
        print(f"error: {type(err).__name__}: {text} (run again with --debug for the traceback)", file=sys.stderr)
        return 1


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or closed stream
        return None


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout inside the block to stderr, so that an entry point whose result goes to
    stdout (``train``'s JSON summary) keeps stdout for it alone.

    ``sys.stdout`` is redirected (Python prints, and logging handlers created inside the block, such as the one
    deepspeed adds on import and uses for its accelerator warning); when ``sys.stdout`` is the process's own
    standard output, file descriptor 1 is pointed at stderr as well (C extensions, child processes)."""
    for stream in (sys.stdout, sys.__stdout__):
        if stream is not None:
            stream.flush()
    fd_level = sys.stdout is sys.__stdout__ and _fileno(sys.stdout) == 1 and _fileno(sys.stderr) == 2
    saved = os.dup(1) if fd_level else None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            if sys.__stdout__ is not None:
                sys.__stdout__.flush()  # what was buffered inside the block belongs to stderr
            os.dup2(saved, 1)
            os.close(saved)


def check_output_dir(path: str | os.PathLike, option: str) -> None:
    """ConfigError naming ``option`` unless ``path`` is a directory, or can be created as one, that this user
    may write (checked before anything is written)."""
    from pathlib import Path

    from adora_openrlhf.config import ConfigError

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{option}: {str(out)!r} is a file, not a directory; choose another {option}")
    probe = out
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{option}: cannot create {str(out)!r}: {str(probe)!r} is a file; choose another {option}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: cannot write in {str(probe)!r} (permission denied); choose another {option}")
