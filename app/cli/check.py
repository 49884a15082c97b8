"""One check of `torchdeck doctor` (doctor.py, doctor_workers.py): its name, whether it passed, what was found,
the fix when it failed and any notes, as the lines the command prints."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not checked, because something it needs failed first
    detail: str
    fix: str = ""
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        mark = {True: "✓", False: "✗", None: "–"}[self.ok]
        out = [f"{mark} {self.name}: {self.detail}"]
        out += [f"    {n}" for n in self.notes]
        if self.fix and self.ok is False:
            out.append(f"    fix: {self.fix}")
        return out


def first_line(e: BaseException) -> str:
    """An error's first line, without the driver's class SQLAlchemy puts in front, at most 300 characters."""
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if lines else type(e).__name__
    # SQLAlchemy wraps the driver's error: "(psycopg.OperationalError) connection failed: ..."
    if line.startswith("(") and ") " in line:
        line = line.split(") ", 1)[1]
    return line[:300]
