"""Plotly charts that update in place: zoom, pan and legend selections survive new data.

st.plotly_chart (Streamlit 1.67) derives the chart's identity from its figure, so every refresh
with new points mounts a new chart and the user's zoom is lost whatever `uirevision` says. This
tiny component keeps one Plotly div per chart and calls `Plotly.react` with each new figure,
which is what honours `uirevision`; all the charts of a page share one frame, so the browser
loads plotly.js once. Its frontend is one HTML page written at first use, into torchdeck's own
data folder (not a shared /tmp, where another local user could plant a page), next to a copy of
the plotly.js that ships inside the plotly Python package: nothing is fetched from the internet."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import plotly
import plotly.graph_objects as go
import streamlit.components.v1 as components

from db.engine import data_home

_INDEX = """<!doctype html>
<html><head><meta charset="utf-8">
<style>
html,body{margin:0;padding:0;overflow:hidden;background:transparent}
#grid{display:grid;gap:8px 16px}
</style>
<script src="plotly.min.js"></script></head>
<body><div id="grid"></div>
<script>
// The Streamlit component protocol (v1), without its npm helper: ready → render events → height.
// One frame (one copy of plotly.js) for all the charts of a page; one div per chart title, kept
// across renders so that Plotly.react honours each figure's uirevision (zoom, legend choices).
const grid = document.getElementById("grid");
const divs = new Map();
function send(type, data) {
  window.parent.postMessage(Object.assign({isStreamlitMessage: true, type: type}, data || {}), "*");
}
let shownHeight = -1;
window.addEventListener("message", (event) => {
  const msg = event.data;
  if (!msg || msg.type !== "streamlit:render") return;
  const charts = msg.args.charts;
  // The page's theme (light, dark or custom): text and grid lines in its colours, never a hard-coded white chart.
  const theme = msg.theme || {};
  const lines = theme.base === "dark" ? "rgba(250,250,250,0.15)" : "rgba(49,51,63,0.12)";
  grid.style.gridTemplateColumns = "repeat(" + msg.args.columns + ", minmax(0, 1fr))";
  const wanted = new Set(charts.map(c => c.title));
  for (const [title, div] of divs) {
    if (!wanted.has(title)) { Plotly.purge(div); div.remove(); divs.delete(title); }
  }
  charts.forEach((c, i) => {
    let div = divs.get(c.title);
    if (!div) { div = document.createElement("div"); divs.set(c.title, div); }
    if (grid.children[i] !== div) grid.insertBefore(div, grid.children[i] || null);
    const stamp = c.spec + "|" + (theme.base || "") + (theme.textColor || "");
    if (div.dataset.spec === stamp) return;  // unchanged (a per-epoch chart between epochs): no work
    div.dataset.spec = stamp;
    const fig = JSON.parse(c.spec);
    fig.layout = Object.assign({}, fig.layout, {autosize: true});
    if (theme.textColor) fig.layout.font = Object.assign({}, fig.layout.font, {color: theme.textColor});
    for (const k of Object.keys(fig.layout).concat(["xaxis", "yaxis"])) {
      if (/^[xy]axis[0-9]*$/.test(k)) {
        fig.layout[k] = Object.assign({}, fig.layout[k], {gridcolor: lines, zerolinecolor: lines, linecolor: lines});
      }
    }
    div.style.height = (fig.layout.height || 300) + "px";
    Plotly.react(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
  });
  const height = grid.scrollHeight;
  if (height !== shownHeight) { shownHeight = height; send("streamlit:setFrameHeight", {height: height}); }
});
send("streamlit:componentReady", {apiVersion: 1});
</script></body></html>
"""
FONT = {"family": "Source Sans Pro, sans-serif", "size": 12, "color": "#31333f"}


@lru_cache(maxsize=1)
def _component():
    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    tag = hashlib.sha256((_INDEX + plotly.__version__).encode()).hexdigest()[:12]
    cache = (data_home() / "cache").resolve()
    cache.mkdir(parents=True, exist_ok=True)
    folder = cache / f"live-chart-{tag}"
    if not (folder / "index.html").is_file():
        staging = Path(tempfile.mkdtemp(prefix="live-chart-", dir=cache))  # same filesystem: rename is atomic
        shutil.copy(source, staging / "plotly.min.js")  # a copy: the component server refuses symlinks
        (staging / "index.html").write_text(_INDEX)
        try:
            staging.rename(folder)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return components.declare_component("torchdeck_live_chart", path=str(folder))


def live_charts(figures: list[tuple[str, go.Figure]], *, columns: int, key: str) -> None:
    """Draw the figures in a grid of `columns`; later calls with the same key update the same
    charts in place (matched by title)."""
    charts = []
    for title, fig in figures:
        fig.update_layout(template="plotly_white", font=FONT, paper_bgcolor="rgba(0,0,0,0)",
                          plot_bgcolor="rgba(0,0,0,0)")
        charts.append({"title": title, "spec": fig.to_json()})
    _component()(charts=charts, columns=columns, key=key, default=None)
