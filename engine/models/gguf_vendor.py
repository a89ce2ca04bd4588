"""llama.cpp's own HF -> GGUF converter, which ships only inside the llama-cpp-python *sdist*.

`ensure_converter` fetches that sdist once with pip (pip's cache makes later fetches instant), extracts
just the converter files into the user's cache dir, keyed by the installed llama-cpp-python version (the
converter must match the compiled llama.cpp). Nothing of it is committed to this repository.
`convert_hf_to_gguf` runs it in a subprocess: it imports its own `gguf` package, which must not shadow
the one transformers uses in this process. `engine.models.gguf_convert` re-exports all of this.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import platformdirs

from engine.errors import SapoError
from engine.paths import APP_NAME

CONVERTER_TIMEOUT_S = 1800  # a 0.5B model converts in about a minute; this only catches a hang
SDIST_ENV = "SAPO_LLAMACPP_SDIST"  # a local llama-cpp-python sdist (.tar.gz) to take the converter from
_VENDOR = "vendor/llama.cpp/"
_KEEP_FILES = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py")
_KEEP_DIRS = ("conversion/", "gguf-py/gguf/")
_MAX_MEMBER_BYTES = 16 * 1024 * 1024  # converter sources are < 1 MB each; anything bigger is not ours
OUTTYPES = ("f32", "f16", "bf16", "q8_0")

# Run as `python -c LAUNCHER <converter dir> <pre-tokenizer fallback> <converter args...>`.
# A byte-level BPE trained by this project has no entry in the converter's table of known
# pre-tokenizers; llama.cpp's "gpt-2" pre-tokenizer is the byte-level one, so it is declared as such.
LAUNCHER = """
import sys
root, fallback = sys.argv[1], sys.argv[2]
sys.path[0:0] = [root, root + '/gguf-py']
import convert_hf_to_gguf as vendor
from conversion import base

if fallback:
    original = base.TextModel.get_vocab_base_pre
    def get_vocab_base_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return fallback
    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = ['convert_hf_to_gguf.py'] + sys.argv[3:]
vendor.main()
"""


class GgufError(SapoError, RuntimeError):
    """Conversion or plan failure, with what to try in the message."""


def llamacpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise GgufError("llama-cpp-python is not installed: `pip install llama-cpp-python==0.3.36` "
                        "(it compiles llama.cpp, a few minutes)") from exc


def default_cache_dir() -> Path:
    return Path(os.environ.get("SAPO_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def _member_target(name: str) -> str | None:
    """The path inside the converter dir for an sdist member, or None to skip it."""
    parts = name.split("/", 1)
    if len(parts) != 2 or not parts[1].startswith(_VENDOR):
        return None
    rel = parts[1][len(_VENDOR):]
    if ".." in rel.split("/") or rel.startswith("/") or "\\" in rel:
        return None
    if rel in _KEEP_FILES or any(rel.startswith(d) for d in _KEEP_DIRS):
        return rel
    return None


def extract_converter(sdist: Path, dest: Path) -> Path:
    """Copy the converter's files out of an sdist into `dest` (regular files only, no traversal)."""
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
    try:
        count = 0
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                target = _member_target(member.name)
                if target is None or not member.isfile() or member.size > _MAX_MEMBER_BYTES:
                    continue
                src = tar.extractfile(member)
                if src is None:
                    continue
                path = tmp / target
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(src.read())
                count += 1
        if not (tmp / "convert_hf_to_gguf.py").is_file() or not (tmp / "conversion" / "__init__.py").is_file():
            raise GgufError(f"{sdist} holds no llama.cpp converter (vendor/llama.cpp/convert_hf_to_gguf.py)")
        (tmp / ".complete").write_text(json.dumps({"sdist": sdist.name, "files": count}))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest


def ensure_converter(cache_dir: Path | None = None, *, sdist: Path | None = None) -> Path:
    """The converter directory for the installed llama-cpp-python, fetching it on first use."""
    version = llamacpp_version()
    root = (cache_dir or default_cache_dir()) / "llama.cpp-convert"
    dest = root / version
    if (dest / ".complete").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    local = sdist or (Path(os.environ[SDIST_ENV]) if os.environ.get(SDIST_ENV) else None)
    if local is not None:
        return extract_converter(local, dest)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
               f"llama-cpp-python=={version}", "-d", tmp]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=CONVERTER_TIMEOUT_S)
        found = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not found:
            raise GgufError(f"could not fetch the llama-cpp-python {version} sdist for its GGUF converter "
                            f"({proc.stderr.strip()[-400:]}); download it yourself and set {SDIST_ENV}")
        return extract_converter(found[0], dest)


def is_byte_level_bpe(model_dir: Path) -> bool:
    """Whether tokenizer.json is a byte-level BPE (then GGML's GPT-2 pre-tokenizer is the right one)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return False
    data = json.loads(path.read_text(encoding="utf-8"))

    def has_byte_level(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has_byte_level(v) for v in node.values())
        if isinstance(node, list):
            return any(has_byte_level(v) for v in node)
        return False

    return data.get("model", {}).get("type") == "BPE" and has_byte_level(data.get("pre_tokenizer"))


def convert_hf_to_gguf(model_dir: Path, out: Path, *, outtype: str = "f32", converter: Path | None = None,
                       timeout_s: float = CONVERTER_TIMEOUT_S) -> Path:
    """A transformers model directory -> one GGUF file at `out` (written atomically)."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    converter = converter or ensure_converter()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    fallback = "gpt-2" if is_byte_level_bpe(model_dir) else ""
    cmd = [sys.executable, "-c", LAUNCHER, str(converter), fallback, str(model_dir), "--outfile", str(tmp),
           "--outtype", outtype]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"} | {"HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise GgufError(f"GGUF conversion of {model_dir} failed: {proc.stderr.strip()[-800:]}")
    tmp.replace(out)
    return out
