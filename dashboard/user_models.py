"""Models a user points the dashboard at: a path, a cached Hugging Face name, or an upload.

Pure (no streamlit): the sidebar (dashboard/state.py) calls these and shows their messages.

- Paths are read only inside the allowed folders: the repository's ``models/``, the user's home,
  the Hugging Face cache and every folder in ``ATTNSCOPE_MODEL_DIRS`` (os.pathsep-separated).
  The real path (symlinks and ``..`` resolved) is checked, so ``../../etc`` or a link out of
  an allowed folder is refused. A relative path is taken from the repository root.
- A Hugging Face name ("gpt2", "org/model") is looked up in the local cache only
  (``HF_HUB_OFFLINE``): nothing is ever downloaded.
- An upload (a core checkpoint as separate files or one .zip) is checked and written into a
  per-session folder; zip members with absolute paths, ``..``, links or too many bytes
  (the real bytes, not the sizes the archive claims) are refused.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from attnscope.core.errors import ModelLoadError
from attnscope.core.transformer.checkpoint import CONFIG, SRC_VOCAB
from attnscope.models.registry import WEIGHT_SUFFIXES, ZOO_DIR

MODEL_DIRS_ENV = "ATTNSCOPE_MODEL_DIRS"
ALLOW_CODE_ENV = "ATTNSCOPE_ALLOW_CODE"  # =1: the dashboard may run adapter files (.py) from allowed folders
ADAPTER_SUFFIX = ".py"
REPO = Path(__file__).resolve().parents[1]
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")

# -- uploads ------------------------------------------------------------------------------------
UPLOAD_FILES = ("config.json", "src_vocab.json", "tgt_vocab.json", "card.md", "meta.json")
UPLOAD_WEIGHTS = {".safetensors": "model.safetensors", ".pt": "model.pt", ".pth": "model.pth"}
UPLOAD_TYPES = ["json", "safetensors", "pt", "pth", "md", "zip"]  # st.file_uploader's type list
UNZIP_FACTOR = 4  # a .zip may unpack to at most this many times the upload limit
MAX_ZIP_MEMBERS = 32
IGNORED_MEMBERS = ("__MACOSX", ".DS_Store")
CHUNK = 1 << 20


class PathRefused(ModelLoadError):
    """A path outside the folders the dashboard may read models from."""


def mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


# -- allowed folders ------------------------------------------------------------------------------


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "huggingface" / "hub"


def allowed_roots(extra: Iterable[str | Path] = ()) -> list[Path]:
    """Real paths of the allowed folders (the filesystem root itself never counts)."""
    env = [p for p in os.environ.get(MODEL_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    out: list[Path] = []
    for root in [ZOO_DIR, Path.home(), hf_cache_dir(), *env, *extra]:
        real = Path(os.path.realpath(Path(root).expanduser()))
        if real != Path(real.anchor) and real not in out:
            out.append(real)
    return out


def is_allowed(real: Path, roots: Sequence[Path]) -> bool:
    return any(real == r or real.is_relative_to(r) for r in roots)


def _refuse(text: str, roots: Sequence[Path]) -> PathRefused:
    where = ", ".join(str(r) for r in roots)
    return PathRefused(
        f"{text} is outside the folders attnscope may read from ({where}); "
        f"add its folder to {MODEL_DIRS_ENV} to allow it"
    )


def real_path(text: str) -> tuple[Path, Path]:
    """(the path as typed, relative ones from the repository root; its real path, links resolved)."""
    if "\x00" in text:
        raise PathRefused("the path contains a NUL character")
    raw = Path(text).expanduser()
    candidate = raw if raw.is_absolute() else REPO / raw
    return candidate, Path(os.path.realpath(candidate))


def check_allowed(text: str, real: Path, roots: Sequence[Path]) -> None:
    """PathRefused unless ``real`` lies inside one of the allowed folders."""
    if not is_allowed(real, roots):
        raise _refuse(text, roots)


# -- paths and cached names -----------------------------------------------------------------------


def cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder of a model in the local Hugging Face cache (None: not cached)."""
    if not HUB_ID.fullmatch(repo_id):
        return None
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
        if snap.is_dir():
            return snap
    snaps = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if repo.is_dir() else []
    return snaps[-1] if snaps else None


