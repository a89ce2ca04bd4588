"""What the bundle leaves out: patterns on real-looking paths, and proof that the model families the
catalog loads import nothing from transformers that the bundle drops."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests_packaging_helpers import ROOT, load

filters = load("bundle_filters")


@pytest.mark.parametrize(("dest", "cuda", "dropped"), [
    ("torch/include/ATen/Tensor.h", False, True),
    ("torch/test/atest", False, True),
    ("torch/bin/protoc", False, True),
    ("torch/lib/libjitbackend_test.so", False, True),
    ("torch/lib/libtorch_cpu.so", False, False),
    ("torch/bin/torch_shm_manager", False, False),  # `import torch` looks for it
    ("torch/bin/FileStoreTest", False, True),
    ("torch/lib/libgomp.so.1", False, False),
    ("bitsandbytes/libbitsandbytes_cuda128.so", False, True),
    ("bitsandbytes/libbitsandbytes_cuda128.so", True, False),  # a CUDA build keeps its kernels
    ("bitsandbytes/libbitsandbytes_cpu.so", False, False),
    ("nvidia/cublas/lib/libcublas.so.12", False, True),
    ("nvidia/cublas/lib/libcublas.so.12", True, False),
    ("PySide6/Qt/lib/libQt6WebEngineCore.so.6", False, True),
    ("PySide6/Qt/lib/libQt6Widgets.so.6", False, False),
    ("PySide6/Qt/lib/libQt6OpenGL.so.6", False, False),  # pyqtgraph draws through it
    ("PySide6/Qt/plugins/platforms/libqxcb.so", False, False),
    ("PySide6/QtCore.pyi", False, True),
    ("reasoning_gym/data/words3to10.txt", False, False),
    ("resources/models/seed/model.safetensors", False, False),
    ("torch\\include\\c10\\core.h", False, True),  # Windows separators
])
def test_patterns(dest: str, cuda: bool, dropped: bool) -> None:
    assert filters.matches(dest, filters.binary_patterns(cuda)) is dropped


def test_drop_reports_sizes(tmp_path: Path) -> None:
    header, lib = tmp_path / "a.h", tmp_path / "lib.so"
    header.write_bytes(b"x" * 123)
    lib.write_bytes(b"y" * 7)
    toc = [("torch/include/a.h", str(header), "DATA"), ("torch/lib/libc10.so", str(lib), "BINARY")]
    kept, dropped = filters.drop(toc, filters.binary_patterns(False))
    assert kept == [toc[1]] and dropped == [["torch/include/a.h", 123]]


def test_module_excludes_keep_the_catalog_families(tmp_path: Path) -> None:
    for name in ("llama", "qwen2", "qwen3", "auto", "bert", "whisper", "__pycache__"):
        (tmp_path / name).mkdir()
    (tmp_path / "__init__.py").write_text("")
    cpu = filters.module_excludes(cuda=False, models_dir=tmp_path)
    assert "transformers.models.bert" in cpu and "transformers.models.whisper" in cpu
    assert not any(m.endswith((".llama", ".qwen2", ".qwen3", ".auto", "__pycache__")) for m in cpu)
    assert "triton" in cpu and "triton" not in filters.module_excludes(cuda=True, models_dir=tmp_path)
    assert "PySide6.QtWebEngineCore" in cpu and "PySide6.QtWidgets" not in cpu and "PySide6.QtSvg" not in cpu


LOAD_FAMILIES = """
import json, sys
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
out = sys.argv[1]
for kind in ("llama", "qwen2", "qwen3"):
    cfg = AutoConfig.for_model(kind, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(f"{out}/{kind}")
    AutoModelForCausalLM.from_pretrained(f"{out}/{kind}")
    model.generate(max_new_tokens=2, do_sample=False, input_ids=__import__("torch").tensor([[1, 2]]))
print(json.dumps(sorted({m.split(".")[2] for m in sys.modules if m.startswith("transformers.models.")})))
"""


def test_catalog_families_load_with_only_the_kept_transformers_models(tmp_path: Path) -> None:
    """In a fresh interpreter (so other tests' imports don't count): building, saving, loading and
    generating with Llama, Qwen2 and Qwen3 touches only the families the bundle keeps."""
    out = subprocess.run([sys.executable, "-c", LOAD_FAMILIES, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    used = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {"llama", "qwen2", "qwen3"} <= used
    assert used <= filters.TRANSFORMERS_MODELS_KEPT, used - filters.TRANSFORMERS_MODELS_KEPT


RUNTIME_IMPORTS = """
import json, os, sys
os.environ["QT_QPA_PLATFORM"] = "offscreen"
import torch, transformers, reasoning_gym, peft, safetensors, tokenizers
import engine.node.node, engine.doctor, engine.tasks, engine.swarm.transport, engine.swarm.mdns, engine.control.server
import engine.cli.bootstrap, engine.cli.run, engine.cli.gui
import app.main, app.views.main_window, pyqtgraph
from engine import tasks
for mix in tasks.PRESETS:  # every specialty builds and scores a question
    for question in tasks.heldout(tasks.preset(mix), 1, 0):
        tasks.score(question, "<answer>0</answer>")
print(json.dumps(sorted(sys.modules)))
"""


def test_nothing_the_engine_or_app_imports_is_excluded() -> None:
    """`import torch` alone pulls torch.testing._internal: an exclusion list must be checked against
    what the code really imports, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", RUNTIME_IMPORTS], capture_output=True, text=True, timeout=300,
                         check=False, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    excluded = filters.module_excludes(cuda=False)
    hit = [m for m in imported for x in excluded if m == x or m.startswith(x + ".")]
    assert not hit, hit


def test_tarball_holds_the_folder_and_a_readme(tmp_path: Path) -> None:
    import tarfile

    build = load("build")
    bundle = tmp_path / "sapo"
    (bundle / "_internal" / "torch" / "lib").mkdir(parents=True)
    (bundle / "sapo").write_bytes(b"\x7fELF" + b"0" * 96)
    (bundle / "sapo").chmod(0o755)
    (bundle / "_internal" / "torch" / "lib" / "libtorch_cpu.so").write_bytes(b"1" * 1000)
    assert build.tree_size(bundle) == 1100
    assert build.largest_parts(bundle) == [("torch/lib", 1000)]
    out = tmp_path / "x.tar.gz"
    build.make_tarball(bundle, out, "sapo-swarm-9.9", "hello\n")
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        assert {"sapo-swarm-9.9/sapo", "sapo-swarm-9.9/README.txt",
                "sapo-swarm-9.9/_internal/torch/lib/libtorch_cpu.so"} <= names
        assert tar.getmember("sapo-swarm-9.9/sapo").mode & 0o111  # stays executable
        readme = tar.extractfile("sapo-swarm-9.9/README.txt")
        assert readme is not None and readme.read() == b"hello\n"


def test_llama_cpp_libraries_are_named_explicitly(tmp_path: Path) -> None:
    """ctypes loads them at run time (invisible to PyInstaller); one copy per name it opens or links."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libllama.so", "libllama.so.0", "libllama.so.0.5.0", "libggml-base.so.0", "README.md"):
        (lib / name).write_bytes(b"x")
    got = [Path(src).name for src, dest in filters.llama_cpp_binaries(lib) if dest == "llama_cpp/lib"]
    assert got == ["libggml-base.so.0", "libllama.so", "libllama.so.0"]
    assert filters.llama_cpp_binaries(tmp_path / "missing") == []
