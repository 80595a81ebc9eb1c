"""Host memory of JobBench deliverable extraction on a paragraph-bomb ``.docx`` (and an honest one).

Usage: ``python bench/bench_extract_bomb.py [--paragraphs 40000000] [--impl FILE] [--safety-gib 6]
[--lift-content-bounds]``

Builds ``outputs/bomb.docx`` (a valid docx whose body is ``--paragraphs`` one-letter paragraphs,
deflated: a few MB on disk) next to an honest ``outputs/memo.docx``, then runs
:func:`extract_folder` on ``outputs/`` in a fresh "host" interpreter and prints, as one JSON line:
the host's own peak RSS (``getrusage(RUSAGE_SELF)``, the grading process), the peak RSS of the
largest process it waited for (the extraction worker, where there is one), the wall time, and
each file's record (kind, error, bound). ``--impl`` names another copy of the extract module to
measure instead of ``tasks.extract`` (e.g. the module as it was before bounded extraction). The
host interpreter runs under an address-space limit of ``--safety-gib`` GiB so that an unbounded
extractor stops with MemoryError instead of taking the machine; a run that hits it says so.
``--lift-content-bounds`` measures the last line of defence alone: the worker's address-space limit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
CONTENT_TYPES = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/word/document.xml" '
    'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
RELS = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
    'officeDocument" Target="word/document.xml"/></Relationships>')

HOST = r"""
import json, resource, sys, time
safety = int(sys.argv[3]) * 2**30
resource.setrlimit(resource.RLIMIT_AS, (safety, safety))
impl, folder = sys.argv[1], sys.argv[2]
kwargs = {}
if impl == "tasks.extract":
    from tasks.extract import ExtractLimits, extract_folder
    if sys.argv[4] == "lift":  # only the worker's memory limit and deadlines are left
        kwargs["limits"] = ExtractLimits(max_unzipped_bytes=2**62, max_elements=10**12, max_text_chars=10**12)
else:
    import importlib.util
    spec = importlib.util.spec_from_file_location("extract_under_test", impl)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    extract_folder = mod.extract_folder
t0 = time.monotonic()
out = {"impl": impl}
try:
    text, files = extract_folder(folder, **kwargs)
    out["files"] = [f.to_dict() for f in files]
    out["memo_text_ok"] = "Honest memo line" in text
except MemoryError:
    out["stopped"] = f"MemoryError at the {sys.argv[3]} GiB safety limit"
out["wall_s"] = round(time.monotonic() - t0, 2)
out["host_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
out["largest_child_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
print(json.dumps(out))
"""


def write_paragraph_bomb(path: Path, paragraphs: int) -> None:
    """A docx whose document body holds ``paragraphs`` paragraphs of one letter each (streamed)."""
    chunk = 100_000
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", CONTENT_TYPES)
        z.writestr("_rels/.rels", RELS)
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            f.write(f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{W_NS}">'
                    f'<w:body>'.encode())
            block = b"<w:p><w:r><w:t>a</w:t></w:r></w:p>" * chunk
            left = paragraphs
            while left > 0:
                n = min(chunk, left)
                f.write(block if n == chunk else block[:len(block) // chunk * n])
                left -= n
            f.write(b"</w:body></w:document>")


def main() -> None:
    """Build the files, run one host extraction, print its JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paragraphs", type=int, default=40_000_000)
    ap.add_argument("--impl", default="tasks.extract", help="tasks.extract or the path of a module copy")
    ap.add_argument("--safety-gib", type=int, default=6)
    ap.add_argument("--lift-content-bounds", action="store_true",
                    help="tasks.extract only: lift the zip, element and text bounds (the worker's memory "
                         "limit and deadlines remain), to measure the backstop")
    args = ap.parse_args()
    import docx

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "outputs"
        out.mkdir()
        t0 = time.monotonic()
        write_paragraph_bomb(out / "bomb.docx", args.paragraphs)
        build_s = time.monotonic() - t0
        memo = docx.Document()
        memo.add_paragraph("Honest memo line.")
        memo.save(str(out / "memo.docx"))
        size = (out / "bomb.docx").stat().st_size
        print(f"bomb.docx: {args.paragraphs} paragraphs, {size / 2**20:.2f} MiB on disk (built in {build_s:.1f} s)",
              file=sys.stderr)
        res = subprocess.run([sys.executable, "-c", HOST, args.impl, str(out), str(args.safety_gib),
                              "lift" if args.lift_content_bounds else "keep"],
                             capture_output=True, text=True)
        line = res.stdout.strip().splitlines()[-1:] or [""]
        try:
            result = json.loads(line[0])
        except ValueError:
            result = {"impl": args.impl, "host_exit": res.returncode, "stderr_tail": res.stderr[-800:]}
        result.update(paragraphs=args.paragraphs, docx_bytes=size, content_bounds=not args.lift_content_bounds)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
