"""The GPU-node install (scripts/install_gpu.sh) keeps its order, and the install check (scripts/check_installs.sh)
runs the documented paths in CI. No network: the scripts are read, and install_gpu.sh runs with a stand-in `pip`
that records its arguments. scripts/check_installs.sh itself (pip's resolver against the index) runs in .ci/run."""

import importlib.metadata
import os
import pathlib
import re
import shlex
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPU_SCRIPT = ROOT / "scripts" / "install_gpu.sh"
CHECK_SCRIPT = ROOT / "scripts" / "check_installs.sh"


def pip_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("pip install")]


def flash_attn_pin(line: str) -> str:
    return next(word for word in shlex.split(line) if word.startswith("flash-attn=="))


def run_gpu_script(tmp_path, *args, env=None):
    """install_gpu.sh with a `pip` first on PATH that appends its arguments (and the flash-attn build switch) to a log."""
    tmp_path = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    log = tmp_path / "pip.log"
    fake = tmp_path / "bin" / "pip"
    fake.parent.mkdir(parents=True)
    fake.write_text(f'#!/usr/bin/env bash\necho "${{FLASH_ATTENTION_SKIP_CUDA_BUILD:-}}|$*" >> {log}\n')
    fake.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "FLASH_ATTENTION_SKIP_CUDA_BUILD")}
    environ |= {"PATH": f"{fake.parent}{os.pathsep}{environ['PATH']}"} | (env or {})
    proc = subprocess.run(["bash", str(GPU_SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=60)
    calls = [line.split("|", 1) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def test_gpu_script_installs_torch_then_flash_attn_without_build_isolation_then_the_cluster_stack():
    text = GPU_SCRIPT.read_text()
    assert "set -euo pipefail" in text and "pins=requirements/constraints.txt" in text
    lines = pip_lines(text)
    assert lines and all('-c "$pins"' in line for line in lines), "every pip step uses the constraints"
    words = [shlex.split(line.replace('"${dry[@]}"', "").replace('"${dry_no_isolation[@]}"', "")) for line in lines]
    packages = [[w for w in ws[2:] if not w.startswith("-") and w != "$pins"] for ws in words]
    torch_step = packages.index(["torch"])  # alone, at the pin of the constraints file
    flash_step = next(i for i, p in enumerate(packages) if any(w.startswith("flash-attn==") for w in p))
    cluster_step = next(i for i, line in enumerate(lines) if "-r requirements/cluster.txt" in line)
    build_step = next(i for i, p in enumerate(packages) if {"setuptools", "ninja", "packaging", "psutil"} <= set(p))
    assert torch_step < build_step < flash_step < cluster_step < len(lines) - 1
    assert "--no-build-isolation" in words[flash_step]
    assert "-r requirements/core.txt" in lines[cluster_step]
    assert words[-1][-2:] == ["-e", "."]
    assert "flash-attn" not in lines[cluster_step] and "torch" not in packages[cluster_step]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_gpu_script_dry_run_installs_torch_and_the_build_tools_and_only_resolves_the_rest(tmp_path, how):
    if how == "flag":
        proc, calls = run_gpu_script(tmp_path, "--dry-run")
    else:
        proc, calls = run_gpu_script(tmp_path, env={"DRY_RUN": "1"})
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 5
    (skip_torch, torch), (skip_tools, tools), *rest = calls
    assert "--dry-run" not in torch.split() and "--dry-run" not in tools.split()
    assert torch.split()[-1] == "torch"
    for skip_cuda, args in rest:
        assert skip_cuda == "TRUE" and "--dry-run" in args.split() and "-c requirements/constraints.txt" in args
    flash, cluster, package = (args.split() for _, args in rest)
    assert "--no-build-isolation" in flash and any(w.startswith("flash-attn==") for w in flash)
    # flash-attn is not installed in a dry run: the cluster step resolves it again, with torch in reach
    assert "--no-build-isolation" in cluster and "requirements/cluster.txt" in cluster
    assert package[-2:] == ["-e", "."]


def test_gpu_script_installs_for_real_without_dry_run_and_keeps_build_isolation_for_the_cluster_stack(tmp_path):
    proc, calls = run_gpu_script(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [skip for skip, _ in calls] == [""] * 5 and not any("--dry-run" in args.split() for _, args in calls)
    cluster = calls[3][1].split()
    assert "requirements/cluster.txt" in cluster and "--no-build-isolation" not in cluster
    assert "--no-build-isolation" in calls[2][1].split()
    bad, calls = run_gpu_script(tmp_path, "--dry")
    assert bad.returncode == 2 and "usage" in bad.stderr and not calls


def test_flash_attn_is_the_version_openrlhf_pins():
    pinned = flash_attn_pin(next(line for line in pip_lines(GPU_SCRIPT.read_text()) if "flash-attn==" in line))
    cluster = (ROOT / "requirements" / "cluster.txt").read_text()
    assert "openrlhf[vllm]==0.11.2" in cluster.split()
    try:
        version = importlib.metadata.version("openrlhf")
        requires = importlib.metadata.requires("openrlhf") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("openrlhf is not installed here (scripts/install_test_env.sh installs it)")
    if version != "0.11.2":
        pytest.skip(f"openrlhf {version} is installed here, not the 0.11.2 of requirements/cluster.txt")
    wanted = [r.split(";")[0].strip() for r in requires if re.match(r"flash[-_]attn\b", r) and "extra" not in r]
    assert wanted == [pinned]


def test_cluster_requirements_header_and_docs_give_the_scripts_order():
    """Wherever a file shows `pip install ... -r requirements/cluster.txt`, torch and flash-attn (without build
    isolation) come before it, and the file names scripts/install_gpu.sh."""
    files = [ROOT / "requirements" / "cluster.txt", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted(p for p in (ROOT / "recipes").rglob("*") if p.is_file())
    shown = 0
    for path in files:
        lines = [line.lstrip("# ").strip() for line in path.read_text().splitlines()]
        for i, line in enumerate(lines):
            if line.startswith("pip install") and "requirements/cluster.txt" in line:
                shown += 1
                before = [b for b in lines[:i] if b.startswith("pip install")]
                assert any(re.search(r"\btorch\s*($|#)", b) for b in before), (path, line)
                assert any("flash-attn==" in b and "--no-build-isolation" in b for b in before), (path, line)
                assert "scripts/install_gpu.sh" in path.read_text(), path
    assert shown >= 2  # requirements/cluster.txt's header and docs/gpu_cluster.md


def test_backend_doc_calls_the_script_and_shows_its_lines():
    text = (ROOT / "docs" / "gpu_cluster.md").read_text()
    section = text.split("## Install on GPU nodes", 1)[1].split("\n## ", 1)[0]
    assert "bash scripts/install_gpu.sh" in section
    script = [
        re.sub(r" +", " ", line.replace('"${dry[@]}"', "").replace('"${dry_no_isolation[@]}"', ""))
        .replace('"$pins"', "requirements/constraints.txt")
        .strip()
        for line in pip_lines(GPU_SCRIPT.read_text())
    ]
    shown = [line.split("  #")[0].strip() for line in pip_lines(section)]
    assert shown == script


def test_ci_runs_the_install_check_beside_the_suite_and_folds_in_its_status():
    ci = (ROOT / ".ci" / "run").read_text()
    launch = next(line for line in ci.splitlines() if "scripts/check_installs.sh" in line and "#" not in line)
    assert launch.rstrip().endswith("&") and "> .ci-install-check.log 2>&1" in launch
    assert 'wait "${install_check}"' in ci and "(( status == 0 )) && status=${install_check_status}" in ci
    assert ci.index("install_check=$!") < ci.index(
        "install_test_env.sh && python -m pytest"
    )  # started before the main suite


def test_install_check_runs_the_gpu_script_the_documented_trl_install_and_the_verl_script():
    check = CHECK_SCRIPT.read_text()
    assert "set -euo pipefail" in check and "paths=(gpu trl verl)" in check
    assert "bash scripts/install_gpu.sh --dry-run" in check
    assert "bash scripts/install_verl_test_env.sh --dry-run" in check
    trl = re.search(r"trl\) (pip install --dry-run .+) ;;", check)
    assert trl and "-c requirements/constraints.txt" in trl.group(1)
    documented = trl.group(1).replace(" --dry-run", "")
    assert f"`{documented}`" in (ROOT / "docs" / "integrations.md").read_text()


def test_verl_script_dry_run_resolves_the_same_two_steps():
    lines = pip_lines((ROOT / "scripts" / "install_verl_test_env.sh").read_text())
    dry = [line for line in lines if "--dry-run" in line.split()]
    real = [line for line in lines if "--dry-run" not in line.split()]
    assert len(dry) == len(real) == 2
    assert [line.replace(" --dry-run", "") for line in dry] == real


def test_install_scripts_are_valid_bash():
    for script in (GPU_SCRIPT, CHECK_SCRIPT, ROOT / "scripts" / "install_verl_test_env.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
