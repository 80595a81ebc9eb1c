"""Looking at call trees: a text outline, a self-contained HTML page and a PNG picture.

Layout shared by all three: a chain of nodes with one child each is drawn as one straight run (the
usual multi-turn episode is a single chain); a node with several children opens one indented branch
per child. Segments are abbreviated to their first and last few tokens, decoded by ``tokenizer``
when one is given (anything with ``decode(ids)``), else shown as ids.

Each node is labelled with the kind of the calls through it (:data:`KIND_COLOURS`: ``main``, ``side``,
``subagent``, ``compaction``, ``discarded`` for a dead retry, ``shared`` where calls of several kinds pass): a
tag in the text outline (coloured in a terminal), the left border in HTML, the box edge in the PNG.

Invariants: rendering never changes the tree; the HTML page loads no external asset; the PNG is drawn
with matplotlib (an optional dependency, imported only by :func:`render_png`).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from clawgym_env.capture.tree import CallTree, TreeNode
from clawgym_env.errors import ClawGymError
from clawgym_env.jsontypes import JSONObject


class Decoder(Protocol):
    """What a rendering needs of a tokenizer: ``decode`` (a Hugging Face tokenizer is one)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str:
        """The text of ``token_ids``."""
        ...

EDGE_TOKENS = 6  # tokens decoded at each end of an abbreviated segment
KIND_COLOURS = {"main": "#2b7a2b", "side": "#1f5fbf", "subagent": "#8a3fb0", "compaction": "#c07000",
                "discarded": "#b00020", "shared": "#777777"}
"""Colour of each node label (the call kinds of :mod:`~clawgym_env.capture.call_kinds`, plus ``discarded`` and
``shared``)."""
_ANSI = {"main": "32", "side": "34", "subagent": "35", "compaction": "33", "discarded": "31", "shared": "90"}


def node_kind(tree: CallTree, node: TreeNode) -> str:
    """The kind of the live calls through ``node`` (dead retries aside): their common kind, ``shared`` when they
    differ, ``discarded`` when only dead retries pass; ``main`` for trees recorded before calls had kinds."""
    kinds = tree.meta.call_kinds
    if kinds is None:
        return "main"
    dead = set(tree.meta.discarded_calls)
    labels = {kinds[c] if c < len(kinds) else "main" for c in node.calls if c not in dead}
    if not labels:
        return "discarded"
    return labels.pop() if len(labels) == 1 else "shared"


def kind_counts(tree: CallTree) -> str:
    """``"main 12, side 2, discarded 1"``: calls per kind (dead retries counted apart), or "" for old trees."""
    kinds = tree.meta.call_kinds
    if kinds is None:
        return ""
    dead = set(tree.meta.discarded_calls)
    counts: dict[str, int] = {}
    for c, k in enumerate(kinds):
        label = "discarded" if c in dead else k
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{k} {counts[k]}" for k in KIND_COLOURS if k in counts)


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def _decode(tokens: list[int], tokenizer: Decoder | None) -> str:
    if tokenizer is None:
        return " ".join(map(str, tokens))
    return tokenizer.decode(tokens, skip_special_tokens=False)


def abbreviate(tokens: list[int], tokenizer: Decoder | None = None, edge: int = EDGE_TOKENS) -> str:
    """The first and last ``edge`` tokens of a segment (all of it when short), newlines escaped."""
    if len(tokens) <= 2 * edge:
        return repr(_decode(tokens, tokenizer)) if tokenizer else _decode(tokens, None)
    head, tail = _decode(tokens[:edge], tokenizer), _decode(tokens[-edge:], tokenizer)
    if tokenizer:
        return f"{head!r} … {tail!r}"
    return f"[{head} … {tail}]"


def _calls_label(calls: list[int], limit: int = 24) -> str:
    text = _ranges(calls)
    return text if len(text) <= limit else f"{calls[0]}…{calls[-1]} ({len(calls)})"


def _summary(n: TreeNode) -> str:
    return f"#{n.id} {len(n.tokens)} tok {sum(n.sampled)} sampled calls {_calls_label(n.calls)}"


