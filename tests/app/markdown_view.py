"""What a Markdown string shows once rendered, for tests that check a user's string is shown as its text.

It is rendered with markdown-it-py (CommonMark, plus GFM's strikethrough and tables) to HTML, read back as
text and tags. Streamlit's frontend also rewrites the text once it is parsed — URLs and e-mail addresses
become links (GFM autolink literals; an e-mail address too, which app.present.text leaves as a mailto link to
exactly the address shown), `:name:` an emoji, a Material icon or its logo, a lone `->` or `--` an
arrow or a dash — so `rewritten` lists which of those patterns (Streamlit 1.67's, with JavaScript's `\\s`)
the shown text still holds."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from markdown_it import MarkdownIt

JOINER = "\u2060"  # app.present.text.WORD_JOINER: invisible, so a reader sees the text without it
_MD = MarkdownIt("commonmark").enable(["strikethrough", "table"])
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
REWRITES = {
    "link": re.compile(r"https?://|www(?=\.)", re.I | re.A),
    # Emoji names (remark-emoji's list) all hold a letter, `_`, `+` or `-`, but for :100: and :1234:.
    "shortcode": re.compile(r":[\w+-]*[A-Za-z_+-][\w+-]*:|:100:|:1234:", re.A),
    "typography": re.compile(rf"(?:^|[{_JS_SPACE}])(?:<->|->|<-|--|>=|<=|~=)(?:[{_JS_SPACE}]|$)"),
}


@dataclass
class Shown:
    html: str
    text: str  # as a reader sees it: word joiners left out
    raw_text: str  # with them, and without what is in code spans (Streamlit rewrites none of that)
    tags: list[tuple[str, dict]] = field(default_factory=list)
    code: list[str] = field(default_factory=list)  # the text of each <code>

    def has(self, tag: str) -> bool:
        return any(t == tag for t, _ in self.tags)

    def rewritten(self) -> list[str]:
        return [name for name, pattern in REWRITES.items() if pattern.search(self.raw_text)]


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.plain: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.code: list[str] | None = None
        self.codes: list[str] = []
        self.depth = 0  # text between blocks (the renderer's line breaks) is nobody's

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.depth += 1
        if tag == "code":
            self.code = []

    def handle_endtag(self, tag):
        self.depth -= 1
        if tag == "code" and self.code is not None:
            self.codes.append("".join(self.code))
            self.code = None

    def handle_data(self, data):
        if self.depth > 0:
            self.parts.append(data)
        if self.code is not None:
            self.code.append(data)
        elif self.depth > 0:
            self.plain.append(data)


def shown(markdown: str) -> Shown:
    html = _MD.render(markdown)
    reader = _Reader()
    reader.feed(html)
    reader.close()
    text = "".join(reader.parts).replace(JOINER, "")
    return Shown(html, text, "".join(reader.plain), reader.tags, [c.replace(JOINER, "") for c in reader.codes])
