"""A console sink with a live progress bar for `torchdeck train` (rich; no torch)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from core.names import TEST_EVENT

_LEVEL_STYLE = {"info": "cyan", "warning": "yellow", "error": "bold red"}


class ConsoleSink:
    """Shows a progress bar over optimizer steps, one line per epoch, and every warning with its advice."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.bar = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TextColumn("{task.fields[loss]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.bar.add_task("train", total=None, loss="")
        self.bar.start()

    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        if "train/loss" in values:
            self.bar.update(self.task, loss=f"loss {values['train/loss']:.4f}")
        if "val/acc" in values:
            self.bar.console.print(
                f"epoch {epoch:3d}  train/loss {values.get('train/epoch_loss', float('nan')):.4f}  "
                f"train/acc {values.get('train/acc', float('nan')):.4f}  val/loss {values['val/loss']:.4f}  "
                f"val/acc {values['val/acc']:.4f}  [dim]{values.get('epoch_time_s', 0):.1f}s[/dim]"
            )

    def event(self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None) -> None:
        if kind in ("lifecycle", "preflight", "export", TEST_EVENT) or level != "info":
            style = _LEVEL_STYLE.get(level, "")
            self.bar.console.print(f"[{style}]{kind}[/{style}] {message}", highlight=False)
            if data and data.get("advice"):
                self.bar.console.print(f"  [yellow]advice:[/yellow] {data['advice']}", highlight=False)

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        self.bar.stop()
