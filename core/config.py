"""The run specification: one validated schema for everything a run needs, put together from its sections
(core/spec_sections.py), with the checks across sections, its identity (hash, queue) and its YAML.

This module must not import torch: the dashboard validates specs with it and must
start fast. Every default is documented where it is declared; the form in the UI
reads these descriptions as its help text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from core import bounded_yaml, model_size
from core.names import queue_for, spec_hash
from core.overrides import SpecError, apply_overrides, describe_errors  # noqa: F401 - part of this module's API
from core.spec_sections import (
    CheckpointSpec,
    DataSpec,
    ExportSpec,
    LoaderSpec,
    ModelSpec,
    OptimSpec,
    ResourcesSpec,
    ScheduleSpec,
    Section,
    TrainSpec,
)

Device = Literal["auto", "cpu", "cuda"]


class RunSpec(Section):
    """A whole training run. YAML keys mirror these sections."""

    name: str | None = Field(None, max_length=200, description="A human-readable name for the run.")
    data: DataSpec = Field(default_factory=DataSpec, description="Dataset, split, normalisation, augmentation.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model and transfer learning.")
    optim: OptimSpec = Field(default_factory=OptimSpec, description="Optimizer.")
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec, description="Learning-rate schedule.")
    train: TrainSpec = Field(default_factory=TrainSpec, description="Training loop.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpoints.")
    export: ExportSpec = Field(default_factory=ExportSpec, description="Exports.")
    loader: LoaderSpec = Field(default_factory=LoaderSpec, description="Data loading.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Processes (GPUs) of the run.")
    seed: int = Field(42, ge=0, le=2**32 - 1, description="Seed for Python, NumPy, torch, the split and the loaders.")
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms and cuDNN determinism (slower).")
    device: Device = Field("auto", description="auto: CUDA when available, else CPU.")
    compile: bool = Field(False, description="torch.compile the model; helps fixed-shape models on GPU.")
    channels_last: bool | None = Field(
        None,
        description="The channels_last memory format for the model and its input batches (faster convolutions "
        "on tensor cores); none: on CUDA for models with convolutions.",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_restore_best(cls, data: Any) -> Any:
        """Specs written before export.checkpoint was honoured said which weights to keep with
        train.early_stopping.restore_best; read `false` there as export.checkpoint: last."""
        es = ((data or {}).get("train") or {}).get("early_stopping") if isinstance(data, dict) else None
        if not isinstance(es, dict) or "restore_best" not in es:
            return data
        data = {
            **data,
            "train": {**data["train"], "early_stopping": {k: v for k, v in es.items() if k != "restore_best"}},
        }
        if es["restore_best"] is False and "checkpoint" not in (data.get("export") or {}):
            data["export"] = {**(data.get("export") or {}), "checkpoint": "last"}
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> RunSpec:
        if self.device == "cpu" and self.train.precision == "fp16":
            raise ValueError("train.precision=fp16 needs a CUDA device; on CPU use bf16 or fp32")
        if self.train.batch_size % self.resources.gpus:
            raise ValueError(
                f"train.batch_size={self.train.batch_size} must divide evenly by "
                f"resources.gpus={self.resources.gpus} (it is the global batch)"
            )
        return self

    @model_validator(mode="after")
    def _model_fits(self) -> RunSpec:
        """A model no machine can train (core/model_size.py: parameters, optimizer state, activations), refused
        before anything is allocated, naming the fields that make it so."""
        why = model_size.refusal(self)
        if why:
            raise ValueError(why)
        return self

    # --- identity ---------------------------------------------------------------
    def spec_hash(self) -> str:
        """sha256 of the canonical JSON of the spec, name excluded (core.names.spec_hash: what the database stores)."""
        return spec_hash(self.model_dump(mode="json"))

    @property
    def resource(self) -> str:
        """The worker queue a run needs (core.names.queue_for): a CPU run never waits for a GPU worker."""
        return queue_for(self.device, self.resources.gpus)

    # --- YAML --------------------------------------------------------------------
    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, overrides: list[str] | None = None) -> RunSpec:
        try:
            data = bounded_yaml.load(text, "the spec") or {}
        except (bounded_yaml.YamlRefused, yaml.YAMLError) as e:
            raise SpecError(
                [
                    (
                        "(root)",
                        str(e).splitlines()[0]
                        if isinstance(e, bounded_yaml.YamlRefused)
                        else f"not valid YAML: {' '.join(str(e).split())[:300]}",
                    )
                ]
            ) from None
        if not isinstance(data, dict):
            raise SpecError([("(root)", "a run spec must be a YAML mapping of sections")])
        return cls.from_dict(data, overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any], overrides: list[str] | None = None) -> RunSpec:
        data = apply_overrides(data, overrides or [])
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise SpecError(describe_errors(e)) from None


def load_spec(path: str | Path, overrides: list[str] | None = None) -> RunSpec:
    """Read and validate a YAML spec file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError([(str(p), "spec file not found")])
    return RunSpec.from_yaml(p.read_text(), overrides)
