"""Editing a config file as text: append an `[[allowlist]]` rule, or a
`[[rules]]` policy rule (to a user's config, or to the machine's rules.d).

The rule is appended to the text, so comments and layout survive; the
result is parsed before it replaces the file, and the replacement is atomic
(temporary file, fsync, rename, fsync of the folder). It lives below both
users of it, `lev policy add` and the daemon's PolicyAdd, so the daemon does
not depend on its own client.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from leviathd import fsat
from leviathd.config.load import (
    MAX_TEXT_BYTES,
    combine_rules,
    load_config,
    load_rules_dir,
    machine_rules_dir,
    parse_config,
    parse_rules_file,
)
from leviathd.config.models import FolderGrant
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import InvalidArgument

# The rules.d file `lev policy add --rule --system` appends to; the admin's
# own files sort around it (10-*.toml before, 90-*.toml after).
ADDED_RULES_FILE = "50-lev-policy-add.toml"


def allowlist_block(tool: str, target: str, level: Sensitivity) -> str:
    return (
        "\n[[allowlist]]\n"
        f"tool = {json.dumps(tool)}\n"
        f"target = {json.dumps(target)}\n"
        f"max_sensitivity = \"{level}\"\n"
    )


def append_rule(path: Path, tool: str, target: str, level: Sensitivity) -> None:
    """Append the rule to `path`, refusing to write anything that does not parse."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if text and not text.endswith("\n"):
        text += "\n"
    new = text + allowlist_block(tool, target, level)
    parse_config(new, str(path))  # raises ConfigError naming file and line
    atomic_write(path, new)


def machine_write_target(path: Path) -> Path:
    """The file a root write to the machine config must replace. A link is
    written through to its target (an admin's linked config stays the one in
    force), but only when every folder down to the target and the target
    itself belong to root and nobody else may write them: root does not
    write where a user could swap something in. Anything else is refused
    with the reason."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISLNK(st.st_mode):
        return path
    real = Path(os.path.realpath(path))
    why = ""
    for folder in [*reversed(real.parents)]:
        fst = os.stat(folder)
        if fst.st_uid != 0 or fst.st_mode & 0o022:
            why = (f"{folder} is not root's alone (owner uid {fst.st_uid}, "
                   f"mode {fst.st_mode & 0o7777:o})")
            break
    if not why:
        try:
            tst = os.lstat(real)
        except FileNotFoundError:
            tst = None
        if tst is not None and (not stat.S_ISREG(tst.st_mode) or tst.st_uid != 0
                                or tst.st_mode & 0o022 or tst.st_nlink != 1):
            why = f"{real} is not a regular file root alone may write"
    if why:
        raise InvalidArgument(
            f"{path} is a link to {real}, and {why}: not writing through it. Add the rule "
            f"to {real} by hand, or make {path} a regular file"
        )
    return real


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` through fsat (temporary file made by
    descriptor, fsync of the file and of the folder, rename): the one atomic
    write of the code base. The file keeps its mode (0644 when new); a missing
    folder is made."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    dfd, name = fsat.open_parent(str(path.absolute()), create_mode=0o755)
    try:
        fsat.atomic_write_at(dfd, name, text.encode(), mode=mode)
    finally:
        os.close(dfd)


def _toml_string(text: str) -> str:
    # JSON's escapes are TOML's for what json.dumps emits without ensure_ascii
    # (\" \\ \n \t \uXXXX); whatever TOML still refuses fails the parse below.
    return json.dumps(text, ensure_ascii=False)


def rule_block(name: str, when: str, decision: str, reason: str) -> str:
    block = (f"\n[[rules]]\nname = {_toml_string(name)}\nwhen = {_toml_string(when)}\n"
             f"decision = {_toml_string(decision)}\n")
    if reason:
        block += f"reason = {_toml_string(reason)}\n"
    return block


def append_user_rule(path: Path, name: str, when: str, decision: str, reason: str) -> None:
    """A [[rules]] table at the end of a user's config.toml (parsed first)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if text and not text.endswith("\n"):
        text += "\n"
    new = text + rule_block(name, when, decision, reason)
    cfg = parse_config(new, str(path))  # a rule that does not compile: file, line, column
    if sum(1 for r in cfg.rules if r.name == name) > 1:
        raise InvalidArgument(f"{path}: a rule named {name!r} is already there")
    atomic_write(path, new)


