"""Error analysis beside the evaluation: the most confident validation mistakes (a PNG gallery at the best
epoch), per-class precision/recall/F1, the most confused class pairs, and compact weight and gradient
histograms per layer group on diagnostics steps. Everything heavy stays on the device until one copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.data import Split
from core.events import Sink
from core.names import HIST_BINS, HIST_RANGE, HISTOGRAM_EVENT, MAX_MISCLASSIFIED, MISCLASSIFIED
from core.scores import class_scores


def top_confusions(cm: torch.Tensor, names: list[str], k: int = 20) -> list[tuple[str, str, int]]:
    """The k largest off-diagonal cells of a confusion matrix: (true class, predicted class, count)."""
    off = cm.clone()
    off.fill_diagonal_(0)
    counts, flat = off.flatten().topk(min(k, off.numel()))
    c = cm.shape[0]
    return [(names[int(i) // c], names[int(i) % c], int(n)) for n, i in zip(counts, flat, strict=True) if n > 0]


def confusion_scores(cm: torch.Tensor) -> dict[str, list[float]]:
    """Per-class precision, recall, F1 and support of a (true × predicted) confusion matrix."""
    return class_scores(cm.diag().tolist(), cm.sum(1).tolist(), cm.sum(0).tolist())


class Mistakes:
    """The k most confident wrong predictions of one validation pass (in the split's order), kept on the device:
    a few small ops per batch, no host sync until `picks`."""

    def __init__(self, device: torch.device, k: int = MAX_MISCLASSIFIED) -> None:
        self.k, self.seen = k, 0
        self.conf = torch.empty(0, device=device)
        self.index = torch.empty(0, device=device, dtype=torch.long)
        self.pred = torch.empty(0, device=device, dtype=torch.long)

    def add(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        conf, pred = logits.softmax(1).max(1)
        score = torch.where(pred != y, conf, -1.0)  # right answers rank below every mistake
        ids = torch.arange(self.seen, self.seen + len(y), device=y.device)
        self.seen += len(y)
        conf_all = torch.cat([self.conf, score])
        keep = conf_all.topk(min(self.k, len(conf_all))).indices
        self.conf, self.index = conf_all[keep], torch.cat([self.index, ids])[keep]
        self.pred = torch.cat([self.pred, pred])[keep]

    def picks(self) -> list[tuple[int, int, float]]:
        """(index in the validation split, predicted class, confidence), most confident first."""
        rows = zip(self.index.tolist(), self.pred.tolist(), self.conf.tolist(), strict=True)
        return [(i, p, c) for i, p, c in rows if c >= 0]


def write_gallery(split: Split, names: list[str], picks: list[tuple[int, int, float]], path: Path) -> dict[str, Any]:
    """A PNG grid of the picked validation images (no text: the classes are in the returned meta, cell by cell
    in reading order) and that meta: cell size, columns, padding, items."""
    from PIL import Image

    h = int(split.images[picks[0][0]].shape[-1])
    cell, cols, pad = max(32, min(96, h * 4)), min(8, len(picks)), 2
    rows = (len(picks) + cols - 1) // cols
    grid = Image.new("RGB", (cols * cell, rows * cell), "white")
    items = []
    for k, (i, pred, conf) in enumerate(picks):
        arr = split.images[i].cpu().numpy()
        arr = np.repeat(arr, 3, axis=0) if arr.shape[0] == 1 else arr[:3]
        im = Image.fromarray(arr.transpose(1, 2, 0)).resize((cell - 2 * pad, cell - 2 * pad), Image.NEAREST)
        grid.paste(im, ((k % cols) * cell + pad, (k // cols) * cell + pad))
        items.append(
            {"index": i, "true": names[int(split.labels[i])], "predicted": names[pred], "confidence": round(conf, 4)}
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return {"cell": cell, "cols": cols, "pad": pad, "items": items}


def store_gallery(
    sink: Sink, split: Split, names: list[str], mistakes: Mistakes, cm: torch.Tensor, epoch: int, out_dir: Path
) -> None:
    """The best epoch's gallery as one artifact (a file per epoch: an earlier one may still be uploading)."""
    picks = mistakes.picks()
    if not picks:
        return
    path = out_dir / "errors" / f"misclassified_epoch{epoch}.png"
    meta = write_gallery(split, names, picks, path)
    meta.update(epoch=epoch, top_confusions=top_confusions(cm, names, 10))
    sink.artifact(MISCLASSIFIED, str(path), meta)


def log_histograms(groups: dict[str, list[torch.nn.Parameter]]) -> tuple[list[tuple[str, str]], torch.Tensor] | None:
    """Histograms of log10 |value| of each group's weights and gradients, all in one torch.histc on the device:
    row r of the result is the values of rows[r] = (weight | grad, group), shifted into a band of its own."""
    lo, hi = HIST_RANGE
    width, half = hi - lo, (hi - lo) / HIST_BINS / 2
    rows, flat, sizes = [], [], []
    for name, ps in groups.items():
        for what, ts in (("weight", [p.detach() for p in ps]), ("grad", [p.grad for p in ps if p.grad is not None])):
            if ts:
                rows.append((what, name))
                flat += [t.reshape(-1) for t in ts]
                sizes.append(sum(t.numel() for t in ts))
    if not rows:
        return None
    v = torch.cat(flat).float().abs_().clamp_min_(1e-30).log10_().clamp_(lo + half, hi - half)
    for r, band in enumerate(v.split(sizes)):
        band.add_(r * width)  # in place: band r covers [lo + r·width, hi + r·width)
    n = HIST_BINS * len(rows)
    if v.device.type != "cpu" and torch.are_deterministic_algorithms_enabled():  # no deterministic histc there
        counts = torch.bincount(((v - lo) / (2 * half)).long().clamp_(0, n - 1), minlength=n).float()
    else:
        counts = torch.histc(v, bins=n, min=lo, max=lo + width * len(rows))
    return rows, counts.view(len(rows), HIST_BINS)


def emit_histograms(sink: Sink, step: int, hist: tuple[list[tuple[str, str]], torch.Tensor] | None) -> None:
    """One event per diagnostics step: {"weight": {group: counts}, "grad": {group: counts}} and the bins."""
    if hist is None:
        return
    rows, counts = hist
    data: dict[str, Any] = {
        "code": "histograms",
        "step": step,
        "bins": HIST_BINS,
        "range": list(HIST_RANGE),
        "scale": "log10 |value|",
        "weight": {},
        "grad": {},
    }
    for (what, name), row in zip(rows, counts.long().tolist(), strict=True):
        data[what][name] = row
    sink.event(HISTOGRAM_EVENT, "info", f"weight and gradient histograms at step {step}", data, step=step)
