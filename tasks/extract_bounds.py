"""The bounds on extracting text from an agent's files, and the checks that enforce them.

An agent's deliverable is hostile input: a 4 MB ``.docx`` can hold 40 million paragraphs, a zip
member can declare 1 KB and inflate to gigabytes, a spreadsheet can claim a million rows of sixteen
thousand empty cells. :class:`ExtractLimits` names every bound; the extraction worker
(:mod:`tasks.extract_worker`) enforces the process-level ones (address space, wall clock) and the
parsers (:mod:`tasks.extract_formats`) the content-level ones through :func:`check_zip` and
:class:`Collector`.

Invariants:
  * a bound that is reached raises :class:`Bounded` with a reason that says which bound and its
    value, in words a grade reason can carry (e.g. ``"more than 1000000 XML elements in
    word/document.xml"``); it is the agent's outcome, never an infrastructure failure;
  * :func:`check_zip` reads every member through a streaming inflater and counts the bytes that
    come out (the declared sizes are checked first, but never trusted alone), and counts the XML
    elements of every member a parser will hold as a tree, without building one;
  * :class:`Collector` keeps what was extracted before a bound, so a bounded file still shows its
    first part.
"""

from __future__ import annotations

import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExtractLimits:
    """Every bound on extracting one folder of deliverables (defaults sized for honest office files).

    ``max_unzipped_bytes``: bytes inflated from all members of one zip container (docx/xlsx/pptx),
    counted while reading; ``max_zip_members``: entries in one container; ``max_elements``: XML
    elements held as a tree, plus the paragraphs, table cells, spreadsheet cells, slides, shapes,
    notebook cells and SQLite tables extracted from one file; ``max_pages``: PDF pages;
    ``max_text_chars``: characters of text extracted from one file before it stops (what is shown
    is cut further, to ``max_chars``, by the caller); ``memory_mb``: address-space limit of the
    worker process; ``file_timeout_s``: wall clock for one file (the worker stops itself at this
    point where it can; it is killed ``kill_grace_s`` later where it cannot); ``total_timeout_s``:
    wall clock for one folder, after which the remaining files are listed, not extracted.
    """

    max_unzipped_bytes: int = 256 * 2**20
    max_zip_members: int = 10_000
    max_elements: int = 1_000_000
    max_pages: int = 2_000
    max_text_chars: int = 2_000_000
    memory_mb: int = 1024
    file_timeout_s: float = 30.0
    kill_grace_s: float = 5.0
    total_timeout_s: float = 300.0

    def to_json(self) -> dict:
        """The limits as a JSON object (how the worker receives them)."""
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> ExtractLimits:
        """Limits from :meth:`to_json`'s object; unknown keys are an error (a version mismatch)."""
        return cls(**obj)


class Bounded(Exception):
    """A bound of :class:`ExtractLimits` was reached; ``str(exc)`` is the reason."""


class Collector:
    """The parts of one file's text, joined by newlines, under the text, element and time bounds.

    ``add`` appends one part; ``count`` counts extracted items (paragraphs, cells, pages, …); both
    raise :class:`Bounded` once a bound is passed, after which :meth:`text` is what came before.
    """

    def __init__(self, limits: ExtractLimits, deadline: float | None = None) -> None:
        self.limits = limits
        self.deadline = deadline
        self.parts: list[str] = []
        self.chars = 0
        self.items = 0

    def add(self, part: str) -> None:
        """Append one part of the text; :class:`Bounded` once the text is longer than allowed."""
        self.parts.append(part)
        self.chars += len(part) + 1
        if self.chars > self.limits.max_text_chars:
            raise Bounded(f"its text is longer than {self.limits.max_text_chars} characters")

    def count(self, what: str, n: int = 1, *, cap: int | None = None) -> None:
        """Count ``n`` extracted items (``what`` names them in the reason); :class:`Bounded` past
        ``cap`` (default ``max_elements``) or past the deadline."""
        self.items += n
        limit = self.limits.max_elements if cap is None else cap
        if self.items > limit:
            raise Bounded(f"more than {limit} {what}")
        self.check_time()

    def expired(self) -> bool:
        """Whether this file's deadline has passed."""
        return self.deadline is not None and time.monotonic() > self.deadline

    def check_time(self) -> None:
        """:class:`Bounded` when this file's deadline has passed."""
        if self.expired():
            raise Bounded(f"its extraction took longer than {self.limits.file_timeout_s:g} s")

    def text(self) -> str:
        """The text extracted so far, never longer than ``max_text_chars``."""
        return "\n".join(self.parts)[:self.limits.max_text_chars]


class _ElementCounter:
    """An lxml parser target that counts start tags and builds nothing."""

    def __init__(self, budget: list[int], member: str, cap: int) -> None:
        self.budget, self.member, self.cap = budget, member, cap

    def start(self, tag: str, attrib: dict) -> None:
        self.budget[0] += 1
        if self.budget[0] > self.cap:
            raise Bounded(f"more than {self.cap} XML elements (reached in {self.member})")

    def close(self) -> None:
        return None


def _looks_like_xml(head: bytes) -> bool:
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<")


def check_zip(path: str | Path, limits: ExtractLimits, *, streamed: Callable[[str], bool] = lambda name: False,
              collector: Collector | None = None) -> None:
    """Check a zip container against ``limits`` before a parser opens it; :class:`Bounded` if over.

    Checks the member count and the declared sizes, then inflates every member in 1 MiB chunks
    (nothing is kept) counting the bytes that actually come out, and feeds every member that looks
    like XML (by content, not name) to a counting parser, except those ``streamed`` says the
    parser reads as a stream (their elements are bounded while they are read). A member that is
    not well-formed XML stops being counted there: the real parser will report it. Not a zip at all
    is not this function's concern (the parser reports it).
    """
    from lxml import etree  # type: ignore[import-untyped]  # lxml ships no type stubs

    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return
    with z:
        infos = z.infolist()
        if len(infos) > limits.max_zip_members:
            raise Bounded(f"the archive has {len(infos)} members, more than {limits.max_zip_members}")
        declared = sum(max(i.file_size, 0) for i in infos)
        if declared > limits.max_unzipped_bytes:
            raise Bounded(f"its members declare {declared} bytes uncompressed, more than "
                          f"{limits.max_unzipped_bytes}")
        inflated = 0
        elements = [0]
        for info in infos:
            if info.is_dir():
                continue
            parser = None
            first = True
            try:
                with z.open(info) as member:
                    while True:
                        chunk = member.read(2**20)
                        if not chunk:
                            break
                        inflated += len(chunk)
                        if inflated > limits.max_unzipped_bytes:
                            raise Bounded(f"it inflates to more than {limits.max_unzipped_bytes} bytes "
                                          f"(reached in {info.filename})")
                        if first and not streamed(info.filename) and _looks_like_xml(chunk[:4096]):
                            target = _ElementCounter(elements, info.filename, limits.max_elements)
                            parser = etree.XMLParser(target=target, resolve_entities=False, no_network=True)
                        first = False
                        if parser is not None:
                            try:
                                parser.feed(chunk)
                            except etree.XMLSyntaxError:
                                parser = None
                        if collector is not None:
                            collector.check_time()
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError, RuntimeError,
                    ValueError):
                continue  # a member the parser cannot read either: it reports the file as corrupt
