"""Every file the documentation points to exists: README.md, docs/*.md and the benchmarks READMEs.

Checked: markdown links, images and reference definitions (the relative ones; a `#heading` must be a
heading of its page) and paths in backticks. A backticked path whose first part is a top-level entry
of the repository (`benchmarks/records/...`, `src/...`) is read from the root in every document; in
the benchmarks READMEs, which describe their own folders, any backticked path with a `/` is read from
the README's folder. Braces (`ladder.{json,md}`) and wildcards (`logs/*.log`) must each match a file.
Fenced code blocks are commands, not citations, and are skipped; so are the local folders .gitignore
names at the root (`runs/`, `.whl/`, the benchmarks' results folder).
"""

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").rglob("README.md"),
               ROOT / "benchmarks" / "RECORDS.md"])
RECORDS = ROOT / "benchmarks" / "records"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
CODE = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"[\w.\-/{},*]*\w[\w.\-/{},*]*")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _local_folders() -> set[str]:
    """The root-anchored entries of .gitignore (`/runs/` -> `runs`): folders of a checkout, not of the repository."""
    return {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
            if line.startswith("/")}


LOCAL = _local_folders()
TOP = {p.name for p in ROOT.iterdir() if p.name != ".git"} - LOCAL


def _prose(doc: Path) -> str:
    return FENCE.sub("", doc.read_text())


def _expand(path: str) -> list[str]:
    """`a/{b,c}.md` -> [`a/b.md`, `a/c.md`]."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _exists(base: Path, path: str) -> bool:
    if any(ch in path for ch in "*?["):
        return any(base.glob(path.rstrip("/")))
    return (base / path).exists()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text of its links and code, lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(_prose(page)):
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def links(doc: Path) -> list[tuple[str, Path, str]]:
    """(as written, the file it names, its #fragment or '') for every relative link, image and reference of `doc`."""
    text = _prose(doc)
    found = []
    for target in LINK.findall(text) + REFERENCE.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        found.append((target, (doc.parent / path) if path else doc, fragment))
    return found


def code_paths(doc: Path) -> list[tuple[str, Path]]:
    """(as written, the folder it is read from) for every backticked repository path of `doc`."""
    in_benchmarks = doc.resolve().parent.is_relative_to(ROOT / "benchmarks")
    found = []
    for span in CODE.findall(_prose(doc)):
        if not PATHLIKE.fullmatch(span) or "/" not in span or span.startswith("/"):
            continue
        first = span.split("/")[0]
        if any(span == local or span.startswith(local + "/") for local in LOCAL):
            continue
        if first in TOP:
            found.append((span, ROOT))
        elif in_benchmarks:
            found.append((span, doc.parent))
    return found


def problems(doc: Path) -> list[str]:
    """What `doc` points to that is not there."""
    found = [f"link {target}" for target, path, _ in links(doc) if not path.exists()]
    found += [f"heading {target}" for target, path, fragment in links(doc)
              if fragment and path.suffix == ".md" and path.is_file() and fragment not in _anchors(path)]
    found += [f"path `{span}`" for span, base in code_paths(doc) if not all(_exists(base, p) for p in _expand(span))]
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_file_a_document_points_to_exists(doc):
    assert not problems(doc), f"{doc.relative_to(ROOT)} points to what does not exist: {problems(doc)}"


def test_a_broken_link_heading_or_path_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# A heading\n\n## A heading\n")
    doc = tmp_path / "page.md"
    doc.write_text("[ok](other.md#a-heading-1) ![gone](gone.png) [bad](other.md#no-such-heading)\n"
                   "[ref]: missing.md\n`src/gpt2ladder/` `benchmarks/records/no-such-folder/ladder.{json,md}`\n"
                   "`runs/bench` (a local folder)\n```\n[in a command](not-checked.md)\n```\n")
    assert problems(doc) == ["link gone.png", "link missing.md", "heading other.md#no-such-heading",
                             "path `benchmarks/records/no-such-folder/ladder.{json,md}`"]


def test_the_documents_links_and_paths_are_found():
    """The patterns find what the README cites, so a pass above is not a pass over nothing."""
    readme = ROOT / "README.md"
    targets = [target for target, _, _ in links(readme)]
    assert "docs/results.md" in targets and any(t.endswith(".png") and "records/" in t for t in targets)
    assert ("src/gpt2ladder/", ROOT) in code_paths(readme)
    assert ({ROOT / "docs" / "results.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "RECORDS.md"}
            <= set(DOCS))
    assert all(links(doc) or code_paths(doc) for doc in DOCS)


RECORD_PATH = re.compile(r"benchmarks/records/(\d{4}-\d\d-\d\d_[\w.-]*\w)")


def cited_records(doc: Path) -> set[Path]:
    """The record folders a document cites: by a link or image into a folder under benchmarks/records/, or by a
    path in backticks or plain text that names one."""
    found = {path.resolve() for _, path, _ in links(doc)} if doc.suffix == ".md" else set()
    folders = set()
    for path in found:
        if path.is_relative_to(RECORDS) and path != RECORDS:
            folders.add(RECORDS / path.relative_to(RECORDS).parts[0])
    text = _prose(doc) if doc.suffix == ".md" else doc.read_text()
    folders |= {RECORDS / name for name in RECORD_PATH.findall(text)}
    return folders


SOURCES = sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


@pytest.mark.parametrize("doc", DOCS + SOURCES, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_record_a_document_or_source_cites_holds_a_record(doc):
    missing = sorted(f.name for f in cited_records(doc) if not (f / "record.json").is_file())
    assert not missing, f"{doc.relative_to(ROOT)} cites record folders without a record.json: {missing}"


def test_the_readme_and_the_results_page_cite_records(tmp_path):
    assert cited_records(ROOT / "README.md") and cited_records(ROOT / "docs" / "results.md")
    page = tmp_path / "page.md"
    page.write_text(f"[a record]({RECORDS}/no-such-record/) and `benchmarks/records/{'2099-01-01'}_none`\n")
    assert {f.name for f in cited_records(page)} == {"no-such-record", "2099-01-01_none"}


def test_the_readme_and_pyproject_state_the_same_test_time():
    """How long the suite takes on two cores is said twice; both say the same."""
    said = [re.findall(r"about (\d+) minutes on two", (ROOT / name).read_text()) for name in ("README.md",
                                                                                            "pyproject.toml")]
    assert all(len(found) == 1 for found in said) and said[0] == said[1], said
