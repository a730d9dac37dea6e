"""docs/architecture.md's package map is what the module docstrings say now (scripts/package_map.py makes it).

The map lists every module of minitrain/ with the first sentence of its docstring, by layer. This test keeps
it true the way test_docs_knob_table.py keeps the knob table true: a module added, removed, renamed or
re-described fails here until `python scripts/package_map.py --write` has rewritten the page. It also checks
that every module has a docstring to show, and that the map puts each module under the layer that
test_layering.py enforces for it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    """Import a file that is not on the path (a script, a sibling test module) as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


package_map = _load("package_map_script", ROOT / "scripts" / "package_map.py")
layering = _load("package_map_layering", Path(__file__).with_name("test_layering.py"))


def test_the_page_holds_the_generated_map():
    shown = package_map.region(package_map.PAGE.read_text())
    assert shown == package_map.render().strip(), (
        "docs/architecture.md's package map differs from the module docstrings: run "
        "`python scripts/package_map.py --write` and commit the page")


def test_every_module_has_a_docstring_first_sentence():
    missing = [str(path.relative_to(ROOT)) for path in package_map.modules() if not package_map.first_sentence(path)]
    assert not missing, f"modules without a docstring (the package map has nothing to say of them): {missing}"


def test_the_map_walks_every_module_but_the_generated_code():
    shown = {package_map.module_name(path) for path in package_map.modules()}
    walked = {name for name, _ in layering.source_modules()}
    assert shown == walked, (sorted(walked - shown), sorted(shown - walked))
    assert not any(name.startswith("minitrain.rpc._gen") for name in shown)


def test_each_module_is_shown_under_the_layer_the_layering_test_gives_it():
    wrong = []
    for path in package_map.modules():
        name = package_map.module_name(path)
        shown, _ = package_map.layer_of(name)
        enforced = layering.layer_of(name)
        if enforced is None or shown != enforced[0]:
            wrong.append(f"{name}: the map shows L{shown}, test_layering.py gives {enforced}")
    assert not wrong, "scripts/package_map.py's LAYERS disagree with test_layering.py:\n" + "\n".join(wrong)


def test_the_first_sentence_is_the_first_paragraph_up_to_its_first_full_stop(tmp_path):
    module = tmp_path / "example.py"
    module.write_text('"""One thing, said\nover two lines. Then more.\n\nAnother paragraph."""\n')
    assert package_map.first_sentence(module) == "One thing, said over two lines."
    module.write_text('"""A `name.attr` stays whole (L0: stdlib only)\n\nMore."""\n')
    assert package_map.first_sentence(module) == "A `name.attr` stays whole (L0: stdlib only)"
    module.write_text("x = 1\n")
    assert package_map.first_sentence(module) == ""


def test_a_stale_page_is_found_and_rewritten():
    page = f"# Title\n\n{package_map.START}\n\nold map\n\n{package_map.END}\n\nafter\n"
    assert package_map.region(page) == "old map"
    rewritten = package_map.with_map(page, "| new | map |\n")
    assert package_map.region(rewritten) == "| new | map |"
    assert rewritten.startswith("# Title\n\n") and rewritten.endswith(f"{package_map.END}\n\nafter\n")
    with pytest.raises(ValueError, match="no package-map region"):
        package_map.region("# a page without markers\n")


def test_a_module_outside_every_layer_is_named():
    with pytest.raises(ValueError, match="minitrain_elsewhere.thing is in no layer"):
        package_map.layer_of("minitrain_elsewhere.thing")
