"""MkDocs hook: the pages link to files beside docs/ (the benchmarks' records and plots, the README, sources) with
relative links that work on GitHub (``../bench/results/allocation/table.md``). Each such file is added to the site
as a plain file under ``_repo/``, registered under the path the link resolves to, so that the strict build finds
it (and fails on a link to a file that does not exist) instead of warning about every link out of docs/."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".git", "build", "runs", "outputs", "data", "node_modules", "__pycache__"}


class RepoFile(File):
    """A file outside docs/, copied as is (never rendered as a page)."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def _repo_files() -> list[str]:
    """Tracked files when git knows them (a clone), else every file outside hidden and build folders."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if line and (ROOT / line).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if p.is_file() and not any(part.startswith(".") or part in SKIP_DIRS for part in p.relative_to(ROOT).parts)
        ]


def on_files(files, config):
    docs = Path(config["docs_dir"]).resolve()
    prefix = docs.relative_to(ROOT).as_posix() + "/"
    for rel in _repo_files():
        if rel.startswith(prefix):
            continue
        files.append(
            RepoFile(
                f"../{rel}",
                src_dir=str(docs),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
                dest_uri=f"_repo/{rel}",
                inclusion=InclusionLevel.INCLUDED,  # "../" would match the default exclusion of dotted paths
            )
        )
    return files
