"""The man pages and bash completion the packages ship are generated from the
parser behind `lev --help` (packaging/gen_docs.py); this fails when the
committed files have drifted from it. Fix: python3 packaging/gen_docs.py"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _gen():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "packaging" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_man_pages_and_completion_match_the_parser() -> None:
    gen = _gen()
    outputs = gen.outputs()
    stale = [str(p.relative_to(REPO)) for p, text in outputs.items()
             if not p.is_file() or p.read_text() != text]
    assert not stale, f"regenerate with `python3 packaging/gen_docs.py`: {stale}"
    committed = set((REPO / "packaging" / "man").iterdir())
    assert committed == {p for p in outputs if p.parent.name == "man"}


def test_every_subcommand_has_a_page_and_a_completion_entry() -> None:
    gen = _gen()
    names = [name for name, _h, _sp in gen._subcommands(gen.build_parser())]
    assert "run" in names and "ps" in names
    pages = gen.man_pages()
    completion = gen.completion()
    for name in names:
        assert f"lev-{name}.1" in pages
        assert f"    {name})" in completion


def test_the_completion_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(REPO / "packaging" / "completion" / "lev")], check=True)


def test_the_shipped_example_config_is_valid() -> None:
    from leviathd.config.load import parse_config

    path = REPO / "packaging" / "config.example.toml"
    cfg = parse_config(path.read_text(), str(path))
    assert cfg.sandbox.kind == "namespace"
