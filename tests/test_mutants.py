"""Mutation testing of torch's DeviceMesh and DTensor files (bench/mutants.py): the sample is reproducible, a mutant
is served to every process a sweep starts without touching the installed torch, and the reviewed equivalents name
mutants that exist."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import mutants  # noqa: E402

pytest.importorskip("cosmic_ray", reason="cosmic-ray is a dev dependency: pip install -e '.[dev]'")

LAYOUT = "torch/distributed/_mesh_layout.py"


@pytest.fixture(scope="module")
def layout_mutants():
    source = mutants.torch_source(LAYOUT)
    return source, list(mutants.mutants_of(LAYOUT, source))


def test_the_sample_is_the_same_for_the_same_seed_and_leaves_annotations_out(layout_mutants):
    source, population = layout_mutants
    first = mutants.sample(population, 10, 3, LAYOUT)
    assert [m.key for m in first] == [m.key for m in mutants.sample(population, 10, 3, LAYOUT)]
    assert [m.key for m in first] != [m.key for m in mutants.sample(population, 10, 4, LAYOUT)]
    lines = source.splitlines()
    # `-> int | None` and `x: tuple[int, ...] | None` hold a `|` each; none of those is a mutant
    annotated = {i + 1 for i, line in enumerate(lines) if "-> " in line and "|" in line.split("->")[1]}
    assert annotated and not any(m.line in annotated and "BitOr" in m.operator for m in population)


def test_lines_the_coverage_exclusions_leave_out_are_not_claimed():
    source = mutants.torch_source("torch/distributed/device_mesh.py")
    claims = mutants.Claims("torch/distributed/device_mesh.py", source, set())
    stub = next(i + 1 for i, line in enumerate(source.splitlines()) if line.startswith("if not is_available():"))
    assert not claims.claimed(stub + 1)  # the stub DeviceMesh for builds without torch.distributed
    body = next(i + 1 for i, line in enumerate(source.splitlines()) if "def get_local_rank(" in line)
    assert claims.claimed(body + 1) and claims.reached(body + 1)


def test_a_mutant_is_served_to_the_process_and_its_forkserver_children_and_torch_stays_untouched(tmp_path,
                                                                                                 layout_mutants):
    source, population = layout_mutants
    mutant = next(m for m in population if "Eq_NotEq" in m.operator)
    (tmp_path / "_mesh_layout.py").write_text(mutants.mutate(mutant, source) + "\nMUTANT = True\n")
    code = ("import multiprocessing as mp\n"
            "def child(q):\n"
            "    import torch.distributed._mesh_layout as m; q.put(getattr(m, 'MUTANT', False))\n"
            "if __name__ == '__main__':\n"
            "    import torch.distributed._mesh_layout as m\n"
            "    ctx = mp.get_context('forkserver'); q = ctx.Queue(); p = ctx.Process(target=child, args=(q,))\n"
            "    p.start(); print(getattr(m, 'MUTANT', False), q.get(timeout=120)); p.join()\n")
    script = tmp_path / "probe.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=mutants._environment(mutant, str(tmp_path)))
    assert out.stdout.split() == ["True", "True"], out.stderr[-2000:]
    assert "MUTANT" not in mutants.torch_source(LAYOUT)


def test_every_reviewed_equivalent_names_a_mutant_of_the_installed_torch():
    listed = mutants.equivalents()
    assert listed and all(entry["reason"].strip() for entry in listed)
    for file in sorted({entry["file"] for entry in listed}):
        source = mutants.torch_source(file)
        mine = {(e["operator"], e["before"]) for e in listed if e["file"] == file}
        made = {(m.operator, m.before, mutants.changed_line(source, mutants.mutate(m, source)))
                for m in mutants.mutants_of(file, source, {op for op, _ in mine}) if (m.operator, m.before) in mine}
        missing = [e for e in listed if e["file"] == file and (e["operator"], e["before"], e["after"]) not in made]
        assert not missing, missing
