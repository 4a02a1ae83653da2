"""The documentation holds together: the README stays a road map, and no link is broken.

* README.md is at most README_MAX bytes: topics have their pages in doc/.
* Every relative link in README.md, doc/*.md and bench/README.md points to a file that
  exists, and every #anchor to a heading of the page it names, with GitHub's rules for
  the anchor of a heading (lowercase; punctuation removed but for '-' and '_'; each space
  a '-'; a heading met again gets -1, -2, ...).  Fenced code blocks and code spans are
  not markdown: a '#' comment in a block is no heading, and `[x](y)` in code no link.
* The README's quick start is still its two commands, `make run` and `make check`.
"""

import re

from conftest import SOURCE_ROOT

README_MAX = 20_000
PAGES = [SOURCE_ROOT / "README.md", *sorted((SOURCE_ROOT / "doc").glob("*.md")),
         SOURCE_ROOT / "bench/README.md"]

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def prose(text):
    """The text without its fenced blocks (each replaced by as many newlines)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """The anchors of every heading of a markdown file."""
    seen = {}
    found = set()
    for m in HEADING.finditer(prose(path.read_text())):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path):
    """The relative link targets of a markdown file, with the line of each."""
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), prose(path.read_text()))
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        yield text.count("\n", 0, m.start()) + 1, target


def broken_links(pages, root=SOURCE_ROOT):
    """'file:line: target: why' for every relative link that leads nowhere."""
    problems = []
    for page in pages:
        for line, target in links(page):
            where = f"{page.relative_to(root)}:{line}: {target}"
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                problems.append(f"{where}: no such file")
                continue
            if anchor:
                if dest.suffix != ".md":
                    problems.append(f"{where}: an anchor in a file that is not markdown")
                elif anchor not in anchors(dest):
                    problems.append(f"{where}: no heading with that anchor")
    return problems


def test_readme_is_a_road_map():
    size = (SOURCE_ROOT / "README.md").stat().st_size
    assert size <= README_MAX, (f"README.md is {size} bytes, more than {README_MAX}: "
                                "move a topic to its page in doc/")


def test_links_lead_somewhere():
    problems = broken_links(PAGES)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_a_broken_link_is_found(tmp_path):
    """The checker itself: a missing file, a missing anchor, and a good link."""
    (tmp_path / "A.md").write_text(
        "# A page\n\n## Two words: `here`\n\n```sh\n# not a heading\n```\n\n"
        "[ok](#two-words-here) [ok](B.md#b) [bad](C.md) [bad](B.md#nowhere)\n"
        "[bad](#not-a-heading) `[code](D.md)`\n")
    (tmp_path / "B.md").write_text("# B\n")
    problems = broken_links([tmp_path / "A.md"], root=tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "C.md: no such file", "B.md#nowhere: no heading with that anchor",
        "#not-a-heading: no heading with that anchor"], problems


def test_quick_start_is_two_commands():
    text = (SOURCE_ROOT / "README.md").read_text()
    m = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "README.md has no '## Quick start' section"
    block = re.search(r"^```sh\n(.*?)^```", m.group(1), re.M | re.S)
    assert block, "the quick start has no ```sh block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    assert [c for c in commands if c] == ["make run", "make check"], block.group(1)
