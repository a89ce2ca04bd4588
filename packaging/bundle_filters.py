"""What the bundle leaves out: modules the app never imports and files it never opens.

Used by packaging/sapo.spec; pure functions so tests can check them without a build. Every entry
says why it is safe to drop: the bundled `sapo doctor` and a solo node run prove the rest.
"""

from __future__ import annotations

import os
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

# transformers' model families the catalog can load (seed = Llama-style; Qwen2.5 = qwen2; Qwen3),
# plus what transformers itself imports at run time and peft imports (bloom). The other ~550 families
# are ~100 MB of source.
TRANSFORMERS_MODELS_KEPT = frozenset({"auto", "llama", "qwen2", "qwen3", "encoder_decoder", "timm_wrapper",
                                      "bloom"})

# Never imported by engine/ or app/: developer tools, notebooks, other GUI toolkits, TensorBoard.
# (PySide6.QtTest stays: pyqtgraph imports it.) tests/packaging checks this list against real imports.
ALWAYS_EXCLUDED_MODULES = (
    "tkinter", "_tkinter", "IPython", "jupyter_client", "ipykernel", "notebook",
    "pytest", "_pytest", "pytestqt", "pytest_timeout", "PyInstaller", "mypy", "ruff",
    "lab",  # the benches and experiments: a source checkout's, never a contributor's
    "torch.utils.tensorboard", "tensorboard",
    # Optional imports of transformers / huggingface_hub / reasoning_gym that the nine specialties and
    # the engine never reach (checked: absent from sys.modules after a node run and the app's start).
    "pandas", "pyarrow", "datasets", "xxhash",
    "matplotlib.backends.backend_tkagg", "matplotlib.backends.backend_webagg",
    "PySide6.QtWebEngineCore", "PySide6.QtWebEngineWidgets", "PySide6.QtWebEngineQuick",
    "PySide6.QtQuick", "PySide6.QtQml", "PySide6.QtQuickWidgets", "PySide6.QtPdf", "PySide6.QtPdfWidgets",
    "PySide6.QtMultimedia", "PySide6.QtDesigner", "PySide6.QtHelp", "PySide6.QtNetwork", "PySide6.QtSql",
    "PySide6.QtXml", "PySide6.QtConcurrent", "PySide6.QtDBus", "PySide6.QtUiTools",
    "pyqtgraph.examples", "pyqtgraph.jupyter",
)
# Only a CUDA torch runs Triton kernels (torch.compile on GPU); the engine never compiles on CPU.
CPU_ONLY_EXCLUDED_MODULES = ("triton",)

# Destination paths (relative to the bundle's _internal/) that are tests, headers, build tools or
# GUI stacks the app does not use. Matched with fnmatch against '/'-separated names.
COMMON_PATTERNS = (
    "torch/include/*", "torch/test/*", "torch/share/*", "torch/lib/*.lib",
    "torch/bin/test_*", "torch/bin/*Test", "torch/bin/protoc*", "torch/bin/*.pt*", "torch/bin/upgrader_models*",
    "torch/lib/libjitbackend_test*", "torch/lib/libtorchbind_test*", "torch/lib/libbackend_with_compiler*",
    "torch/lib/libaoti_custom_ops*", "torch/lib/*.pdb",
    "*.pyi", "*.h", "*.hpp", "*.cuh", "*.cmake",
    "PySide6/include/*", "PySide6/typesystems/*", "PySide6/glue/*", "PySide6/scripts/*",
    "PySide6/Qt/translations/*",  # the app loads no QTranslator: its UI and Qt's dialogs are English
    "PySide6/Qt/lib/libQt6WebEngine*", "PySide6/Qt/lib/libQt6Quick*",
    "PySide6/Qt/lib/libQt6Qml*", "PySide6/Qt/lib/libQt6Pdf*", "PySide6/Qt/lib/libQt63D*",
    "PySide6/Qt/lib/libQt6Designer*", "PySide6/Qt/resources/qtwebengine*",
    "PySide6/Qt/plugins/sqldrivers/*", "PySide6/Qt/plugins/qmltooling/*", "PySide6/Qt/plugins/multimedia/*",
    "bfi/examples/*", "bfi/test/*", "pyqtgraph/examples/*",
)
# A CPU build of torch brings no CUDA, yet bitsandbytes ships a library per CUDA / ROCm / XPU version.
CPU_ONLY_PATTERNS = (
    "bitsandbytes/libbitsandbytes_cuda*", "bitsandbytes/libbitsandbytes_rocm*",
    "bitsandbytes/libbitsandbytes_xpu*",
    "nvidia/*", "triton/*", "*libcudart*", "*libcublas*", "*libcudnn*", "*libnccl*", "*libcusparse*",
    "*libcufft*", "*libcurand*", "*libcusolver*", "*libnvrtc*", "*libnvJitLink*",
)
DATA_PATTERNS = COMMON_PATTERNS


