"""The OpenRLHF source this backend depends on is the source it was written against (openrlhf 0.11.2).

Every piece listed in ``AUDITED`` (``tests/fixtures/openrlhf/openrlhf_audit.py``) (classes we subclass, functions we
re-execute with other names, helpers answered on the CPU) has its source digest in
``tests/fixtures/openrlhf/openrlhf_audit.json``. A release that changes one of them fails here with a re-audit message: read
the change, check the override named in the message, then record the new digests with
``python tests/test_openrlhf_audit.py --update``. The version check of the launcher is tested here too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from adora_openrlhf.backends.openrlhf.compat.entry import (
    TESTED_VERSIONS,
    UNTESTED_ENV,
    check_openrlhf_version,
    installed_openrlhf_version,
)
from adora_openrlhf.config import ConfigError

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))
import openrlhf_audit as audit
from openrlhf_audit import AUDITED, source_digest

DIGESTS = Path(__file__).parent / "fixtures" / "openrlhf" / "openrlhf_audit.json"


def key(module: str, name: str) -> str:
    return f"{module}:{name}"


def current_digests() -> dict[str, str]:
    return {key(module, name): source_digest(module, name) for module, name in AUDITED}


needs_openrlhf = pytest.mark.skipif(
    installed_openrlhf_version() is None, reason="needs requirements/openrlhf-cpu-test.txt"
)


@needs_openrlhf
def test_audited_openrlhf_source_is_unchanged():
    recorded = json.loads(DIGESTS.read_text(encoding="utf-8"))
    assert recorded["openrlhf"] == installed_openrlhf_version(), (
        f"re-audit: the digests were recorded for openrlhf {recorded['openrlhf']}"
    )
    assert set(recorded["digests"]) == {key(m, n) for m, n in AUDITED}, (
        "re-audit: AUDITED and the recorded digests list different pieces"
    )
    changed = [name for name, digest in current_digests().items() if recorded["digests"][name] != digest]
    details = "; ".join(f"{name} ({AUDITED[tuple(name.split(':'))]})" for name in changed)
    assert not changed, (
        f"re-audit: openrlhf changed {details}. Read the change, fix the override, then run python tests/test_openrlhf_audit.py --update"
    )


def test_a_changed_source_is_reported(monkeypatch, tmp_path):
    """The digest follows the source text: a one-token edit of a function changes it, blank lines do not."""
    module = tmp_path / "fake_openrlhf_mod.py"
    module.write_text("def train(args):\n    return args\n\n\nclass A:\n    x = 1\n")
    monkeypatch.setattr(audit, "module_path", lambda name: module)
    before = audit.source_digest("fake_openrlhf_mod", "train")
    module.write_text("def train(args):\n\n    return args  \n\n\nclass A:\n    x = 2\n")
    assert audit.source_digest("fake_openrlhf_mod", "train") == before
    module.write_text("def train(args):\n    return None\n\n\nclass A:\n    x = 2\n")
    assert audit.source_digest("fake_openrlhf_mod", "train") != before
    with pytest.raises(LookupError, match="no top-level 'missing'"):
        audit.source_digest("fake_openrlhf_mod", "missing")


def test_version_check(monkeypatch):
    from adora_openrlhf.backends.openrlhf.compat import entry

    monkeypatch.setattr(entry, "installed_openrlhf_version", lambda: "0.11.0")
    with pytest.raises(
        ConfigError,
        match=r"openrlhf 0\.11\.0 is installed.*pip install openrlhf==0\.11\.2.*ADORA_ALLOW_UNTESTED_OPENRLHF=1",
    ):
        check_openrlhf_version({})
    assert check_openrlhf_version({UNTESTED_ENV: "1"}) == "0.11.0"
    monkeypatch.setattr(entry, "installed_openrlhf_version", lambda: None)
    with pytest.raises(ConfigError, match="openrlhf package is not installed"):
        check_openrlhf_version({UNTESTED_ENV: "1"})
    monkeypatch.setattr(entry, "installed_openrlhf_version", lambda: TESTED_VERSIONS[-1])
    assert check_openrlhf_version({}) == TESTED_VERSIONS[-1]


def test_an_untested_version_is_refused_before_openrlhf_parses(monkeypatch, capsys):
    """openrlhf 0.11.0 does not know --actor.loss_agg_mode: the launcher names the version, not argparse's error."""
    from adora_openrlhf.backends.openrlhf.compat import entry
    from adora_openrlhf.train import main

    monkeypatch.setattr(entry, "installed_openrlhf_version", lambda: "0.11.0")
    monkeypatch.delenv(UNTESTED_ENV, raising=False)
    status = main(["--backend", "openrlhf", "--recipe", "dapo-math-adora", "--print-args"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "openrlhf 0.11.0 is installed" in err and "unrecognized arguments" not in err


if __name__ == "__main__" and "--update" in sys.argv:
    DIGESTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {"openrlhf": installed_openrlhf_version(), "digests": current_digests()}
    DIGESTS.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"recorded {len(payload['digests'])} digests of openrlhf {payload['openrlhf']} in {DIGESTS}")
