"""An exclusive lock on a directory that one process writes at a time (``eval.run``'s ``--out``).

:class:`DirLock` holds a non-blocking ``flock`` on ``DIR/.lock`` (the file name of the trainer's run-directory
lock, ``rundir/checks.RunDirLock``, a subclass, so a training and an evaluation into one directory exclude each other too)
for as long as the ``with`` block runs; a second process is refused with one line naming the option, the
holder's pid and the fix. :meth:`DirLock.check_free` refuses early (before a long model load) without creating
anything. The kernel drops the lock when the process ends, however it ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from adora_openrlhf.errors import ConfigError

LOCK_FILE = ".lock"


class DirLock:
    """Exclusive lock on ``path/.lock`` (creates ``path``); ConfigError ``{option}: ... in use by {holder}`` when
    another process holds it. ``job`` says what holds the lock, for the message ("an evaluation")."""

    def __init__(self, path: Path, option: str, job: str):
        self.path = Path(path)
        self.option = option
        self.job = job
        self.handle = None

    def _refuse(self, handle) -> ConfigError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        return ConfigError(self.refusal(holder))

    def refusal(self, holder: str) -> str:
        """The one-line refusal when ``holder`` (the lock file's text: pid and job) holds the lock."""
        return f"{self.option}: {str(self.path)!r} is in use by another process ({holder}); wait for it to finish or choose another {self.option}"

    def check_free(self) -> None:
        """ConfigError now when another process holds the lock; creates nothing (the lock is taken by ``with``)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            return
        if not (self.path / LOCK_FILE).is_file():
            return  # no lock file yet: nobody holds it
        with open(self.path / LOCK_FILE, encoding="utf-8") as handle:  # closing it releases the probe
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                raise self._refuse(handle) from None

    def __enter__(self) -> DirLock:
        self.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.path / LOCK_FILE, "a+", encoding="utf-8")
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            self.handle = handle
            return self
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise self._refuse(handle) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, {self.job}\n")
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.handle.close()  # closing the descriptor releases the flock
            self.handle = None
