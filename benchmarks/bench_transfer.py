"""torchdeck's transfer learning against a careful hand-written transfer loop, few-shot, all offline.

Pretraining: torchdeck trains simple_cnn on the digits 0-4 (sklearn's 8×8 digits as an image folder,
resized to 16 px). Transfer: the digits 5-9 with --shots images per class (a fifth of them kept for
torchdeck's validation split), from that run's best.pt. torchdeck runs `transfer: feature_extract` and
`transfer: finetune` with its defaults (Adam at 1e-3, backbone × 0.1, gradient clipping at norm 1;
--clip none turns the clipping off) and early stopping off. The hand loop (plain PyTorch, below) starts
from the same weights with a fresh head, on the same training split, preprocessing, epochs, batch size
and seed: feature extraction freezes the backbone (kept in eval mode) and trains the head with Adam at
1e-3; fine-tuning trains everything with Adam, the head at 1e-3 and the backbone at 1e-4. Both are
scored on the held-out 5-9 digits (every image not among the shots) with their last epoch's weights.
Results are averaged over --seeds seeds.

Last lines: transfer_vs_hand_pts_<mode>=<torchdeck − hand accuracy, in points> for feature_extract and
finetune, and loaded_head_vs_hand_pts_feature_extract= for a plain state_dict with model.keep_head=true
(the old behaviour: the head of the other task's classes kept).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from core.checkpoint import load_checkpoint
from core.config import RunSpec
from core.data import Preprocess, load_data
from core.events import MemorySink
from core.imagefolder import load_imagefolder
from core.models import build_model
from core.spec_sections import ModelSpec
from core.train import run_training

SIZE, HIDDEN = 16, 128


def write_folders(root: Path, shots: int, seed: int) -> tuple[Path, Path, Path]:
    """digits 0-4 (all) for pretraining; 5-9: `shots` per class to transfer with, the rest held out."""
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = np.random.default_rng(seed)
    pre, few, test = root / "pre", root / "few", root / "test"
    for c in range(10):
        idx = np.flatnonzero(d.target == c)
        picked = set(rng.permutation(idx)[:shots].tolist()) if c >= 5 else set()
        for i in idx:
            where = pre if c < 5 else few if i in picked else test
            (where / str(c)).mkdir(parents=True, exist_ok=True)
            Image.fromarray((d.images[i] * 255 / 16).astype(np.uint8), mode="L").save(where / str(c) / f"{i}.png")
    return pre, few, test


def spec_for(path: Path, seed: int, epochs: int, batch: int, clip: str = "norm", **model: object) -> RunSpec:
    return RunSpec.from_dict(
        {
            "data": {"name": "imagefolder", "path": str(path), "image_size": SIZE, "val_fraction": 0.2},
            "model": {"name": "simple_cnn", "hidden": HIDDEN, **model},
            "optim": {"name": "adam", "lr": 1e-3},
            "train": {
                "epochs": epochs,
                "batch_size": batch,
                "early_stopping": {"enabled": False},
                "grad_clip": {"mode": clip},
            },
            "export": {"formats": []},
            "device": "cpu",
            "seed": seed,
        }
    )


class HandCNN(nn.Module):
    """The same architecture as torchdeck's simple_cnn, written out (state_dict keys without "net.")."""

    def __init__(self, classes: int, side: int = SIZE // 4):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.fc1 = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * side * side, HIDDEN), nn.ReLU(inplace=True), nn.Dropout(0.0)
        )
        self.fc2 = nn.Linear(HIDDEN, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(self.conv2(self.conv1(x))))


