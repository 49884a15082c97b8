"""The photo recipe: RandomResizedCrop, TrivialAugment / RandAugment and random erasing with every sample's own
draw; mixup / cutmix with their loss; the EMA of the weights (evaluated, chosen when better, exported, resumed);
and the preset that uses them all."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from core.checkpoint import load_checkpoint
from core.config import RunSpec, SpecError, load_spec
from core.criterion import Criterion
from core.ema import WeightEma
from core.events import MemorySink, StopFlag
from core.mixing import Mixer
from core.photo_augment import auto_augment, random_erasing, random_resized_crop
from core.spec_sections import AugmentSpec, EmaSpec, MixSpec
from core.train import run_training

PRESET = Path(__file__).parents[2] / "configs" / "photos_finetune.yaml"
RECIPE = {
    "data": {
        "name": "synthetic",
        "num_classes": 3,
        "num_samples": 96,
        "size": 12,
        "channels": 3,
        "augment": {"random_resized_crop": True, "hflip": True, "policy": "trivial", "random_erasing": 0.5},
    },
    "model": {"name": "simple_cnn", "hidden": 16, "dropout": 0.2},
    "train": {
        "epochs": 4,
        "batch_size": 16,
        "log_every": 1,
        "mix": {"mixup_alpha": 0.4, "cutmix_alpha": 1.0},
        "ema": {"enabled": True, "decay": 0.9},
    },
    "optim": {"name": "adamw", "weight_decay": 0.01},
    "schedule": {"name": "cosine"},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
    "deterministic": True,
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ramps(b: int, h: int = 64, w: int = 64) -> torch.Tensor:
    """b copies of an image whose channel 0 is its column and channel 1 its row, in [0, 1]."""
    cols = torch.linspace(0, 1, w).expand(h, w)
    rows = torch.linspace(0, 1, h)[:, None].expand(h, w)
    return torch.stack([cols, rows, torch.full((h, w), 0.5)]).expand(b, 3, h, w).contiguous()


# --- RandomResizedCrop ------------------------------------------------------------------------------------------
def test_random_resized_crop_gives_each_sample_its_own_box_within_the_scale_and_ratio_ranges():
    x = ramps(32)
    out = random_resized_crop(x, 24, (0.25, 0.5), (3 / 4, 4 / 3), gen())
    assert out.shape == (32, 3, 24, 24)
    width = out[:, 0].amax((1, 2)) - out[:, 0].amin((1, 2))  # the box's extent, as fractions of the image
    height = out[:, 1].amax((1, 2)) - out[:, 1].amin((1, 2))
    area = width * height
    assert (area > 0.25 * 0.8).all() and (area < 0.5 * 1.05).all(), area
    assert ((width / height) > 0.75 * 0.85).all() and ((width / height) < 4 / 3 * 1.15).all()
    left = out[:, 0, :, 0].amin(1)
    assert len({round(v, 3) for v in left.tolist()}) > 20, "one box for the whole batch"


def test_random_resized_crop_of_the_whole_image_at_its_size_is_the_image():
    x = torch.rand(4, 3, 20, 20)
    assert torch.allclose(random_resized_crop(x, 20, (1.0, 1.0), (1.0, 1.0), gen()), x, atol=1e-6)


def test_random_resized_crop_falls_back_to_the_centre_like_torchvision_when_no_box_fits():
    out = random_resized_crop(ramps(4), 16, (1.0, 1.0), (2.0, 3.0), gen())  # a 2:1 box of the whole area never fits
    rows, cols = out[:, 1], out[:, 0]
    assert torch.allclose(rows.mean((1, 2)), torch.full((4,), 0.5), atol=0.02)  # the centred band
    assert float((rows.amax((1, 2)) - rows.amin((1, 2))).mean()) == pytest.approx(0.5, abs=0.06)
    assert float((cols.amax((1, 2)) - cols.amin((1, 2))).mean()) == pytest.approx(1.0, abs=0.06)


def test_augmentation_draws_repeat_under_the_same_generator_and_differ_under_another():
    aug = AugmentSpec(random_resized_crop=True, hflip=True, policy="trivial", random_erasing=0.5, color_jitter=0.2)
    from core.augment import augment_batch

    x = torch.rand(8, 3, 40, 40)
    a, b = augment_batch(x, aug, gen(3), 32), augment_batch(x, aug, gen(3), 32)
    assert a.shape == (8, 3, 32, 32) and torch.equal(a, b)
    assert not torch.equal(a, augment_batch(x, aug, gen(4), 32))
    assert 0.0 <= float(a.min()) and float(a.max()) <= 1.0


# --- TrivialAugment / RandAugment --------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["trivial", "randaugment"])
def test_policies_draw_an_operation_per_sample_not_one_per_batch(policy):
    aug = AugmentSpec(policy=policy, magnitude=20, num_ops=2)
    x = ramps(48, 16, 16)  # identical samples: a draw for the whole batch would transform them all alike
    out = auto_augment(x, aug, gen())
    assert out.shape == x.shape and 0.0 <= float(out.min()) and float(out.max()) <= 1.0
    distinct = {tuple(s.flatten()[::7].round(decimals=3).tolist()) for s in out}
    assert len(distinct) > 8, len(distinct)
    assert torch.equal(out, auto_augment(x, aug, gen()))


def test_each_sample_gets_exactly_torchvisions_operation_for_its_own_draw():
    from torchvision.transforms import v2

    from core.photo_augment import _draw

    aug = AugmentSpec(policy="trivial")
    x = torch.rand(40, 3, 16, 16, generator=gen(5))
    out = auto_augment(x, aug, gen(6))
    t = v2.TrivialAugmentWide()
    names = list(t._AUGMENTATION_SPACE)
    drawn = _draw(t, aug, 40, 16, 16, gen(6))
    assert len({o for o, _ in drawn}) > 8
    for i, (o, m) in enumerate(drawn):
        alone = t._apply_image_or_video_transform(x[i : i + 1], names[o], m, t.interpolation, t._fill).clamp(0, 1)
        assert torch.allclose(out[i : i + 1], alone, atol=1e-6), (i, names[o], m)


def test_grayscale_images_take_every_policy_operation():
    x = torch.rand(200, 1, 12, 12)  # 200 samples draw every one of the 14 operations
    out = auto_augment(x, AugmentSpec(policy="trivial"), gen(1))
    assert out.shape == x.shape and torch.isfinite(out).all()


# --- random erasing ----------------------------------------------------------------------------------------------
def test_random_erasing_fills_one_box_of_2_to_33_percent_per_chosen_sample():
    x = torch.full((64, 3, 32, 32), 0.5)
    out = random_erasing(x, 1.0, gen())
    changed = (out != x).any(1).float().mean((1, 2))
    assert (changed > 0.015).all() and (changed <= 0.34).all(), changed
    assert len(set(changed.tolist())) > 10  # each sample its own box
    half = (random_erasing(x, 0.5, gen()) != x).any(1).flatten(1).any(1).float().mean()
    assert 0.25 < float(half) < 0.75


# --- mixup / cutmix ----------------------------------------------------------------------------------------------
def _mixed(spec: MixSpec, seed: int = 0):
    x = torch.arange(8, dtype=torch.float32)[:, None, None, None].expand(8, 1, 10, 10).contiguous()
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    return x, y, Mixer(spec, 4, seed, 1)(x, y)


def test_mixup_targets_sum_to_one_and_follow_the_blend_of_the_images():
    x, y, (mixed, target, leans_to) = _mixed(MixSpec(mixup_alpha=0.4))
    assert torch.allclose(target.sum(1), torch.ones(8))
    lam = float(target[0, y[0]])
    assert 0.0 < lam < 1.0
    assert torch.allclose(mixed, lam * x + (1 - lam) * x.roll(1, 0), atol=1e-6)
    assert torch.equal(leans_to, target.argmax(1))  # train/acc counts the label with the larger share


def test_cutmix_mixes_labels_by_the_area_pasted():
    x, y, (mixed, target, _) = _mixed(MixSpec(cutmix_alpha=1.0), seed=5)
    assert torch.allclose(target.sum(1), torch.ones(8))
    kept = (mixed == x).float().mean((1, 2, 3))  # each sample is its own constant: the share of it left
    assert torch.allclose(target[torch.arange(8), y], kept, atol=1e-6)


def test_the_mixed_loss_is_the_documented_mix_of_the_two_labels_losses():
    """loss(mixed target) = λ · loss(own label) + (1 − λ) · loss(partner's label), label smoothing included."""
    _, y, (_, target, _) = _mixed(MixSpec(mixup_alpha=0.4))
    lam = float(target[0, y[0]])
    logits = torch.randn(8, 4, generator=gen(2))
    crit = Criterion(None, 0.1)
    expected = lam * F.cross_entropy(logits, y, label_smoothing=0.1) + (1 - lam) * F.cross_entropy(
        logits, y.roll(1), label_smoothing=0.1
    )
    assert float(crit(logits, target)) == pytest.approx(float(expected), rel=1e-6)


def test_a_batch_left_unmixed_keeps_its_labels_and_loss():
    x, y, (mixed, target, leans_to) = _mixed(MixSpec(mixup_alpha=0.4, prob=0.0 + 1e-9), seed=0)
    assert torch.equal(mixed, x) and torch.equal(leans_to, y) and torch.equal(target, F.one_hot(y, 4).float())


def test_mixing_and_the_resized_crop_are_refused_with_the_field_named():
    with pytest.raises(SpecError) as e:
        RunSpec.from_dict({"data": {"augment": {"rrc_scale": [0.6, 0.2]}}})
    assert "data.augment.rrc_scale" in str(e.value)
    with pytest.raises(SpecError) as e:
        RunSpec.from_dict({"train": {"mix": {"mixup_alpha": -1}}})
    assert "train.mix.mixup_alpha" in str(e.value)


# --- EMA ---------------------------------------------------------------------------------------------------------
def test_ema_follows_the_documented_rule_and_copies_integer_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = WeightEma(model, EmaSpec(enabled=True, decay=0.9, warmup=False))
    w0 = model[0].weight.detach().clone()
    ema.update(model)  # the first update starts at the weights
    assert torch.equal(ema.module[0].weight, w0)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    model[1].num_batches_tracked.fill_(7)
    ema.update(model)
    assert torch.allclose(ema.module[0].weight, 0.9 * w0 + 0.1 * (w0 + 1.0))
    assert int(ema.module[1].num_batches_tracked) == 7
    warm = WeightEma(model, EmaSpec(enabled=True, decay=0.999))
    assert warm.decay() == pytest.approx(0.1) and ema.decay() == 0.9  # (1 + 0) / (10 + 0) at the first update


def _stop_after_epoch(k: int, sink: MemorySink, flag: StopFlag) -> None:
    original = sink.metrics

    def metrics(step, epoch, values):
        original(step, epoch, values)
        if "val/acc" in values and epoch == k:
            flag.set()

    sink.metrics = metrics  # type: ignore[method-assign]


def test_the_recipe_resumes_exactly_after_a_kill(tmp_path):
    """Mixup/cutmix, the resized crops, TrivialAugment, erasing and the EMA: 4 epochs at once or 2, a stop, 2 more."""
    spec = RunSpec.from_dict(RECIPE)
    full = MemorySink()
    ref = run_training(spec, tmp_path / "full", full)
    part, flag = MemorySink(), StopFlag()
    _stop_after_epoch(2, part, flag)
    first = run_training(spec, tmp_path / "part", part, control=flag)
    assert first["status"] == "cancelled" and first["epochs_run"] == 2
    rest = MemorySink()
    resumed = run_training(spec, tmp_path / "part", rest, resume=True)
    assert resumed["status"] == "completed" and "resumed" in rest.codes()
    assert rest.series("train/loss") == [(s, v) for s, v in full.series("train/loss") if s > first["global_step"]]
    for key in ("val/loss", "val/acc_ema", "val/loss_ema", "train/acc"):
        assert rest.series(key) == full.series(key)[2:], key
    assert resumed["best"] == ref["best"]
    a, b = (load_checkpoint(p / "checkpoints" / "last.pt") for p in (tmp_path / "full", tmp_path / "part"))
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for k, v in a["ema"]["weights"].items():
        assert torch.equal(v, b["ema"]["weights"][k]), k
    assert a["ema"]["updates"] == b["ema"]["updates"] == a["global_step"]


def test_the_better_of_the_weights_and_their_ema_counts_each_epoch(tmp_path):
    """The monitor takes the better of val/loss and val/loss_ema; best.pt holds the weights that won."""
    spec = RunSpec.from_dict(RECIPE, ["train.epochs=3", "optim.name=sgd", "optim.lr=0.5", "train.ema.decay=0.8"])
    sink = MemorySink()
    summary = run_training(spec, tmp_path, sink)
    val, ema = dict(sink.series("val/loss")), dict(sink.series("val/loss_ema"))
    assert len(ema) == 3 and summary["best"]["value"] == pytest.approx(min(min(val[s], ema[s]) for s in val))
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")
    step = max(s for s in val if s <= best["global_step"])
    assert best["ema"]["chosen"] == (ema[step] < val[step])
    if best["ema"]["chosen"]:
        assert all(torch.equal(v, best["ema"]["weights"][k]) for k, v in best["model"].items())


def test_an_ema_that_scores_better_is_chosen_saved_as_best_and_exported(tmp_path):
    """The average holds the trained weights, the weights themselves are knocked off: the EMA counts for the
    monitor, best.pt's model is the EMA, and an export of best.pt or last.pt holds the EMA weights."""
    from core.engine import train_one_epoch
    from core.evaluation import end_epoch
    from core.events import NeverStop
    from core.train import build_trainer, export_run, seed_everything

    spec = RunSpec.from_dict(RECIPE, ["train.epochs=1", "train.mix.mixup_alpha=0", "train.mix.cutmix_alpha=0"])
    seed_everything(spec.seed, spec.deterministic)
    sink = MemorySink()
    t = build_trainer(spec, tmp_path, sink, NeverStop(), torch.device("cpu"))
    figures = train_one_epoch(t, 1)
    t.ema.module.load_state_dict(t.model.state_dict())
    with torch.no_grad():
        for p in t.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen(9)) * 3)
    end_epoch(t, 1, figures, 1.0)
    (val,), (ema,) = (v for _, v in sink.series("val/loss")), (v for _, v in sink.series("val/loss_ema"))
    assert ema < val and t.ema.chosen and t.early.best == pytest.approx(ema)
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")
    ema_weights = t.ema.module.state_dict()
    assert all(torch.equal(v, ema_weights[k]) for k, v in best["model"].items())
    for which in ("best", "last"):
        out = tmp_path / f"export_{which}"
        assert export_run(tmp_path, which, ["torchscript"], out=out) == {"torchscript": True}
        exported = torch.jit.load(str(out / "model.ts")).state_dict()
        assert set(exported) == set(ema_weights), which
        assert all(torch.equal(exported[k], v) for k, v in ema_weights.items()), which