def code_allowed() -> bool:
    """Whoever started the server allowed adapter files (they are Python code: loading runs them)."""
    return os.environ.get(ALLOW_CODE_ENV, "") == "1"


def check_code_allowed(path: str | Path) -> None:
    """ModelLoadError unless ATTNSCOPE_ALLOW_CODE=1 (an adapter file runs its code when loaded)."""
    if not code_allowed():
        raise PathRefused(
            f"{Path(path).name} is an adapter file, and loading it runs its Python code: the dashboard does "
            f"that only when whoever starts the server sets {ALLOW_CODE_ENV}=1 (e.g. "
            f"`{ALLOW_CODE_ENV}=1 make run`); the command line runs it directly: "
            f"python -m attnscope trace --model {path} ..."
        )


def check_model_path(real: Path) -> None:
    """A folder with config.json, a weights file beside one, or an adapter file (.py, when code is
    allowed); else a one-sentence ModelLoadError."""
    if real.suffix == ADAPTER_SUFFIX and real.is_file():
        check_code_allowed(real)
        return
    if real.is_dir():
        if not (real / CONFIG).is_file():
            raise ModelLoadError(
                f"{real} is not a model folder: it has no {CONFIG} (a core checkpoint or a Hugging Face folder has one)"
            )
        return
    if real.suffix not in WEIGHT_SUFFIXES:
        raise ModelLoadError(
            f"{real} is not a model folder nor a weights file ({', '.join(WEIGHT_SUFFIXES)} beside a {CONFIG})"
        )
    if not (real.parent / CONFIG).is_file():
        raise ModelLoadError(f"{real.name} has no {CONFIG} beside it to say how to build the model")


def resolve_user_model(text: str, extra_roots: Iterable[str | Path] = ()) -> str:
    """What the user typed -> the real path registry.load takes (ModelLoadError says why not)."""
    text = (text or "").strip().strip("'\"")
    if not text:
        raise ModelLoadError(
            "type the path of a model folder or weights file, or a model name from the Hugging Face cache"
        )
    roots = allowed_roots(extra_roots)
    candidate, real = real_path(text)
    if not os.path.lexists(candidate) and HUB_ID.fullmatch(text):
        snap = cached_snapshot(text)
        if snap is None:
            raise ModelLoadError(
                f"{text} is neither a path nor a model in the Hugging Face cache ({hf_cache_dir()}); "
                "attnscope never downloads (HF_HUB_OFFLINE), so download it beforehand or give its folder"
            )
        real = Path(os.path.realpath(snap))
    check_allowed(text, real, roots)
    if not real.exists():
        raise ModelLoadError(f"{text} does not exist")
    check_model_path(real)
    return str(real)


def display_name(path: str) -> str:
    """A short name for a model path: 'org/name' for a Hugging Face cache snapshot, else the folder."""
    p = Path(path)
    parts = p.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--") :].replace("--", "/")
    if p.suffix == ADAPTER_SUFFIX:
        return p.name
    if p.suffix in WEIGHT_SUFFIXES:  # a weights file: say which folder it is in
        return f"{p.parent.name} ({p.name})"
    return p.name


# -- uploads --------------------------------------------------------------------------------------


def upload_name(name: str) -> str:
    """An uploaded file's name -> the name it gets in the model folder (ModelLoadError if unknown)."""
    base = PurePosixPath(name.replace("\\", "/")).name
    if base in UPLOAD_FILES:
        return base
    if base.lower().endswith(ADAPTER_SUFFIX):
        raise ModelLoadError(
            f"{base} is Python code: an uploaded file is never run. To use an adapter file, put it in an "
            f"allowed folder on the server and give its path (the server must set {ALLOW_CODE_ENV}=1)"
        )
    suffix = PurePosixPath(base).suffix.lower()
    if suffix in UPLOAD_WEIGHTS:
        return UPLOAD_WEIGHTS[suffix]
    raise ModelLoadError(
        f"unexpected file {base!r} in the upload: a core checkpoint is {CONFIG}, model.safetensors "
        f"(or a .pt/.pth state dict) and {SRC_VOCAB} (+ tgt_vocab.json, card.md, meta.json)"
    )


