"""The README and docs/ as a reader meets them: a README read in ten minutes, links that lead
somewhere, and a tour whose commands exist. No server, no network: the files and the CLI's
own parser (`controlplane.user.cli.parser`, which imports none of what commands run)."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from controlplane.user.cli import parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 400
MAX_README_LINE_CHARS = 200
TOUR_HEADING = "A five-minute tour"

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, …


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: its text as rendered (links to their text, code spans to
    their content, tags gone), lower-cased, punctuation but `-` and `_` dropped, each space a
    `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in `path`, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_anchor(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    """The link targets in `path` that are not external (code spans and blocks left out)."""
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        plain = CODE_SPAN.sub("code", line)
        targets += [t for t in LINK.findall(plain) if not EXTERNAL.match(t)]
    return targets


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor} in {resolved.name}")
    return broken


def section(text: str, title: str) -> list[str]:
    """The lines under the heading `title`, up to the next heading of its level or above."""
    lines = text.splitlines()
    fenced, start, level = False, None, 0
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m and start is None and m.group(2) == title:
            start, level = i + 1, len(m.group(1))
        elif m and start is not None and len(m.group(1)) <= level:
            return lines[start:i]
    return lines[start:] if start is not None else []


def console_commands(lines: list[str]) -> list[str]:
    """The `$ …` lines of the ```console blocks among `lines`, without the `$ `."""
    out, block = [], None
    for line in lines:
        m = FENCE.match(line)
        if m:
            block = None if block is not None else line.strip()[3:].strip()
            continue
        if block == "console" and line.startswith("$ "):
            out.append(line[2:].rstrip().removesuffix("\\"))
    return out


def invocations(command_line: str) -> list[list[str]]:
    """Each `virtbus …` of a shell line (`a; b`, `a && b`, `a | b`), comments left out."""
    lexer = shlex.shlex(command_line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = []
    current: list[str] = []
    for token in lexer:
        if token in (";", "&&", "||", "|", "&"):
            out.append(current)
            current = []
        else:
            current.append(token)
    out.append(current)
    return [words for words in out if words and words[0] == "virtbus"]


def subcommand(words: list[str], takes_value: set[str]) -> str:
    """The first word after `virtbus` that is not a global option or an option's value."""
    rest = iter(words[1:])
    for word in rest:
        if word.startswith("-"):
            if word in takes_value:
                next(rest, None)
            continue
        return word
    return ""


def cli_surface() -> tuple[set[str], set[str]]:
    """What `virtbus --help` lists: the subcommands, and the global options taking a value."""
    p = parser()
    subcommands: set[str] = set()
    takes_value: set[str] = set()
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            subcommands |= set(action.choices)
        elif action.option_strings and action.nargs != 0:
            takes_value |= set(action.option_strings)
    return subcommands, takes_value


def test_the_readme_is_read_in_ten_minutes() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; at most {MAX_README_LINES}: move detail to docs/")
    long = [f"line {n}: {len(line)} characters" for n, line in enumerate(lines, 1)
            if len(line) > MAX_README_LINE_CHARS]
    assert not long, f"README.md lines over {MAX_README_LINE_CHARS} characters: {long}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(path: Path) -> None:
    assert broken_links(path) == []


def test_the_anchors_are_githubs() -> None:
    assert github_anchor("Node maintenance") == "node-maintenance"
    assert github_anchor("`virtbus up`") == "virtbus-up"
    assert github_anchor("5. Announced") == "5-announced"
    assert github_anchor("Many simulated nodes in one process: `python -m nodeagent fleet`") == (
        "many-simulated-nodes-in-one-process-python--m-nodeagent-fleet")
    assert github_anchor("Scheduling, migration and workloads") == (
        "scheduling-migration-and-workloads")


def test_every_command_of_the_tour_is_one_virtbus_has() -> None:
    tour = section(README.read_text(encoding="utf-8"), TOUR_HEADING)
    assert tour, f"README.md has no '{TOUR_HEADING}' section"
    subcommands, takes_value = cli_surface()
    shown = [(line, subcommand(words, takes_value))
             for line in console_commands(tour) for words in invocations(line)]
    assert len(shown) >= 10, f"the tour shows too few virtbus commands to be one: {shown}"
    unknown = [line for line, sub in shown if sub not in subcommands]
    assert not unknown, (f"the tour uses subcommands `virtbus --help` does not list "
                         f"({sorted(subcommands)}): {unknown}")


def test_the_tour_check_finds_what_it_should() -> None:
    subcommands, takes_value = cli_surface()
    assert {"up", "apply", "get", "history", "drain", "sim"} <= subcommands
    assert [subcommand(w, takes_value) for w in invocations(
        "virtbus --as user:x pause vm1; virtbus get vm  # a comment")] == ["pause", "get"]
    block = ["```console", "$ virtbus frobnicate x", "out", "```", "$ virtbus not-a-block"]
    assert console_commands(block) == ["virtbus frobnicate x"]


CODE_NAME = re.compile(
    r"`((?:events|projections|controlplane|nodeagent)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
"""A dotted name of the code in backticks: a module, or an attribute of one."""


def missing_code_names(text: str) -> list[str]:
    """The dotted names `text` gives that the code does not have (a module moved, a function
    renamed since the docs were written)."""
    missing = []
    for dotted in sorted(set(CODE_NAME.findall(text))):
        parts = dotted.split(".")
        for split in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            for attribute in parts[split:]:
                found = getattr(found, attribute, None)
            if found is None:
                missing.append(dotted)
            break
        else:
            missing.append(dotted)
    return missing


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_every_name_of_the_code_a_doc_gives_exists(path: Path) -> None:
    assert missing_code_names(path.read_text()) == []


def test_the_name_check_finds_what_it_should() -> None:
    assert missing_code_names("`events.language.codec.decode`, `projections.views.View`") == []
    assert missing_code_names("`controlplane.handling.Decision`, `events.codec`, "
                              "`projections.hco.HCO_VIEW_KINDS`") == [
        "controlplane.handling.Decision", "events.codec", "projections.hco.HCO_VIEW_KINDS"]
