"""Plotly charts that update in place: zoom, pan and legend selections survive new data.

st.plotly_chart (Streamlit 1.67) derives the chart's identity from its figure, so every refresh
with new points mounts a new chart and the user's zoom is lost whatever `uirevision` says. This
tiny component keeps one Plotly div per chart and calls `Plotly.react` with each new figure,
which is what honours `uirevision`; all the charts of a page share one frame, so the browser
loads plotly.js once. Its frontend is one HTML page written at first use, into torchdeck's own
data folder (not a shared /tmp, where another local user could plant a page), next to a copy of
the plotly.js that ships inside the plotly Python package: nothing is fetched from the internet.

A live page refreshes several times a second, so each refresh costs as little as it can:
- every chart carries a stamp (a hash of its figure); a figure is sent with the next RESENDS
  refreshes after it changed (a refresh's message can be superseded before the browser draws it),
  then by its stamp only: a refresh where nothing changed sends titles and stamps, and one where
  the loss grew sends the charts whose series grew;
- a frame that lacks a figure it is asked to keep (it was re-created: another tab and back, a
  reconnect) asks for everything (its component value, a fresh nonce; again after a second if
  still missing);
- the browser redraws a changed chart when it is on screen, and an off-screen one when it scrolls
  into view, within a budget (a token bucket: DRAW_SHARE of its time, BURST_MS saved for a chart that
  grows now and then); a background tab draws nothing;
- given a `feed` (the Run page of a running run, served with app/live/route.py's route: its path and a
  grant), the frame asks that route for what changed itself, one long poll at a time and only when its
  budget could draw the answer: no page rerun per new point. The grant travels in a request header.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import orjson
import plotly
import plotly.graph_objects as go
import plotly.io as pio
import streamlit as st
import streamlit.components.v1 as components

from db.engine import data_home

_INDEX = """<!doctype html>
<html><head><meta charset="utf-8">
<style>
html,body{margin:0;padding:0;overflow:hidden;background:transparent}
#grid{display:grid;gap:8px 16px}
</style>
<script src="plotly.min.js"></script>
<script src="template.js"></script></head>
<body><div id="grid"></div>
<script>
// The Streamlit component protocol (v1), without its npm helper: ready → render events → height.
// One frame (one copy of plotly.js) for all the charts of a page; one div per chart title, kept
// across renders so that Plotly.react honours each figure's uirevision (zoom, legend choices).
const grid = document.getElementById("grid");
const divs = new Map();     // title -> div (its dataset.stamp: the figure it shows or will show, with the theme)
const held = new Map();     // title -> {stamp, spec}: the last figure received for it
const pending = new Map();  // title -> figure to draw when its div is on screen
let askedAt = 0;            // when this frame last asked for every figure again
function send(type, data) {
  window.parent.postMessage(Object.assign({isStreamlitMessage: true, type: type}, data || {}), "*");
}
const onScreen = new Set();
const observer = new IntersectionObserver((entries) => {
  for (const e of entries) {
    const title = e.target.dataset.title;
    if (e.isIntersecting) { onScreen.add(title); if (pending.has(title)) schedule(); } else onScreen.delete(title);
  }
});
// Drawing is budgeted like a token bucket: redraw time accrues at DRAW_SHARE of the frame's time, up to
// BURST_MS saved. A chart that grew now and then (20-40 ms) redraws at once; a training run whose every
// chart grows at each flush redraws them in turn, never more than DRAW_SHARE of the time in all.
const DRAW_SHARE = 0.03, BURST_MS = 600;
let tokens = BURST_MS, filled = performance.now(), queued = false;
function waitFor() {  // ms until the bucket has time for another redraw
  const now = performance.now();
  tokens = Math.min(BURST_MS, tokens + (now - filled) * DRAW_SHARE);
  filled = now;
  return tokens > 0 ? 0 : -tokens / DRAW_SHARE;
}
function drawable() {  // a redraw is waiting that will happen (its chart is on screen, or never drawn)
  for (const title of pending.keys()) {
    const div = divs.get(title);
    if (div && (onScreen.has(title) || !div.dataset.drawn)) return true;
  }
  return false;
}
let turn = 0;  // the latest schedule(): a trigger of an earlier one does nothing
function schedule() {
  if (queued) return;
  queued = true;
  const mine = ++turn;
  const go = () => { if (queued && turn === mine) drawPending(); };
  setTimeout(() => {
    // In an animation frame; a frame the browser does not paint yet (no height given to it so far) gets no
    // animation frames, so a timer draws it instead, unless the tab is in the background.
    requestAnimationFrame(go);
    setTimeout(() => { if (!document.hidden) go(); }, 300);
  }, waitFor());
}
document.addEventListener("visibilitychange", () => { if (!document.hidden && pending.size) schedule(); });
function drawPending() {  // never while the tab is in the background
  queued = false;
  waitFor();
  for (const [title, item] of pending) {
    const div = divs.get(title);
    if (!div) { pending.delete(title); continue; }
    const update = Boolean(div.dataset.drawn);
    if (update && !onScreen.has(title)) continue;  // an update off screen waits until it is seen
    if (update && tokens <= 0) { schedule(); break; }  // the rest in a later turn, in this order
    pending.delete(title);
    const t = performance.now();
    const fig = typeof item === "string" ? themed(JSON.parse(item), theme) : item;
    Plotly.react(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
    div.dataset.drawn = "1";
    if (update) tokens -= performance.now() - t;  // a first drawing is not a refresh: never budgeted
  }
}
let shownHeight = -1;
function themed(fig, theme) {
  const lines = theme.base === "dark" ? "rgba(250,250,250,0.15)" : "rgba(49,51,63,0.12)";
  fig.layout = Object.assign({template: TEMPLATE}, fig.layout, {autosize: true});
  if (theme.textColor) fig.layout.font = Object.assign({}, fig.layout.font, {color: theme.textColor});
  for (const k of Object.keys(fig.layout).concat(["xaxis", "yaxis"])) {
    if (/^[xy]axis[0-9]*$/.test(k)) {
      fig.layout[k] = Object.assign({}, fig.layout[k], {gridcolor: lines, zerolinecolor: lines, linecolor: lines});
    }
  }
  return fig;
}
function askAgain() {  // a rerun of the charts with every figure (a new component value)
  askedAt = performance.now();
  send("streamlit:setComponentValue", {value: Math.random().toString(36).slice(2), dataType: "json"});
}
let theme = {}, feed = null, polling = false;  // feed: {url, grant} of the live route, or null
const sleep = (ms) => new Promise(r => setTimeout(r, ms));
// A running run's charts come from the dashboard's live route (app/live/route.py) instead of page reruns:
// one long poll at a time, none while the tab is hidden or a redraw is still waiting for its budget. The grant
// goes in a header, never in the URL (which proxies and browsers log).
async function poll() {
  polling = true;
  while (feed) {
    if (document.hidden || drawable()) { await sleep(50); continue; }
    const room = waitFor();  // while redraws use their whole budget, asking for more would only be thrown away
    if (room > 0) { await sleep(room); continue; }
    const asked = feed;
    const have = Array.from(held.values(), h => h.stamp).join(",");
    let body = null, refused = false;
    try {
      const resp = await fetch(asked.url + "?have=" + encodeURIComponent(have),
                               {cache: "no-store", headers: {"X-Torchdeck-Grant": asked.grant}});
      refused = resp.status === 403 || resp.status === 404;  // expired, its session gone, another sign-in
      if (resp.ok) body = await resp.json();  // 429 (too many polls at once) and errors: try again shortly
    } catch (e) { body = null; }
    if (refused) {  // the page makes another grant: asked at most every 2 s, should it be refused at once again
      const wait = askedAt + 2000 - performance.now();
      if (wait > 0) await sleep(wait);
      if (!feed || asked.grant !== feed.grant) continue;  // a new grant came meanwhile
      feed = null; askAgain(); break;
    }
    if (!feed || asked.grant !== feed.grant) continue;
    if (!body) { await sleep(1000); continue; }  // the server is restarting or busy: try again shortly
    if (body.finished) { feed = null; askAgain(); break; }  // the run ended: the page shows its final charts
    show(body.charts);
  }
  polling = false;
}
window.addEventListener("message", (event) => {
  const msg = event.data;
  if (!msg || msg.type !== "streamlit:render") return;
  // The page's theme (light, dark or custom): text and grid lines in its colours, never a hard-coded white chart.
  theme = msg.theme || {};
  grid.style.gridTemplateColumns = "repeat(" + msg.args.columns + ", minmax(0, 1fr))";
  const given = msg.args.feed;  // the route on this frame's own server, and this session's grant
  feed = given ? {url: new URL(given.path, window.location.href).href, grant: given.grant} : null;
  show(msg.args.charts);
  if (feed && !polling) poll();
});
function show(charts) {
  const look = (theme.base || "") + (theme.textColor || "");
  const wanted = new Set(charts.map(c => c.title));
  for (const [title, div] of divs) {
    if (!wanted.has(title)) {
      observer.unobserve(div); Plotly.purge(div); div.remove(); divs.delete(title); pending.delete(title);
      held.delete(title);
    }
  }
  const missing = [];
  charts.forEach((c, i) => {
    let div = divs.get(c.title);
    if (!div) {
      div = document.createElement("div"); div.dataset.title = c.title; divs.set(c.title, div); observer.observe(div);
    }
    if (grid.children[i] !== div) grid.insertBefore(div, grid.children[i] || null);
    const stamp = c.stamp + "|" + look;
    if (div.dataset.stamp === stamp) return;  // unchanged (a per-epoch chart between epochs): no work
    if (c.spec !== null) held.set(c.title, {stamp: c.stamp, spec: c.spec});
    const have = held.get(c.title);
    // A figure is sent only while it is new: one this frame never got (it was re-created), ask for all again.
    if (!have || have.stamp !== c.stamp) { missing.push(c.stamp); return; }
    div.dataset.stamp = stamp;
    if (div.dataset.drawn) { pending.set(c.title, have.spec); return; }  // an update is read when it is drawn
    const fig = themed(JSON.parse(have.spec), theme);
    div.style.height = (fig.layout.height || 300) + "px";
    pending.set(c.title, fig);
  });
  if (pending.size) schedule();
  if (missing.length && performance.now() - askedAt > 1000) askAgain();
  const height = grid.scrollHeight;
  if (height !== shownHeight) { shownHeight = height; send("streamlit:setFrameHeight", {height: height}); }
}
send("streamlit:componentReady", {apiVersion: 1});
</script></body></html>
"""
FONT = {"family": "Source Sans Pro, sans-serif", "size": 12, "color": "#31333f"}
CLEAR = "rgba(0,0,0,0)"
RESENDS = 3  # a changed figure is sent with this many refreshes, then by its stamp only


@dataclass(frozen=True)
class Chart:
    """One chart as sent to the browser: its figure's JSON and a stamp that changes with it."""

    title: str
    spec: str
    stamp: str


def _plotly_default(value):
    return plotly.utils.PlotlyJSONEncoder().default(value)


def chart(title: str, fig: dict | go.Figure) -> Chart:
    """A figure (line_dict's plain structure, or a go.Figure) as a Chart: transparent, in the page's font;
    the browser adds the white template and the page theme's colours."""
    if isinstance(fig, go.Figure):
        fig = fig.to_plotly_json()
    layout = {**fig["layout"], "font": FONT, "paper_bgcolor": CLEAR, "plot_bgcolor": CLEAR}
    layout.pop("template", None)
    spec = orjson.dumps(
        {"data": fig["data"], "layout": layout}, default=_plotly_default, option=orjson.OPT_SERIALIZE_NUMPY
    ).decode()
    return Chart(title, spec, hashlib.blake2b(spec.encode(), digest_size=10).hexdigest())


@lru_cache(maxsize=1)
def _component():
    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    template = (
        "const TEMPLATE = "
        + orjson.dumps(
            pio.templates["plotly_white"].to_plotly_json(), default=_plotly_default, option=orjson.OPT_SERIALIZE_NUMPY
        ).decode()
        + ";\n"
    )
    tag = hashlib.sha256((_INDEX + template + plotly.__version__).encode()).hexdigest()[:12]
    cache = (data_home() / "cache").resolve()
    cache.mkdir(parents=True, exist_ok=True)
    folder = cache / f"live-chart-{tag}"
    if not (folder / "index.html").is_file():
        staging = Path(tempfile.mkdtemp(prefix="live-chart-", dir=cache))  # same filesystem: rename is atomic
        shutil.copy(source, staging / "plotly.min.js")  # a copy: the component server refuses symlinks
        (staging / "template.js").write_text(template)
        (staging / "index.html").write_text(_INDEX)
        try:
            staging.rename(folder)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return components.declare_component("torchdeck_live_chart", path=str(folder))


def asked_again(key: str) -> bool:
    """Whether the frame of the live charts under `key` has asked for every figure again, unanswered yet."""
    need = st.session_state.get(key)
    return need is not None and need != st.session_state.get(f"{key}.need")


def live_charts(
    figures: list[Chart | tuple[str, dict | go.Figure]], *, columns: int, key: str, feed: dict[str, str] | None = None
) -> None:
    """Draw the charts in a grid of `columns`; later calls with the same key update the same charts in
    place (matched by title), sending a figure with the next RESENDS refreshes after it changed and by
    its stamp only after that. With `feed` ({"path": the dashboard's live route, "grant": a grant of it; see
    app/live/route.py}) the frame itself keeps the charts up to date from there, without any page rerun."""
    charts = [c if isinstance(c, Chart) else chart(*c) for c in figures]
    state = st.session_state
    sent_key, need_key = f"{key}.sent", f"{key}.need"
    if sent_key not in state or asked_again(key):
        state[sent_key], state[need_key] = {}, state.get(key)
    sent: dict[str, tuple[str, int]] = state[sent_key]
    args = []
    for c in charts:
        stamp, times = sent.get(c.title, ("", 0))
        fresh = stamp != c.stamp or times < RESENDS
        args.append({"title": c.title, "stamp": c.stamp, "spec": c.spec if fresh else None})
    _component()(charts=args, columns=columns, feed=feed, key=key, default=None)
    for c in charts:  # counted once the message is on its way (a refresh can be cut short before it)
        stamp, times = sent.get(c.title, ("", 0))
        sent[c.title] = (c.stamp, times + 1 if stamp == c.stamp else 1)
