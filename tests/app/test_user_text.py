"""User text in Markdown and charts (app.present.text.md_text, code_span, plot_text): whatever a run's name, a tag,
a class name or a message holds, it renders back to exactly itself, with no markup and nothing that
Streamlit's frontend would turn into a link, an emoji, an icon or an arrow."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_view import JOINER, shown

from app.present.text import code_span, md_text, plot_text

# Every character Markdown, GFM, Streamlit or HTML give a meaning, and the words of the rewritten patterns.
MARKUP = list("\\`*_{}[]()#+-.!|<>~$:&=@/\"'%^;?,") + [
    " ",
    "\t",
    "\n",
    "\r",
    "\r\n",
    "\0",
    "\ufeff",
    "\x0c",
    "1",
    "a",
    "é",
    "http",
    "www",
    "material",
    "smile",
    "+1",
    "streamlit",
    "--",
    "->",
    "<=",
    "    ",
]
# A vertical tab is left out: markdown-it trims it at a paragraph's ends, Streamlit's parser keeps it; neither
# shows anything for it.
TEXT = st.one_of(
    st.text(st.characters(exclude_characters="\v")), st.lists(st.sampled_from(MARKUP), max_size=24).map("".join)
)
NEWLINE = re.compile(r"\r\n|\r|\n")
ATTACKS = (
    "![x](https://elsewhere/p.png)",
    "`tag`` with ``` backticks`",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    ":red[red] :material/home: :smile: $x^2$",
    "# heading",
    "- item",
    "1. item",
    "> quote",
    "a -> b -- c",
    "www.example.com ana@example.com",
    "&amp; &#60;",
    "***",
    "~~x~~",
    "|a|b|",
    "    indented",
    "x\n===",
    ":::note",
    "\\*not bold\\*",
)


def expected(s: str) -> str:
    return NEWLINE.sub("\n", s.replace("\0", "\ufffd")).replace(JOINER, "")


def element_text(markdown: str, tag: str) -> tuple[str, list[str]]:
    """The text of the one `tag` element the Markdown renders to, and every tag it renders."""
    view = shown(markdown)
    tags = [t for t, _ in view.tags]
    assert tags.count(tag) == 1, (markdown, view.html)
    inner = re.search(rf"<{tag}>(.*)</{tag}>", view.html, re.S)
    assert inner is not None, view.html
    return _text_of(inner.group(1)), tags


def _text_of(fragment: str) -> str:
    parts: list[str] = []
    parser = HTMLParser(convert_charrefs=True)
    parser.handle_data = parts.append
    parser.feed(fragment)
    parser.close()
    return "".join(parts).replace(JOINER, "")


@settings(max_examples=400, deadline=None)
@given(TEXT)
@example("![x](https://elsewhere/p.png)")
def test_md_text_renders_as_exactly_its_text_in_a_paragraph_a_heading_and_bold(s):
    for template, tag, allowed in (
        ("{}", "p", {"p"}),
        ("# {}", "h1", {"h1"}),
        ("x **{}** y", "strong", {"p", "strong"}),
    ):
        if not s:
            continue  # nothing to draw (`****` would not even be bold)
        text, tags = element_text(template.format(md_text(s)), tag)
        assert text == expected(s), (template, md_text(s))
        assert set(tags) <= allowed, (template, md_text(s), tags)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_md_text_leaves_nothing_for_streamlit_to_rewrite(s):
    view = shown(f"x {md_text(s)} y")
    assert view.text == f"x {expected(s)} y"
    assert view.rewritten() == [], (s, md_text(s))
    assert ":material/" not in md_text(s)  # rewritten in the Markdown source, before it is parsed


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_md_text_multiline_keeps_the_line_breaks(s):
    lines = NEWLINE.split(s.replace("\0", "\ufffd"))
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()  # trailing blank lines show nothing anyway
    body = md_text(s, multiline=True)
    if not "".join(lines):
        return
    view = shown(f"**Error:** {body}")
    assert set(t for t, _ in view.tags) <= {"p", "strong", "br"}, view.html
    assert view.text == "Error: " + "\n".join(lines).replace(JOINER, ""), (s, body)


@settings(max_examples=400, deadline=None)
@given(TEXT)
@example("`tag`` with ``` backticks`")
@example(" ` ")
def test_code_span_shows_exactly_its_text_as_one_code_span(s):
    span = code_span(s)
    flat = " ".join(NEWLINE.split(s.replace("\0", "\ufffd")))
    view = shown(f"tags {span} end")
    if not flat:
        assert span == "" and view.code == []
        return
    assert view.code == [flat.replace(JOINER, "")], (s, span, view.html)
    assert set(t for t, _ in view.tags) == {"p", "code"}
    assert ":material/" not in span


@given(TEXT)
def test_plot_text_has_no_markup_and_unescapes_to_itself(s):
    out = plot_text(s)
    assert "<" not in out and ">" not in out and html.unescape(out) == s


def test_the_known_attacks_render_literally():
    for s in ATTACKS:
        view = shown(f"owner {md_text(s)} · tags {code_span(s)}")
        assert [t for t, _ in view.tags] == ["p", "code"], (s, view.html)
        assert view.text == f"owner {s} · tags {' '.join(s.splitlines())}", (s, view.text)
        assert not view.rewritten(), s


def test_our_own_formatting_still_works_around_user_text():
    view = shown(f"**{md_text('a*b')}** — {md_text('_x_')}\n\n**What to do:** {md_text('lower lr')}")
    assert [t for t, _ in view.tags] == ["p", "strong", "p", "strong"]
    assert view.text == "a*b — _x_What to do: lower lr"
