"""The catalog: every model, dataset and per-epoch metric torchdeck knows, each described once, as plain data.

Everything else reads it: the run schema's choices (core/spec_sections.py), the model builders (core/models.py), the
data loaders (core/data.py), the size estimate (core/model_size.py), early stopping (core/evaluation.py), the sweep
objectives (sweep/spec.py), the Runs filter (db/filters.py) and the dashboard's form and charts (app/). So a
new model is one MODELS entry (plus a builder in core/models.py only for a new family), and a new per-epoch
metric is one METRICS entry plus its measurement in core/evaluation.py's `evaluate`.

Torch-free and importing only core.names: the dashboard, the database layer and the schema read it without
paying torch's import. What torchvision says about a model (its weights' file and preprocessing, its size) is
copied here as plain data, never computed at import; tests/core/test_catalog.py checks it against torchvision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from core.catalog_timm import TIMM_FAMILY, TIMM_NAME, TIMM_PREFIX, timm_arch, timm_entries
from core.names import (
    TRAIN_ACC,
    TRAIN_EPOCH_LOSS,
    TRAIN_LOSS,
    VAL_ACC,
    VAL_ACC_EMA,
    VAL_ACC_TOP5,
    VAL_BALANCED_ACC,
    VAL_F1_MACRO,
    VAL_LOSS,
    VAL_LOSS_EMA,
    is_loss,
)

Better = Literal["min", "max"]


# --- models -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preprocessing:
    """How the weights' authors fed images to the network: torchvision's `weights.transforms()`, copied."""

    input_size: int  # the centre crop's side
    resize_size: int  # the side the image is resized to before the crop
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: Literal["bilinear", "bicubic", "nearest"]


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Weights:
    """Pretrained weights: the library's name for them and the file its hub cache keeps them in (offline, the
    user places that file in $TORCH_HOME/hub/checkpoints; timm's: the Hugging Face cache, core/timm_models.py)."""

    name: str  # torchvision: the member of the model's weights enum, e.g. IMAGENET1K_V1; timm: <arch>.<tag>
    file: str
    preprocessing: Preprocessing


@dataclass(frozen=True)
class Stage:
    """A backbone stage for transfer learning (freezing, last_n, unfreezing, per-stage learning rates) and the
    per-layer diagnostics: its name and the module paths (in the library's network) it is made of."""

    name: str
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Footprint:
    """A torchvision or timm model's size for core/model_size.py (torchdeck's own models are computed from the
    spec): parameters without the classification head, the head's input features, and the activation bytes
    autograd keeps per input pixel (float32, three channels; measured at 224 px for torchvision's, 112 px for
    timm's: core/catalog_timm.py)."""

    backbone_parameters: int
    head_features: int
    activation_bytes_per_pixel: int


@dataclass(frozen=True)
class ModelEntry:
    """One model: how to build it, its pretrained weights if any, and its stages and head by module path."""

    family: str  # picks the builder (core/models.py BUILDERS)
    library: Literal["torchdeck", "torchvision", "timm"]
    builder: str  # torchvision: get_model's name; torchdeck: the module's class in core/models.py; timm: its name
    stages: tuple[Stage, ...]  # bottom to top, the head excluded
    head: str  # module path of the classification head, replaced by one sized to the task
    min_size: int = 32  # smaller inputs are upsampled to this side
    input_channels: int | None = 3  # None: the data's own; else grayscale inputs are repeated to this many
    weights: Weights | None = None
    footprint: Footprint | None = None
    widths: tuple[int, ...] = ()  # simple_cnn: the two convolutions' output channels
    label: str = ""  # the family in words, as the form groups the models (timm's: ConvNeXt-V2, ViT, …)

    @property
    def takes_hidden(self) -> bool:
        """model.hidden sets its hidden fully connected layer (torchdeck's own models)."""
        return self.library == "torchdeck"


def _stages(*paths: str) -> tuple[Stage, ...]:
    """Stages of one module each, named after it."""
    return tuple(Stage(p, (p,)) for p in paths)


def _numbered(prefix: str, count: int) -> tuple[Stage, ...]:
    """`prefix.0` … `prefix.<count-1>`: the blocks of a torchvision `features` Sequential."""
    return _stages(*(f"{prefix}.{i}" for i in range(count)))


