"""The package's user-error type, shared by the config and the registries without an import between them, and the
recognition of a full disk in the words of any writing library."""

from __future__ import annotations

import errno
import re


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it.

    An error about one field, made with :meth:`about`, also carries ``field`` (its dotted path in ``RunConfig``,
    e.g. ``adora.lambda_att`` or ``sampling.escalation[0].temperature``) and ``problem`` (what follows the name),
    so that a config which names the field otherwise (the TRL config's ``adora_lambda_att``) says the same with
    its own name (:meth:`named`)."""

    field: str | None = None
    problem: str | None = None

    @classmethod
    def about(cls, field_path: str, problem: str) -> ConfigError:
        """``field_path: problem``, with both kept."""
        err = cls(f"{field_path}: {problem}")
        err.field, err.problem = field_path, problem
        return err

    def named(self, name: str) -> ConfigError:
        """The same error about the field called ``name`` (an error about no one field is returned as it is)."""
        return self if self.problem is None else type(self).about(name, self.problem)


_DISK_FULL_TEXT = re.compile(r"os error 28|code: 28\b|No space left|StorageFull|quota exceeded", re.IGNORECASE)


def is_disk_full(err: BaseException) -> bool:
    """True for an error a full disk (or an exhausted quota) causes, however the writing library words it
    (``OSError`` ENOSPC / EDQUOT; safetensors' "No space left on device (os error 28)"; object stores)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return bool(_DISK_FULL_TEXT.search(str(err)))