def test_without_ema_or_mixing_a_run_records_no_ema_figures(tmp_path):
    plain = RunSpec.from_dict(RECIPE, ["train.ema.enabled=false", "train.epochs=1"])
    sink = MemorySink()
    assert run_training(plain, tmp_path, sink)["status"] == "completed"
    assert not sink.series("val/acc_ema") and "ema" not in load_checkpoint(tmp_path / "checkpoints" / "last.pt")


# --- the preset --------------------------------------------------------------------------------------------------
def _photos(root: Path) -> Path:
    """Three classes of 640×480-shaped (here 40×30) colour photos, each class its own hue."""
    for c, color in enumerate([(200, 40, 40), (40, 200, 40), (40, 40, 200)]):
        (root / f"class_{c}").mkdir(parents=True)
        for i in range(12):
            g = torch.Generator().manual_seed(c * 100 + i)
            noise = (torch.rand(30, 40, 3, generator=g) * 60).to(torch.uint8)
            base = torch.tensor(color, dtype=torch.uint8).expand(30, 40, 3)
            Image.fromarray((base + noise).numpy()).save(root / f"class_{c}" / f"{i}.png")
    return root


def test_the_photos_preset_uses_the_recipe_and_trains_on_a_folder_of_photos(tmp_path):
    spec = load_spec(PRESET)
    aug = spec.data.augment
    assert spec.model.pretrained and spec.model.transfer == "finetune" and spec.data.name == "imagefolder"
    assert aug.random_resized_crop and aug.policy == "trivial" and aug.random_erasing > 0
    assert spec.train.mix.enabled and spec.train.ema.enabled and spec.train.label_smoothing > 0
    assert spec.optim.name == "adamw" and spec.schedule.name == "cosine" and spec.schedule.warmup_epochs > 0
    tiny = load_spec(
        PRESET,
        [
            f"data.path={_photos(tmp_path / 'photos')}",
            "model.name=simple_cnn",
            "model.pretrained=false",
            "model.transfer=scratch",
            "data.image_size=16",
            "train.epochs=2",
            "train.batch_size=8",
            "device=cpu",
            "export.formats=[torchscript]",
        ],
    )
    sink = MemorySink()
    summary = run_training(tiny, tmp_path / "run", sink)
    assert summary["status"] in ("completed", "early_stopped"), summary["error"]
    assert summary["export"] == {"torchscript": True}
    assert len(sink.series("val/acc_ema")) == 2 and math.isfinite(sink.series("train/loss")[-1][1])