def _weights(name: str, file: str, resize: int, interpolation: Literal["bilinear", "bicubic"] = "bilinear") -> Weights:
    # Every ImageNet classifier listed here crops 224 px and normalises with ImageNet's statistics; they differ
    # in the resize before the crop and its interpolation.
    return Weights(name, file, Preprocessing(224, resize, IMAGENET_MEAN, IMAGENET_STD, interpolation))


def _own(
    family: str, builder: str, stages: tuple[Stage, ...], head: str, min_size: int, widths: tuple[int, ...] = ()
) -> ModelEntry:
    """One of torchdeck's own models (core/models.py): no pretrained weights, any number of input channels."""
    return ModelEntry(family, "torchdeck", builder, stages, head, min_size=min_size, input_channels=None, widths=widths)


def _tv(
    name: str,
    family: str,
    stages: tuple[Stage, ...],
    head: str,
    weights: tuple[Any, ...],
    footprint: tuple[int, int, int],
) -> ModelEntry:
    """A torchvision ImageNet classifier, built by get_model(`name`): its backbone stages and head; its pretrained
    weights as (member of the weights enum, hub file, resize before the crop[, interpolation]); its Footprint
    (backbone parameters, head features, activation bytes per pixel)."""
    return ModelEntry(
        family, "torchvision", name, stages, head, weights=_weights(*weights), footprint=Footprint(*footprint)
    )


# A resnet's stem is not one module: conv1 and bn1 hold its weights (relu and maxpool none).
_RESNET = (Stage("stem", ("conv1", "bn1")), *_stages("layer1", "layer2", "layer3", "layer4"))
_REGNET = _stages("stem", *(f"trunk_output.block{i}" for i in range(1, 5)))
_SMALL_CNN = _stages("conv1", "conv2", "fc1")


MODELS: dict[str, ModelEntry] = {
    "mlp": _own("mlp", "MLP", _stages("fc1", "fc2"), "head", min_size=1),
    "simple_cnn": _own("simple_cnn", "SimpleCNN", _SMALL_CNN, "fc2", min_size=4, widths=(16, 32)),
    "simple_cnn_wide": _own("simple_cnn", "SimpleCNN", _SMALL_CNN, "fc2", min_size=4, widths=(32, 64)),
    "resnet18": _tv(
        "resnet18", "resnet", _RESNET, "fc", ("IMAGENET1K_V1", "resnet18-f37072fd.pth", 256), (11_176_512, 512, 443)
    ),
    "resnet34": _tv(
        "resnet34", "resnet", _RESNET, "fc", ("IMAGENET1K_V1", "resnet34-b627a593.pth", 256), (21_284_672, 512, 644)
    ),
    "resnet50": _tv(
        "resnet50", "resnet", _RESNET, "fc", ("IMAGENET1K_V2", "resnet50-11ad3fa6.pth", 232), (23_508_032, 2048, 1717)
    ),
    "mobilenet_v3_small": _tv(
        "mobilenet_v3_small",
        "mobilenet",
        _numbered("features", 13),
        "classifier.3",
        ("IMAGENET1K_V1", "mobilenet_v3_small-047dcff4.pth", 256),
        (1_517_856, 1024, 324),
    ),
    "mobilenet_v3_large": _tv(
        "mobilenet_v3_large",
        "mobilenet",
        _numbered("features", 17),
        "classifier.3",
        ("IMAGENET1K_V2", "mobilenet_v3_large-5c1a4163.pth", 232),
        (4_202_032, 1280, 882),
    ),
    "efficientnet_b0": _tv(
        "efficientnet_b0",
        "efficientnet",
        _numbered("features", 9),
        "classifier.1",
        ("IMAGENET1K_V1", "efficientnet_b0_rwightman-7f5810bc.pth", 256, "bicubic"),
        (4_007_548, 1280, 1761),
    ),
    "convnext_tiny": _tv(
        "convnext_tiny",
        "convnext",
        _numbered("features", 8),
        "classifier.2",
        ("IMAGENET1K_V1", "convnext_tiny-983f1562.pth", 236),
        (27_820_128, 768, 2176),
    ),
    "regnet_y_400mf": _tv(
        "regnet_y_400mf",
        "regnet",
        _REGNET,
        "fc",
        ("IMAGENET1K_V2", "regnet_y_400mf-e6988f5f.pth", 232),
        (3_903_144, 440, 672),
    ),
}
MODELS.update(timm_entries())  # the timm models the form offers (core/catalog_timm.py), after torchvision's
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
PRETRAINED_MODELS: frozenset[str] = frozenset(n for n, m in MODELS.items() if m.weights is not None)
HIDDEN_MODELS: frozenset[str] = frozenset(n for n, m in MODELS.items() if m.takes_hidden)


