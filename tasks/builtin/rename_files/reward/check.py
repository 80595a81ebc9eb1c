import json
import sys
from pathlib import Path

EXPECTED = {
    "holiday_0003.jpg": "fake jpeg bytes #3\n",
    "holiday_0017.jpg": "fake jpeg bytes #17\n",
    "holiday_0042.jpg": "fake jpeg bytes #42\n",
    "holiday_0108.jpg": "fake jpeg bytes #108\n",
    "holiday_0256.jpg": "fake jpeg bytes #256\n",
    "notes.txt": "Trip to the coast. Keep this file as is.\n",
    "IMG_0999.png": "a png, not a JPG\n",
}


def grade(transcript, workspace_path):
    d = Path(workspace_path) / "photos"
    scores = {"renamed": 0.0, "contents_kept": 0.0, "others_untouched": 0.0, "nothing_else": 0.0}
    try:
        files = {p.name: p for p in d.iterdir() if p.is_file()}
    except Exception:
        return scores
    renamed = [n for n in EXPECTED if n.startswith("holiday_")]
    if all(n in files for n in renamed):
        scores["renamed"] = 1.0
        try:
            if all(files[n].read_text(encoding="utf-8") == EXPECTED[n] for n in renamed):
                scores["contents_kept"] = 1.0
        except Exception:
            pass
    try:
        if all(files[n].read_text(encoding="utf-8") == EXPECTED[n] for n in ("notes.txt", "IMG_0999.png")):
            scores["others_untouched"] = 1.0
    except Exception:
        pass
    if set(files) == set(EXPECTED):
        scores["nothing_else"] = 1.0
    return scores


def main():
    workspace = sys.argv[1] if len(sys.argv) > 1 else "."
    try:
        result = grade([], workspace)
    except Exception:
        result = {}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