def torch_has_cuda() -> bool:
    """Whether the torch being bundled was built with CUDA (then its CUDA libraries must stay)."""
    import torch

    return torch.version.cuda is not None


def transformers_model_excludes(models_dir: Path | None = None) -> list[str]:
    """`transformers.models.X` for every family on disk that is not kept."""
    if models_dir is None:
        import importlib.util

        spec = importlib.util.find_spec("transformers")
        if spec is None or spec.origin is None:
            return []
        models_dir = Path(spec.origin).parent / "models"
    return sorted(f"transformers.models.{p.name}" for p in models_dir.iterdir()
                  if p.is_dir() and not p.name.startswith("_") and p.name not in TRANSFORMERS_MODELS_KEPT)


def module_excludes(cuda: bool, models_dir: Path | None = None) -> list[str]:
    extra = () if cuda else CPU_ONLY_EXCLUDED_MODULES
    return [*ALWAYS_EXCLUDED_MODULES, *extra, *transformers_model_excludes(models_dir)]


def binary_patterns(cuda: bool) -> tuple[str, ...]:
    return COMMON_PATTERNS + (() if cuda else CPU_ONLY_PATTERNS)


def matches(dest: str, patterns: tuple[str, ...]) -> bool:
    name = dest.replace(os.sep, "/").replace("\\", "/")
    return any(fnmatch(name, pattern) for pattern in patterns)


def drop(toc: Any, patterns: tuple[str, ...]) -> tuple[list[Any], list[list[Any]]]:
    """Split a PyInstaller TOC ((dest, source, typecode) entries) into kept entries and
    [dest, bytes] for each dropped one."""
    kept, dropped = [], []
    for entry in toc:
        dest, source = entry[0], entry[1]
        if matches(dest, patterns):
            size = os.path.getsize(source) if source and os.path.isfile(source) else 0
            dropped.append([dest, size])
        else:
            kept.append(entry)
    return kept, dropped


# llama-cpp-python loads its libraries with ctypes from llama_cpp/lib at run time, which PyInstaller's
# analysis cannot see. Each Linux library is installed three times (name, soname, full version): the
# unversioned name is what ctypes opens and the soname is what the others link against.
LLAMA_CPP_LIB_GLOBS = ("lib*.so", "lib*.so.[0-9]", "lib*.so.[0-9][0-9]", "*.dylib", "*.dll")


def llama_cpp_binaries(lib_dir: Path | None = None) -> list[tuple[str, str]]:
    """(source, bundle folder) for llama.cpp's shared libraries; [] when llama-cpp-python is absent
    (the GGUF fast path is optional: the engine then generates with transformers)."""
    if lib_dir is None:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.origin is None:
            return []
        lib_dir = Path(spec.origin).parent / "lib"
    if not lib_dir.is_dir():
        return []
    found = sorted({p for pattern in LLAMA_CPP_LIB_GLOBS for p in lib_dir.glob(pattern) if p.is_file()})
    return [(str(p), "llama_cpp/lib") for p in found]