# --- datasets -----------------------------------------------------------------------------------------------
DatasetKind = Literal["builtin", "generated", "torchvision", "folder"]


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset: its kind picks the loader (core/data.py LOADERS); its shape sizes the model before it loads."""

    kind: DatasetKind  # builtin: ships with a package; generated: made from the spec; torchvision; folder: uploaded
    splits: tuple[str, ...]  # the source's own; torchdeck reads train (or all) and holds validation out of it
    channels: int | None  # None: the spec says (data.channels)
    size: int | None  # the images' side; a folder's is the default resize (data.image_size); None: data.size
    classes: int | None  # None: the spec says (data.num_classes) or the folder's sub-folders do
    samples: int | None = None  # in all splits together; None: the spec or the folder says
    source: str = ""  # torchvision: its datasets class; builtin: the function that loads it
    folder: str = ""  # torchvision: the folder under data.path holding its files
    files: str = ""  # torchvision: the files in that folder (for the offline message)


def _torchvision_data(
    channels: int, size: int, classes: int, samples: int, source: str, folder: str, files: str
) -> DatasetEntry:
    """A torchvision dataset: its train and test splits, from `folder` under data.path."""
    return DatasetEntry("torchvision", ("train", "test"), channels, size, classes, samples, source, folder, files)


_MNIST_FILES = "train-images-idx3-ubyte, train-labels-idx1-ubyte, …, optionally .gz"
_CIFAR_FILES = "data_batch_1 … data_batch_5, test_batch, batches.meta"

DATASETS: dict[str, DatasetEntry] = {
    "digits": DatasetEntry("builtin", ("all",), 1, 8, 10, 1797, source="sklearn.datasets.load_digits"),
    "synthetic": DatasetEntry("generated", ("all",), None, None, None),
    "imagefolder": DatasetEntry("folder", ("all",), 3, 64, None),
    "mnist": _torchvision_data(1, 28, 10, 70_000, "MNIST", "MNIST/raw", _MNIST_FILES),
    "fashion_mnist": _torchvision_data(1, 28, 10, 70_000, "FashionMNIST", "FashionMNIST/raw", _MNIST_FILES),
    "cifar10": _torchvision_data(3, 32, 10, 60_000, "CIFAR10", "cifar-10-batches-py", _CIFAR_FILES),
}
DATASET_NAMES: tuple[str, ...] = tuple(DATASETS)


def datasets_of(*kinds: DatasetKind) -> tuple[str, ...]:
    """The datasets of these kinds, in catalog order."""
    return tuple(n for n, d in DATASETS.items() if d.kind in kinds)


def is_folder(name: str | None) -> bool:
    """Whether dataset `name` is read from a folder of class sub-folders given by data.path (what an upload is
    trained as), rather than from its source's own files; False for a name the catalog does not know."""
    entry = DATASETS.get(name or "")
    return entry is not None and entry.kind == "folder"


FOLDER_DATASET = datasets_of("folder")[0]  # the dataset an uploaded folder is trained as (data.name)


# --- per-epoch metrics --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricEntry:
    """One per-epoch metric, keyed by its name in METRICS: which way is better, where it is drawn, what it may
    drive, and where its per-epoch value is stored."""

    better: Better
    chart: str  # the title of the Run page chart it is drawn on
    monitor: bool = True  # may be early stopping's monitor (train.early_stopping.monitor)
    objective: bool = True  # may be a sweep's objective (objective.metric)
    stored: str | None = None  # the key its per-epoch value is stored under, when not its own


