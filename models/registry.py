"""Zoo names -> model folders, and loading any model by name or path."""

from __future__ import annotations

from pathlib import Path

from core.checkpoint import CONFIG, ModelLoadError, read_meta
from core.runner import LoadedModel, load_folder

ZOO_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = "reverse"
# Zoo models in the order the dashboard lists them.
ORDER = ("reverse", "sort", "dates", "numbers", "brackets")


def zoo_names() -> list[str]:
    """Names of the models committed under models/<name>/ (each with a config.json)."""
    found = {p.parent.name for p in ZOO_DIR.glob(f"*/{CONFIG}")}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def zoo_summary(name: str) -> str:
    """One-line summary from the model's meta.json (or its card)."""
    meta = read_meta(ZOO_DIR / name)
    if meta.get("summary"):
        return str(meta["summary"])
    card = ZOO_DIR / name / "card.md"
    if card.exists():
        for line in card.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith("#"):
                return line.strip()
    return ""


def resolve(name_or_path: str) -> tuple[str, Path]:
    """A zoo name or a folder path -> (display name, folder)."""
    if name_or_path in zoo_names():
        return name_or_path, ZOO_DIR / name_or_path
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.name, path
    known = ", ".join(zoo_names()) or "(none trained yet)"
    raise ModelLoadError(f"unknown model {name_or_path!r}: not a zoo name ({known}) nor a model folder")


def load(name_or_path: str, device: str = "cpu") -> LoadedModel:
    name, folder = resolve(name_or_path)
    return load_folder(folder, name=name, device=device)
