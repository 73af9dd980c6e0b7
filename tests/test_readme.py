"""Every code block of the README runs as written: Python scripts as scripts, pytest examples under pytest,
scenario TOML through the scenario loader, and the plan-language reference equals the generated one."""

import os
import re
import subprocess
import sys

import pytest

from meshsim.ops import reference_markdown
from meshsim.scenario.files import parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
SCRIPTS = [code for code in PYTHON if "def test_" not in code]
PYTESTS = [code for code in PYTHON if "def test_" in code]


def test_the_readme_has_python_scripts_pytest_examples_and_a_scenario():
    assert SCRIPTS and PYTESTS and any(lang == "toml" for lang, _ in BLOCKS)


@pytest.mark.parametrize("index", range(len(SCRIPTS)))
def test_every_readme_python_script_runs_as_written(tmp_path, index):
    script = tmp_path / "example.py"
    script.write_text(SCRIPTS[index])
    # from the repository's root, as the README's set-up leaves a new user
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    if "greet" in SCRIPTS[index]:
        assert "[rank3]: hello from rank 3" in out.stdout and "[0, 10, 20, 30, 40, 50, 60, 70]" in out.stdout


@pytest.mark.parametrize("index", range(len(PYTESTS)))
def test_every_readme_pytest_example_passes_under_pytest(tmp_path, index):
    (tmp_path / "test_readme_example.py").write_text(PYTESTS[index])
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_readme_example.py"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"\b1 passed\b", out.stdout)


@pytest.mark.parametrize("code", [code for lang, code in BLOCKS if lang == "toml"])
def test_every_readme_scenario_is_valid(code):
    import tomllib

    parse(tomllib.loads(code), "README.md")


def test_the_readme_plan_language_reference_is_the_generated_one():
    embedded = README.split("<!-- ops:begin -->\n", 1)[1].split("\n<!-- ops:end -->", 1)[0]
    assert embedded == reference_markdown(), "run `meshsim ops --markdown` and paste it into the README"


MAIN_GUARD_TRAP = '''
from meshsim import Cluster, Topology


def rank_times_ten():
    return dist.get_rank() * 10


if __name__ == "__main__":
    import torch.distributed as dist  # only in this process: the ranks never see it

    with Cluster(Topology(1, 2)) as cluster:
        run = cluster.run_fn(rank_times_ten)
        print(run.outcome)
        run.values
'''


def test_a_name_imported_under_the_main_guard_fails_with_a_message_that_names_it_and_the_fix(tmp_path):
    script = tmp_path / "trap.py"
    script.write_text(MAIN_GUARD_TRAP)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1 and out.stdout.strip() == "error"
    assert "the name 'dist' does not exist on the ranks" in out.stderr
    assert "if __name__ == \"__main__\":" in out.stderr and "Import it inside the function" in out.stderr