def hand_transfer(
    mode: str, weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, epochs: int, batch: int, seed: int
) -> nn.Module:
    """The hand recipe: pretrained backbone, fresh head; frozen backbone in eval mode, or all trained with a
    10× smaller backbone rate."""
    torch.manual_seed(seed)
    model = HandCNN(int(y.max()) + 1)
    backbone = {k.removeprefix("net."): v for k, v in weights.items() if not k.startswith("net.fc2.")}
    model.load_state_dict(backbone, strict=False)  # fc2 keeps its fresh init
    head = list(model.fc2.parameters())
    body = [p for n, p in model.named_parameters() if not n.startswith("fc2.")]
    if mode == "feature_extract":
        for p in body:
            p.requires_grad_(False)
        opt = torch.optim.Adam(head, lr=1e-3)
    else:
        opt = torch.optim.Adam([{"params": body, "lr": 1e-4}, {"params": head, "lr": 1e-3}])
    gen = torch.Generator().manual_seed(seed)
    crit = nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        if mode == "feature_extract":
            for m in (model.conv1, model.conv2, model.fc1):
                m.eval()
        for idx in torch.randperm(len(y), generator=gen).split(batch):
            opt.zero_grad(set_to_none=True)
            crit(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


@torch.inference_mode()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(1) == y).float().mean())


def one_seed(
    mode: str,
    pre_best: Path,
    few: Path,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    args: argparse.Namespace,
    seed: int,
    out: Path,
    **model: object,
) -> tuple[float, float]:
    """(torchdeck accuracy, hand accuracy) on the held-out images for one seed."""
    spec = spec_for(few, seed, args.epochs, args.batch, args.clip, weights_file=str(pre_best), transfer=mode, **model)
    run = out / f"{mode}-{seed}-{len(model)}"
    summary = run_training(spec, run, MemorySink())
    assert summary["status"] == "completed", summary
    data = load_data(spec.data, spec.seed, spec.model)  # the split and the statistics torchdeck used
    pre = Preprocess(data.info, None, torch.device("cpu"))
    td = build_model(ModelSpec(name="simple_cnn", hidden=HIDDEN), data.info.num_classes, 1, SIZE)
    td.load_state_dict(load_checkpoint(run / "checkpoints" / "last.pt")["model"])
    ck = load_checkpoint(pre_best)
    weights = ck.get("model", ck)  # a torchdeck checkpoint or a plain state_dict
    hand = hand_transfer(mode, weights, pre(data.train.images), data.train.labels, args.epochs, args.batch, seed)
    x = pre(x_test)
    return accuracy(td.eval(), x, y_test), accuracy(hand, x, y_test)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shots", type=int, default=10, help="images per new class (a fifth go to validation)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--clip",
        choices=["norm", "none"],
        default="norm",
        help="torchdeck's train.grad_clip.mode (default: its default, norm 1.0; the hand loop never clips)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        pre_dir, few, test = write_folders(root, args.shots, seed=0)
        pre_run = run_training(spec_for(pre_dir, 0, 6, 64), root / "pretrain", MemorySink())
        print(f"pretrain (digits 0-4): status {pre_run['status']}, best {pre_run['best']}")
        pre_best = root / "pretrain" / "checkpoints" / "best.pt"
        plain = root / "plain.pt"  # the same weights as a plain state_dict, for the keep_head line
        torch.save(load_checkpoint(pre_best)["model"], plain)
        x_test, y_test, classes, _ = load_imagefolder(str(test), SIZE, 0.0, 2048)
        print(f"transfer to digits {', '.join(classes)}: {args.shots} shots per class, {len(y_test)} held-out images")
        lines = {}
        for name, mode, weights, extra in (
            ("transfer_vs_hand_pts_feature_extract", "feature_extract", pre_best, {}),
            ("transfer_vs_hand_pts_finetune", "finetune", pre_best, {}),
            ("loaded_head_vs_hand_pts_feature_extract", "feature_extract", plain, {"keep_head": True}),
        ):
            diffs = []
            for seed in range(args.seeds):
                td, hand = one_seed(mode, weights, few, x_test, y_test, args, seed, root, **extra)
                diffs.append(100 * (td - hand))
                print(f"{name} seed {seed}: torchdeck {td:.4f}, hand {hand:.4f}")
            lines[name] = statistics.mean(diffs)
        for name, value in lines.items():
            print(f"{name}={value:.2f}")


if __name__ == "__main__":
    main()
