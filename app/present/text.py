"""Formatting for people: statuses, durations, ETAs, sizes, best metrics, and user text made safe
for Markdown (md_text, code_span) and for Plotly's text (plot_text)."""

from __future__ import annotations

import html
import math
import re
from datetime import UTC, datetime

from db.types import RunRecord

EMPTY = "–"  # what a cell or a figure shows for a value that is not there (yet); never "None"

# Material icons (bundled with Streamlit): emoji fonts are missing on many servers and kiosks.
STATUS_ICON = {
    "queued": "schedule",
    "running": "play_circle",
    "completed": "check_circle",
    "early_stopped": "stop_circle",
    "cancelled": "cancel",
    "failed": "error",
    "diverged": "warning",
    "lost": "help",
    "pruned": "content_cut",
}
STATUS_COLOR = {
    "queued": "gray",
    "running": "blue",
    "completed": "green",
    "early_stopped": "green",
    "cancelled": "gray",
    "failed": "red",
    "diverged": "red",
    "lost": "orange",
    "pruned": "violet",
}


def status_label(status: str) -> str:
    """For tables (plain text: a table cell cannot show icons)."""
    return status.replace("_", " ")


def status_md(status: str) -> str:
    """For markdown: coloured, with an icon."""
    color = STATUS_COLOR.get(status, "gray")
    return f":{color}[:material/{STATUS_ICON.get(status, 'circle')}: {status_label(status)}]"


def now() -> datetime:
    return datetime.now(UTC)


def seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return EMPTY
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"


def duration_s(r: RunRecord) -> float | None:
    if r.started_at is None:
        return None
    end = r.finished_at or now()
    return (end - r.started_at).total_seconds()


def eta_s(r: RunRecord) -> float | None:
    """Remaining time at the rate so far; None until there is a rate to extrapolate."""
    p, d = r.progress or 0.0, duration_s(r)
    if r.status != "running" or d is None or p < 0.01:
        return None
    return d * (1 - p) / p


def age_s(t: datetime | None) -> float | None:
    return None if t is None else (now() - t).total_seconds()


def size(n: int | None) -> str:
    if n is None:
        return EMPTY
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def best(r: RunRecord) -> tuple[str, float | None]:
    """("val/acc", 0.97): the run's best monitored metric from its summary, else its best val/acc so far."""
    b = (r.summary or {}).get("best") or {}
    if b.get("metric") and b.get("value") is not None:
        return b["metric"], float(b["value"])
    acc = r.metrics.get("val/acc")
    if acc is not None and acc.max_value is not None:
        return "val/acc", acc.max_value
    return "", None


def best_text(r: RunRecord) -> str:
    metric, value = best(r)
    return f"{metric} {value:.4f}" if value is not None else ""


def run_label(r: RunRecord) -> str:
    return f"{r.name} ({r.id})" if r.name != r.id else r.id


# --- user text in Markdown and charts ------------------------------------------------------------
# Streamlit renders Markdown (GFM plus its directives, icons, emoji and LaTeX) in st.markdown, captions,
# alerts, titles, metric, tab, expander, button and page-link labels and help tooltips. A run's name or
# tags, a dataset's or class's name, an owner, an error or event message goes into any of them only
# through md_text (shown as text) or code_span (shown as code): nothing in it is ever markup.

# The characters that make Markdown (CommonMark, GFM, Streamlit's directives and LaTeX) or HTML anywhere in
# a line, and those that do only where a line starts (a list item `- `/`+ `/`1. `, a setext underline `=`):
# each is backslash-escaped, which CommonMark allows for any ASCII punctuation character. Underscores inside
# a word (`lr_sweep`) never make emphasis: they stay as they are.
_MD_PUNCT = re.compile(r"[\\`*{}\[\]()#|<>~$:&]|_+")
_LINE_START = re.compile(r"^(?:[-+=]|\d+\.)")
_NEWLINE = re.compile(r"\r\n|\r|\n")
# Blanks a paragraph would strip or take for indentation (JavaScript's trim, which some renderers use,
# strips Unicode spaces too): kept as character references where they start or end a line.
_EDGE_SPACE = re.compile(
    r"^[ \t\f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+"
    r"|[ \t\f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+$"
)
WORD_JOINER = "\u2060"  # invisible; splits what Streamlit's frontend would rewrite in the parsed text
# Streamlit rewrites text after the Markdown is parsed, where escapes no longer count: `http://…` and
# `www.…` become links, `:name:` an emoji, a Material icon or its logo, and a lone `->`, `--`, `<=` … an
# arrow or a dash. A word joiner inside each breaks the pattern and shows nothing. (Not in a time `12:30:45`,
# a port `host:8080`, nor an e-mail address: that one stays a mailto link to exactly the address shown, so
# that it copies intact.)
_REWRITTEN = re.compile(
    r"(?<=:)(?=(?:[A-Za-z0-9_+-]*[A-Za-z_+-][A-Za-z0-9_+-]*|100|1234)(?::|$)|material/)"
    r"|(?i:(?<=http:)|(?<=https:))(?=//)|(?i:(?<=www)(?=\.))"
)
_SYMBOL = re.compile(r"(?:^|(?<=[\s\ufeff]))(?:<->|->|<-|--|>=|<=|~=)(?=[\s\ufeff]|$)")  # JS's \s has U+FEFF


def _escape(m: re.Match) -> str:
    s, a, b = m.string, m.start(), m.end()
    if s[a] == "_" and 0 < a and b < len(s) and s[a - 1].isalnum() and s[b].isalnum():
        return m.group()
    return "".join("\\" + c for c in m.group())


def _md_line(line: str) -> str:
    line = _SYMBOL.sub(lambda m: WORD_JOINER.join(m.group()), _REWRITTEN.sub(WORD_JOINER, line))
    line = _MD_PUNCT.sub(_escape, line)
    line = _LINE_START.sub(lambda m: m.group()[:-1] + "\\" + m.group()[-1], line)
    # Leading and trailing blanks as character references: never an indented code block, never stripped.
    return _EDGE_SPACE.sub(lambda m: "".join(f"&#{ord(c)};" for c in m.group()), line)


def md_text(value: object, *, multiline: bool = False) -> str:
    """`value` as Markdown that renders as exactly its text, to interpolate into our own Markdown
    (`f"**{md_text(r.name)}** failed"`). Line breaks stay line breaks with multiline (a message's
    paragraphs), else they are kept as characters that start no new line (a title, a label)."""
    lines = _NEWLINE.split(str(value).replace("\0", "\ufffd"))
    if not multiline:
        return "&#10;".join(_md_line(line) for line in lines)
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()  # a hard line break cannot end a paragraph
    return "\\\n".join(_md_line(line) for line in lines)


def code_span(value: object) -> str:
    """`value` as inline code (a tag, an id, a path): a fence longer than any run of backticks in it,
    padded when it starts or ends with a backtick or a space. A code span shows a line break as a space."""
    text = " ".join(_NEWLINE.split(str(value).replace("\0", "\ufffd")))
    if not text:
        return ""
    text = text.replace(":material/", f":{WORD_JOINER}material/")  # Streamlit rewrites this even in code
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.strip(" ") and (text[0] == "`" or text[-1] == "`" or text[0] == text[-1] == " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def plot_text(value: object) -> str:
    """`value` for a Plotly title, legend, axis tick or hover label, where Plotly renders a subset of
    HTML (`<b>`, `<a href>`, `<br>`, entities): as its text."""
    return html.escape(str(value), quote=False)