def _walk(tree: CallTree) -> Iterator[tuple[TreeNode, str]]:
    """Yield ``(node, lead)`` in display order: ``lead`` is the outline prefix of the node's line.

    A single child continues its parent's chain at the same indentation; several children (or
    several roots) each open a ``├─``/``└─`` branch.
    """
    def fan(ids: list[int], cont: str) -> list[tuple[int, str, str]]:
        if len(ids) == 1:
            return [(ids[0], cont, cont)]
        last = len(ids) - 1
        return [(c, cont + ("└─ " if i == last else "├─ "), cont + ("   " if i == last else "│  "))
                for i, c in enumerate(ids)]

    stack = fan(tree.roots, "")[::-1]
    while stack:
        nid, lead, cont = stack.pop()
        node = tree.nodes[nid]
        yield node, lead
        stack.extend(fan(node.children, cont)[::-1] if node.children else [])


def render_text(tree: CallTree, tokenizer: Decoder | None = None, width: int = 100, colour: bool = False) -> str:
    """An outline, one line per node: id, kind, token count, sampled count, calls through it, the segment
    (``colour``: the kind tag in ANSI colours, for a terminal)."""
    st = tree.stats()
    m = tree.meta
    head = (f"call tree {m.tree_id or '?'}  task={m.task_id or '-'} harness={m.harness or '-'} "
            f"reward={m.reward} status={m.status or '-'}\n"
            f"calls={st.num_calls} (unique {st.unique_calls}, retries {st.retries}, duplicates {st.duplicates}) "
            f"nodes={st.nodes} roots={st.roots} branches={st.branches} leaves={st.leaves} "
            f"tokens {st.captured_tokens} captured → {st.tree_tokens} in tree (×{st.compression_ratio:.2f}) "
            f"sampled={st.sampled_tokens} token_exact={st.token_exact_share:.0%}")
    lines = [head] + ([f"call kinds: {kind_counts(tree)}"] if kind_counts(tree) else [])
    for node, lead in _walk(tree):
        kind = node_kind(tree, node)
        tag = f"[{kind}] "
        text = f"{lead}{tag}{_summary(node)}  {abbreviate(node.tokens, tokenizer)}"
        if width and len(text) > width:
            text = text[: max(width - 1, 10)] + "…"
        if colour:
            text = text.replace(tag, f"\033[{_ANSI[kind]}m{tag}\033[0m", 1)
        lines.append(text)
    return "\n".join(lines) + "\n"


# ---- HTML -----------------------------------------------------------------------------------------
_CSS = """body{font-family:system-ui,sans-serif;margin:1em;background:#fafafa}
.box{border:1px solid #999;border-radius:6px;margin:4px 0 4px 1.2em;padding:4px 6px;background:#fff}
.node{border-left:3px solid #bbb;margin:3px 0;padding:2px 6px}
.hdr{font-size:12px;color:#333;font-weight:600}
.seg{font-family:ui-monospace,monospace;font-size:12px;white-space:pre-wrap;word-break:break-all}
.s{background:#ffe08a}.c{color:#555}
summary{cursor:pointer;font-size:11px;color:#06c}
.branch{font-size:11px;color:#a00;margin-left:1.2em}"""


def _runs(node: TreeNode, lo: int, hi: int) -> Iterator[tuple[int, int, bool]]:
    """Maximal runs of equal ``sampled`` flag within ``[lo, hi)``."""
    i = lo
    while i < hi:
        j = i
        while j < hi and node.sampled[j] == node.sampled[i]:
            j += 1
        yield i, j, node.sampled[i]
        i = j


def _seg_html(node: TreeNode, lo: int, hi: int, tokenizer: Decoder | None) -> str:
    out = []
    for i, j, samp in _runs(node, lo, hi):
        text = html.escape(_decode(node.tokens[i:j], tokenizer) + ("" if tokenizer else " "))
        if samp:
            lps = [lp for lp in node.logprobs[i:j] if lp is not None]
            title = f"{j - i} sampled tokens, mean logprob {sum(lps) / len(lps):.4f}"
            out.append(f'<span class="s" title="{title}">{text}</span>')
        else:
            out.append(f'<span class="c">{text}</span>')
    return "".join(out)


def _node_html(node: TreeNode, tokenizer: Decoder | None, edge: int, kind: str = "main") -> str:
    hdr = f'<div class="hdr">[{kind}] {html.escape(_summary(node))}</div>'
    n = len(node.tokens)
    if n <= 4 * edge:
        body = f'<div class="seg">{_seg_html(node, 0, n, tokenizer)}</div>'
    else:
        short = (_seg_html(node, 0, edge, tokenizer) + '<span class="c"> … </span>'
                 + _seg_html(node, n - edge, n, tokenizer))
        body = (f'<div class="seg">{short}</div><details><summary>show all {n} tokens</summary>'
                f'<div class="seg">{_seg_html(node, 0, n, tokenizer)}</div></details>')
    return f'<div class="node" style="border-left-color:{KIND_COLOURS[kind]}">{hdr}{body}</div>'


