"""The package's user-error type, shared by the config and the registries without an import between them, and the
recognition of a full disk in the words of any writing library."""

from __future__ import annotations

import errno
import re


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


_DISK_FULL_TEXT = re.compile(r"os error 28|code: 28\b|No space left|StorageFull|quota exceeded", re.IGNORECASE)


def is_disk_full(err: BaseException) -> bool:
    """True for an error a full disk (or an exhausted quota) causes, however the writing library words it
    (``OSError`` ENOSPC / EDQUOT; safetensors' "No space left on device (os error 28)"; object stores)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return bool(_DISK_FULL_TEXT.search(str(err)))
