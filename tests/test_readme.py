"""Every code block of the README and of docs/ runs as written: Python scripts as scripts, pytest examples under
pytest, scenario TOML through the scenario loader and the model, shell blocks under bash, each from a copy of the
repository's root (what it writes stays there); the plan-language reference equals the generated one, and the
docs build as a site (mkdocs --strict).

The convention (docs/index.md): a block whose language is python, toml or bash runs; a `text` block (output) or
one with no language (a diagram) is shown, not run; a block that cannot run in a test says why on the line above
it, `<!-- no-test: REASON -->` (a GPU, a real cluster, an install). Blocks with the same code run once."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass

import pytest

from meshsim.ops import reference_markdown
from meshsim.scenario.files import parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
RUN = ("python", "toml", "bash")
SHOWN = ("text", "")
FENCE = re.compile(r"(?:^<!--\s*no-test:\s*(?P<why>[^\n]*?)\s*-->\n)?"  # why it cannot run, when it cannot
                   r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$", flags=re.S | re.M)
NOT_COPIED = {".git", "site", ".mypy_cache", ".pytest_cache", ".hypothesis", "meshsim-failures", "__pycache__"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    skip: str | None  # why it cannot run in a test, as the page says

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start("lang")) + 1
            found.append(Block(page, line, match.group("lang"), match.group("code"), match.group("why")))
    return found


def _once(blocks: list[Block]) -> list[Block]:
    """The blocks to run: each code once (the README repeats a page's example)."""
    first: dict[tuple[str, str], Block] = {}
    for b in blocks:
        if b.lang in RUN and b.skip is None:
            first.setdefault((b.lang, b.code), b)
    return list(first.values())


BLOCKS = _blocks()
RUNNABLE = _once(BLOCKS)
SCRIPTS = [b for b in RUNNABLE if b.lang == "python" and "def test_" not in b.code]
PYTESTS = [b for b in RUNNABLE if b.lang == "python" and "def test_" in b.code]
SCENARIOS = [b for b in RUNNABLE if b.lang == "toml"]
SHELLS = [b for b in RUNNABLE if b.lang == "bash"]


def _ids(blocks: list[Block]) -> list[str]:
    return [b.id for b in blocks]


@pytest.fixture
def sandbox(tmp_path):
    """The repository's root as a new user has it, in a folder of its own: a block's relative paths resolve, and
    what it writes (a replayed scenario, an upgraded file) lands here, not in the repository."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in os.listdir(ROOT):
        if name not in NOT_COPIED:
            os.symlink(os.path.join(ROOT, name), root / name)
    return root


def test_every_block_is_run_or_says_why_not():
    for block in BLOCKS:
        assert block.lang in RUN + SHOWN, (f"{block.id}: a ```{block.lang} block: write python, toml or bash to run "
                                           "it, text for output, or mark it <!-- no-test: REASON -->")
        assert block.skip is None or (block.lang in RUN and block.skip), f"{block.id}: no-test needs a reason"
    assert SCRIPTS and PYTESTS and SCENARIOS and SHELLS


@pytest.mark.parametrize("block", SCRIPTS, ids=_ids(SCRIPTS))
def test_every_python_script_runs_as_written(sandbox, block):
    script = sandbox / "example.py"
    script.write_text(block.code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=sandbox)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    if "greet" in block.code:
        assert "[rank3]: hello from rank 3" in out.stdout and "[0, 10, 20, 30, 40, 50, 60, 70]" in out.stdout


@pytest.mark.parametrize("block", PYTESTS, ids=_ids(PYTESTS))
def test_every_pytest_example_passes_under_pytest(tmp_path, block):
    (tmp_path / "test_readme_example.py").write_text(block.code)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_readme_example.py"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"\b1 passed\b", out.stdout)


@pytest.mark.parametrize("block", SCENARIOS, ids=_ids(SCENARIOS))
def test_every_scenario_is_valid_and_ends_as_it_expects_on_the_model(tmp_path, block):
    from meshsim import cli

    scenario = parse(tomllib.loads(block.code), block.id)
    assert scenario.format == 2, f"{block.id}: a scenario in the docs names the current format"
    path = tmp_path / "scenario.toml"
    path.write_text(block.code)
    assert cli.main(["run", str(path), "--tier", "model"]) == 0


@pytest.mark.parametrize("block", SHELLS, ids=_ids(SHELLS))
def test_every_shell_block_runs_as_written(sandbox, block):
    script = sandbox.parent / "block.sh"
    script.write_text(block.code)
    out = subprocess.run(["bash", "-e", "-o", "pipefail", str(script)], capture_output=True, text=True, timeout=300,
                         cwd=sandbox)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]  # (a failure shown on purpose: `|| echo`)


def test_the_plan_language_reference_is_the_generated_one():
    page = open(os.path.join(ROOT, "docs", "plan-language.md"), encoding="utf-8").read()
    embedded = page.split("<!-- ops:begin -->\n", 1)[1].split("\n<!-- ops:end -->", 1)[0]
    assert embedded == reference_markdown(), "run `meshsim ops --markdown` and paste it into docs/plan-language.md"


def test_the_readme_is_a_landing_page_that_links_every_page_of_the_docs():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert readme.count("\n") <= 200
    for page in PAGES[1:]:
        assert f"({page})" in readme, f"the README links no {page}"


def test_the_docs_build_as_a_site_with_mkdocs_strict(tmp_path):
    mkdocs = shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: pip install -e '.[dev]' (the README's set-up does) or '.[docs]'"
    out = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "scenarios" / "index.html").exists()


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