def _chain_html(tree: CallTree, start: int, tokenizer: Decoder | None, edge: int) -> str:
    """A box holding a chain from ``start`` and, nested inside it, one box per branch at its end."""
    parts, nid = [], start
    while True:
        node = tree.nodes[nid]
        parts.append(_node_html(node, tokenizer, edge, node_kind(tree, node)))
        if len(node.children) != 1:
            break
        nid = node.children[0]
    kids = tree.nodes[nid].children
    if kids:
        parts.append(f'<div class="branch">{len(kids)} branches after node #{nid}</div>')
        parts.extend(_chain_html(tree, k, tokenizer, edge) for k in kids)
    return '<div class="box">' + "".join(parts) + "</div>"


def render_html(tree: CallTree, path: str | Path, tokenizer: Decoder | None = None, edge: int = EDGE_TOKENS) -> Path:
    """Write a self-contained page: nested boxes per branch, sampled tokens highlighted."""
    text_head = render_text(tree, None, width=0).splitlines()[:2]
    body = "".join(_chain_html(tree, r, tokenizer, edge) for r in tree.roots)
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>call tree "
            f"{html.escape(str(tree.meta.tree_id or ''))}</title><style>{_CSS}</style></head><body>"
            + "".join(f"<p class='hdr'>{html.escape(line)}</p>" for line in text_head)
            + "<p class='hdr'><span class='s'>sampled</span> <span class='c'>context</span> &nbsp; kinds: "
            + " ".join(f"<span style='border-left:4px solid {c};padding-left:3px'>{k}</span>"
                       for k, c in KIND_COLOURS.items()) + "</p>"
            + body + "</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


# ---- PNG ------------------------------------------------------------------------------------------
ROW_UNITS = 28.0  # a path longer than this (in drawing units) wraps onto the next band of lanes
GAP = 0.6