METRICS: dict[str, MetricEntry] = {
    VAL_LOSS: MetricEntry("min", "Loss"),
    VAL_ACC: MetricEntry("max", "Accuracy"),
    # train/loss is also logged every few steps; its per-epoch value (the epoch's mean) is train/epoch_loss.
    TRAIN_LOSS: MetricEntry("min", "Loss", stored=TRAIN_EPOCH_LOSS),
    TRAIN_ACC: MetricEntry("max", "Accuracy"),
    VAL_ACC_TOP5: MetricEntry("max", "Accuracy", monitor=False, objective=False),  # only with more than 5 classes
    VAL_F1_MACRO: MetricEntry("max", "Accuracy"),
    # the mean of the per-class recalls (scikit-learn's balanced_accuracy_score): for unbalanced validation data
    VAL_BALANCED_ACC: MetricEntry("max", "Accuracy"),
    # the EMA of the weights (train.ema), drawn beside them; the monitor already counts the better of the two
    VAL_LOSS_EMA: MetricEntry("min", "Loss", monitor=False, objective=False),
    VAL_ACC_EMA: MetricEntry("max", "Accuracy", monitor=False, objective=False),
}
MONITORS: tuple[str, ...] = tuple(k for k, m in METRICS.items() if m.monitor)
OBJECTIVES: tuple[str, ...] = tuple(k for k, m in METRICS.items() if m.objective)
# METRICS lists val first (the order the monitor and objective menus show); a chart draws the training curves
# first, as the Run page always has (Loss: train/loss, train/epoch_loss, val/loss), so their colours stay put.
_CHART_ORDER = ("train/", "val/")


def stored_key(key: str) -> str:
    """The key a metric's per-epoch value is stored under (train/loss → train/epoch_loss); others: itself."""
    entry = METRICS.get(key)
    return (entry.stored or key) if entry else key


def better(key: str) -> Better:
    """Whether lower or higher is better: the catalog's word, else min for a loss and max for the rest."""
    entry = METRICS.get(key)
    if entry is not None:
        return entry.better
    return "min" if is_loss(key) else "max"


def chart_keys() -> dict[str, tuple[str, ...]]:
    """{chart title: the metric keys it draws}, a metric with a stored per-epoch key drawn under both."""
    charts: dict[str, list[str]] = {}
    ranked = sorted(
        METRICS.items(),
        key=lambda kv: next((i for i, p in enumerate(_CHART_ORDER) if kv[0].startswith(p)), len(_CHART_ORDER)),
    )
    for key, m in ranked:
        charts.setdefault(m.chart, []).extend(k for k in (key, m.stored) if k)
    return {title: tuple(dict.fromkeys(keys)) for title, keys in charts.items()}


# --- lookups ------------------------------------------------------------------------------------------------
def unknown(kind: str, name: str, known: tuple[str, ...]) -> str:
    """The message for a name no registry holds: it lists the known ones."""
    return f"unknown {kind} {name!r}; known {kind}s: {', '.join(known)}"


def model(name: str) -> ModelEntry:
    """The catalog entry of model `name`; ValueError listing the known ones for any other. A timm model the
    catalog does not list (`timm/<name>`) gets an entry whose stages, head, weights and size timm gives when
    core/models.py builds it (core/timm_models.py checks the name against timm's list there)."""
    if name not in MODELS:
        check_model_name(name)
        return ModelEntry(TIMM_FAMILY, "timm", timm_arch(name), (), "", footprint=None)
    return MODELS[name]


def check_model_name(name: str) -> str:
    """A model name the schema accepts: the catalog's, or `timm/<name>` spelt as timm spells its names (whether
    timm has it is checked where timm is installed: the worker's pre-flight and the run); else a ValueError."""
    if name in MODELS:
        return name
    if name.startswith(TIMM_PREFIX):
        if TIMM_NAME.fullmatch(timm_arch(name)):
            return name
        raise ValueError(
            f"model {name!r}: a timm model is timm/<name> with <name> as timm.list_models() spells it "
            "(lower-case letters, digits and underscores, optionally .<pretrained tag>), e.g. timm/convnextv2_atto"
        )
    raise ValueError(unknown("model", name, MODEL_NAMES) + f", or any timm model as {TIMM_PREFIX}<name>")


def dataset(name: str) -> DatasetEntry:
    """The catalog entry of dataset `name`; ValueError listing the known ones for any other."""
    if name not in DATASETS:
        raise ValueError(unknown("dataset", name, DATASET_NAMES))
    return DATASETS[name]


def stages_in_words() -> str:
    """Each family's backbone stages, for help texts: `resnet stem, layer1 … layer4; …`."""
    by_family: dict[str, list[str]] = {}
    for m in MODELS.values():
        names = [s.name for s in m.stages]
        shown = ", ".join(names) if len(names) <= 3 else f"{names[0]}, {names[1]} … {names[-1]}"
        if shown not in by_family.setdefault(m.family, []):
            by_family[m.family].append(shown)
    return "; ".join(f"{family} {' / '.join(shown)}" for family, shown in by_family.items())