def _bad_member(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return (
        name.startswith(("/", "\\"))
        or "\\" in name
        or bool(re.match(r"^[A-Za-z]:", name))
        or ".." in parts
        or not parts
    )


def read_zip(data: bytes, max_total: int) -> list[tuple[str, bytes]]:
    """Members of an uploaded .zip, checked: no absolute paths, no '..', no links, at most one
    folder level, at most ``max_total`` bytes once unpacked (counted while reading)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (
        zipfile.BadZipFile,
        NotImplementedError,
        ValueError,
        OSError,
        EOFError,
    ) as exc:  # a zip version or
        # compression zipfile does not read
        raise ModelLoadError("the .zip file is damaged or not a zip archive") from exc
    with zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        if len(infos) > MAX_ZIP_MEMBERS:
            raise ModelLoadError(
                f"the .zip holds {len(infos)} files; a checkpoint needs at most {MAX_ZIP_MEMBERS}"
            )
        for info in infos:
            if _bad_member(info.filename):
                raise ModelLoadError(
                    f"refused the .zip: member {info.filename!r} has an absolute path or '..'"
                )
            if stat.S_ISLNK(info.external_attr >> 16):
                raise ModelLoadError(f"refused the .zip: member {info.filename!r} is a symbolic link")
        infos = [
            i for i in infos if not any(part in IGNORED_MEMBERS for part in PurePosixPath(i.filename).parts)
        ]
        folders = {PurePosixPath(i.filename).parent for i in infos}
        if len(folders) > 1 or any(len(f.parts) > 1 for f in folders):
            raise ModelLoadError(
                "the .zip must hold the checkpoint's files at its top level or in one folder"
            )
        declared = sum(i.file_size for i in infos)
        if declared > max_total:
            raise ModelLoadError(f"the .zip unpacks to {mb(declared)}; the limit is {mb(max_total)}")
        out, total = [], 0
        for info in infos:
            chunks = []
            try:
                with zf.open(info) as member:
                    while chunk := member.read(CHUNK):
                        total += len(chunk)
                        if total > max_total:  # sizes in the archive can lie (zip bombs)
                            raise ModelLoadError(f"the .zip unpacks to more than {mb(max_total)}, the limit")
                        chunks.append(chunk)
            except (
                zipfile.BadZipFile,
                RuntimeError,
                OSError,
                EOFError,
                NotImplementedError,
                ValueError,
            ) as exc:
                raise ModelLoadError(f"cannot unpack {info.filename!r} from the .zip: {exc}") from exc
            out.append((info.filename, b"".join(chunks)))
    return out


def save_upload(files: Sequence[tuple[str, bytes]], dest: Path, limit_bytes: int) -> Path:
    """Check an uploaded core checkpoint (separate files or one .zip) and write it to ``dest``
    (a new folder). Nothing is unpickled here; registry.load reads it later (weights_only)."""
    if not files:
        raise ModelLoadError("choose the checkpoint's files (or one .zip) to upload first")
    total = sum(len(data) for _, data in files)
    if total > limit_bytes:
        raise ModelLoadError(f"the upload is {mb(total)}; the limit is {mb(limit_bytes)}")
    zips = [name for name, _ in files if name.lower().endswith(".zip")]
    if zips and len(files) > 1:
        raise ModelLoadError("upload either one .zip or the checkpoint's separate files, not both")
    members = read_zip(files[0][1], limit_bytes * UNZIP_FACTOR) if zips else list(files)
    out: dict[str, bytes] = {}
    for name, data in members:
        target = upload_name(name)
        if target in out:
            raise ModelLoadError(f"the upload holds two files for {target}")
        out[target] = data
    weights = [n for n in out if n.startswith("model.")]
    if len(weights) != 1:
        raise ModelLoadError(
            "the upload needs exactly one weights file (model.safetensors, or a .pt/.pth state dict), "
            f"got {len(weights)}"
        )
    for needed in (CONFIG, SRC_VOCAB):
        if needed not in out:
            raise ModelLoadError(f"the upload has no {needed}")
    try:
        config = json.loads(out[CONFIG].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"the uploaded {CONFIG} is not valid JSON: {exc}") from exc
    if isinstance(config, dict) and "model_type" in config:
        raise ModelLoadError(
            "this is a Hugging Face config.json: uploads take core checkpoints; give a Hugging Face "
            "folder's path in the box above instead"
        )
    dest.mkdir(parents=True, exist_ok=False)
    for name, data in out.items():
        with open(dest / name, "xb") as f:
            f.write(data)
    return dest