def _layout(tree: CallTree, scale: Callable[[int], float]) -> tuple[dict[int, tuple[float, float, float]], int]:
    """node → (x, width, y) and the number of bands.

    x runs along the sequence; each leaf owns a lane and a node sits in the lane of its first leaf;
    a node that would cross ``ROW_UNITS`` starts a new band below (bands stack all lanes again).
    """
    lane: dict[int, int] = {}
    for i, leaf in enumerate(tree.leaves()):  # preorder ids: leaves in display order
        lane[leaf] = i
    for n in reversed(tree.nodes):
        if n.children:
            lane[n.id] = lane[n.children[0]]
    lanes = len(tree.leaves())
    start: dict[int, tuple[float, int]] = {}
    pos: dict[int, tuple[float, float, float]] = {}
    for n in tree.nodes:  # parents first
        w = scale(len(n.tokens))
        x, band = (0.0, 0) if n.parent is None else start[n.parent]
        if x > 0 and x + w > ROW_UNITS:
            x, band = 0.0, band + 1
        pos[n.id] = (x, w, band * (lanes + 0.6) + lane[n.id])
        start[n.id] = (x + w + GAP, band)
    bands = 1 + max(int(y // (lanes + 0.6)) for _, _, y in pos.values()) if pos else 0
    return pos, bands


def render_png(tree: CallTree, path: str | Path, dpi: int = 110) -> Path:
    """Boxes sized by token count (width ∝ √tokens), colour = sampled share, lines = parent→child."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import FancyBboxPatch
    except ImportError as exc:
        raise ClawGymError("PNG rendering needs matplotlib: pip install matplotlib (or the dev extras)") from exc
    scale = lambda n: 0.35 + 0.12 * n ** 0.5  # noqa: E731 - sub-linear so outputs stay visible next to prompts
    if not tree.nodes:
        raise ClawGymError("cannot draw an empty call tree")
    pos, _ = _layout(tree, scale)
    span = max(x + w for x, w, _ in pos.values())
    height = max(y for _, _, y in pos.values()) + 1
    fig, ax = plt.subplots(figsize=(max(6.0, span * 0.75 + 1.5), min(max(2.5, 0.75 * height + 1.4), 80.0)))
    base = plt.get_cmap("YlOrRd")
    cmap = matplotlib.colors.LinearSegmentedColormap.from_list(
        "sampled_share", [base(0.08 + 0.84 * i / 15) for i in range(16)])  # drop the palest and darkest ends
    for n in tree.nodes:
        x, w, y = pos[n.id]
        for c in n.children:
            cx, _, cy = pos[c]
            if cx > x:  # same band: an elbow to the child's lane
                xs, ys = [x + w, x + w + GAP / 2, x + w + GAP / 2, cx], [y, y, cy, cy]
            else:  # wrapped onto the next band: down the right margin, back along the gap above the child
                xs = [x + w, x + w + GAP / 2, x + w + GAP / 2, cx - GAP / 3, cx - GAP / 3, cx]
                ys = [y, y, cy - 0.5, cy - 0.5, cy, cy]
            ax.plot(xs, ys, color="#555", lw=1, zorder=1)
        share = sum(n.sampled) / len(n.tokens)
        ax.add_patch(FancyBboxPatch((x, y - 0.3), w, 0.6, boxstyle="round,pad=0.02,rounding_size=0.08",
                                    fc=cmap(share), ec=KIND_COLOURS[node_kind(tree, n)], lw=1.6, zorder=2))
        label = f"#{n.id}\n{len(n.tokens)} tok"
        if w >= 1.4:
            label += f"\ncalls {_calls_label(n.calls, 14)}"
        ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=7, zorder=3,
                color="white" if share > 0.7 else "black")
    ax.set_xlim(-0.4, span + 0.4)
    ax.set_ylim(height - 0.4, -0.6)
    ax.axis("off")
    st = tree.stats()
    m = tree.meta
    name = " · ".join(str(v) for v in (m.task_id or m.tree_id, m.harness) if v)
    ax.set_title(f"{name}   {st.num_calls} calls, {st.nodes} nodes, {st.branches} branch points · "
                 f"{st.captured_tokens} → {st.tree_tokens} tokens (×{st.compression_ratio:.2f})", fontsize=9)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=matplotlib.colors.Normalize(0.0, 1.0))
    cb = fig.colorbar(sm, ax=ax, fraction=0.02, pad=0.01)
    cb.set_label("sampled share of node tokens", fontsize=7)
    cb.ax.tick_params(labelsize=6)
    from matplotlib.lines import Line2D

    seen = {node_kind(tree, n) for n in tree.nodes}
    ax.legend(handles=[Line2D([], [], color=c, lw=2, label=k) for k, c in KIND_COLOURS.items() if k in seen],
              loc="lower right", fontsize=6, title="call kind (box edge)", title_fontsize=6, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


# ---- the ``clawgym tree show`` command ------------------------------------------------------------
def load_trees(path: str | Path) -> list[CallTree]:
    """A tree JSONL gives its trees; an episode's ``calls.jsonl`` gives one tree built on the fly
    (with the episode's reward and status when ``episode.json`` lies next to it)."""
    import json

    from clawgym_env.capture.records import EpisodeRecord, read_calls
    from clawgym_env.capture.tree_io import FORMAT, read_jsonl

    path = Path(path)
    if not path.is_file():
        raise ClawGymError(f"{path} is not a file; give a call-tree JSONL or an episode's calls.jsonl")
    first: JSONObject = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError as exc:
                    raise ClawGymError(f"{path}: the first line is not JSON ({exc})") from exc
                break
    if first.get("format") == FORMAT:
        return read_jsonl(path)
    if "prompt_token_ids" not in first:
        raise ClawGymError(f"{path} holds neither call trees nor captured calls")
    calls = read_calls(path)
    ep = path.parent / "episode.json"
    if ep.is_file():
        return [CallTree.from_episodes([(EpisodeRecord.model_validate_json(ep.read_text()), calls)])]
    return [CallTree.from_calls(calls)]


def show(path: str | Path, html_out: str | None = None, png_out: str | None = None, tokenizer: Decoder | None = None,
         width: int = 120, colour: bool = False) -> str:
    """Text of every tree in ``path`` (segments decoded by ``tokenizer`` when given, else shown as ids); writes the
    first tree's HTML/PNG when asked."""
    trees = load_trees(path)
    if trees and html_out:
        render_html(trees[0], html_out, tokenizer)
    if trees and png_out:
        render_png(trees[0], png_out)
    return "\n".join(render_text(t, tokenizer, width, colour) for t in trees)