def add_machine_rule(config_path: Path, name: str, when: str, decision: str,
                     reason: str) -> Path:
    """Append a rule to rules.d/ADDED_RULES_FILE beside the machine config,
    as root: the folder opened by descriptor (created root's 0755 if
    missing) and refused unless root's alone, the file replaced atomically
    in it, and only once the machine config, every rules.d file and the new
    text load together (syntax, compile, unique names, the count)."""
    folder = machine_rules_dir(config_path)
    dfd = fsat.open_dir(str(folder), create_mode=0o755)
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise InvalidArgument(f"{folder} is not root's alone (owner uid {st.st_uid}, "
                                  f"mode {st.st_mode & 0o7777:o}): not writing there")
        old = fsat.lstat_at(dfd, ADDED_RULES_FILE)
        text = ""
        if old is not None:
            if (not stat.S_ISREG(old.st_mode) or old.st_uid != os.geteuid()
                    or old.st_mode & 0o022 or old.st_nlink != 1):
                raise InvalidArgument(f"{folder / ADDED_RULES_FILE} is not a regular file "
                                      "root alone may write: not writing there")
            text = fsat.read_at(dfd, ADDED_RULES_FILE, MAX_TEXT_BYTES).decode("utf-8")
        if text and not text.endswith("\n"):
            text += "\n"
        if not text:
            text = ("# Machine policy rules added by `lev policy add --rule ... --system`\n"
                    "# (docs/configuration.md, [[rules]]). Edit by hand as you like.\n")
        new = text + rule_block(name, when, decision, reason)
        target = str(folder / ADDED_RULES_FILE)
        added = parse_rules_file(new, target)
        files = [(p, r) for p, r in load_rules_dir(folder) if p != target]
        files = sorted([*files, (target, added)], key=lambda f: f[0])
        combine_rules(load_config(config_path), str(config_path), files, str(folder))
        fsat.atomic_write_at(dfd, ADDED_RULES_FILE, new.encode(), mode=0o644)
    except ValueError as exc:  # not UTF-8, or larger than a config may be
        raise InvalidArgument(f"{folder / ADDED_RULES_FILE}: {exc}") from None
    finally:
        os.close(dfd)
    return folder / ADDED_RULES_FILE


def _table_spans(text: str) -> list[tuple[int, int, str]]:
    """Each table of `text` as (first line, end line, header), by lines: a
    table runs from its header to the next header. A header is a line that
    starts with `[` outside a multi-line string; the caller checks the result
    by parsing it, so a layout this misreads is refused, never half-edited."""
    lines = text.splitlines(keepends=True)
    heads = [(0, "")]
    for n, line in enumerate(lines):
        if line.lstrip().startswith("["):
            heads.append((n, line.strip()))
    spans = []
    for i, (start, head) in enumerate(heads):
        end = heads[i + 1][0] if i + 1 < len(heads) else len(lines)
        if end > start or i == 0:
            spans.append((start, end, head))
    return spans


def remove_folders(path: Path, folder: str, agent: str | None,
                   repository: str | None) -> tuple[str, list[FolderGrant]]:
    """The text of `path` without its [[folders]] tables for `folder`
    (narrowed to `agent` and `repository` when given), and the tables
    taken out. The other tables, comments and layout stay as they were;
    the result must load, with exactly those folders gone."""
    text = path.read_text(encoding="utf-8")
    before = parse_config(text, str(path)).folders
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    gone: list[FolderGrant] = []
    for start, end, head in _table_spans(text):
        chunk = "".join(lines[start:end])
        if head.split("#", 1)[0].replace(" ", "").replace("\t", "") == "[[folders]]":
            grant = parse_config(chunk, str(path)).folders[0]
            if (grant.path == folder and (agent is None or grant.agent == agent)
                    and (repository is None or grant.repository == repository)):
                gone.append(grant)
                continue
        kept.append(chunk)
    new = "".join(kept)
    after = parse_config(new, str(path)).folders
    if len(after) != len(before) - len(gone) or any(f not in before for f in after):
        raise InvalidArgument(f"{path}: its layout is not one this edit can follow; remove the "
                              "[[folders]] table by hand")
    return new, gone
