"""The examples run, on tiny sizes on the CPU, with no FutureWarning or DeprecationWarning of ours: each runs under
a wrapper that reports every such warning whose innermost frames (the call that warned, and the calls just above it)
include our files, omni_hf's or the example's. So a deprecated API of torch or Transformers that our code calls is
found, although the warning is attributed to the library's own wrapper file. The output also must not hold the notice
Transformers logs when the tokenizer's special tokens differ from the model config's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
MARKER = "WARNING OF OURS:"

WRAPPER = """
import runpy, sys, traceback, warnings

OURS, SCRIPT, DEPTH = {ours!r}, sys.argv[1], 3

def report(message, category, filename, lineno, file=None, line=None):
    frames = [f for f in traceback.extract_stack()[:-1] if f.filename != warnings.__file__]
    if any(f.filename.startswith(OURS) or f.filename == SCRIPT for f in frames[-DEPTH:]):
        print({marker!r}, warnings.formatwarning(message, category, filename, lineno, line), file=sys.stderr)
        print("".join(traceback.format_list(frames[-DEPTH:])), file=sys.stderr)

warnings.showwarning = report
for category in (FutureWarning, DeprecationWarning):
    warnings.simplefilter("always", category)
sys.argv = sys.argv[1:]
runpy.run_path(SCRIPT, run_name="__main__")
"""

# Logged by Transformers when the model config's special tokens differ from the tokenizer's.
REALIGNED = "The tokenizer has new PAD/BOS/EOS tokens"


def run_wrapped(tmp_path: Path, launcher: list[str], script: str, *arguments: str) -> subprocess.CompletedProcess:
    """``launcher wrapper.py script arguments`` from a temporary directory, this checkout's omni_hf first."""
    wrapper = tmp_path / "report_our_warnings.py"
    wrapper.write_text(WRAPPER.format(ours=str(ROOT / "omni_hf"), marker=MARKER))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([*launcher, str(wrapper), str(ROOT / script), *arguments], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def assert_clean(done: subprocess.CompletedProcess) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert MARKER not in output, output[output.index(MARKER):][:4000]
    assert REALIGNED not in output, f"the tiny model's config and tokenizer disagree:\n{output[-4000:]}"


def test_the_wrapper_reports_a_warning_near_our_frames_only(tmp_path):
    """A warning the script raises itself is reported; one raised four calls deep in a library it calls is not."""
    (tmp_path / "library.py").write_text("import warnings\n"
                                         "def a(): b()\ndef b(): c()\ndef c(): d()\n"
                                         "def d(): warnings.warn('deep', FutureWarning)\n")
    script = tmp_path / "warns.py"
    script.write_text("import warnings\nimport library\nwarnings.warn('old', FutureWarning)\nlibrary.a()\n")
    done = run_wrapped(tmp_path, [sys.executable], str(script))
    assert done.returncode == 0, done.stderr
    assert f"{MARKER} {script}:3: FutureWarning: old" in done.stderr
    assert "deep" not in done.stderr


def test_sft_demo_warns_of_nothing_of_ours(tmp_path):
    pytest.importorskip("trl", reason="the demo needs the sft extra: python3 -m pip install -e '.[sft]'")
    assert_clean(run_wrapped(tmp_path, [sys.executable], "examples/sft_vlm.py", "--samples", "8", "--steps", "2",
                             "--batch-samples", "4", "--max-length", "256"))


def test_packed_llama_example_warns_of_nothing_of_ours(tmp_path):
    assert_clean(run_wrapped(tmp_path, [sys.executable], "examples/hf_omni.py"))


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_cpu_context_parallel_example_warns_of_nothing_of_ours(tmp_path):
    """Two gloo ranks: the all-gather of keys and values (omni_hf.distributed) forward and backward, checkpointing."""
    done = run_wrapped(tmp_path, ["torchrun", "--standalone", "--nproc-per-node", "2"],
                       "examples/context_parallel.py", "--length", "512", "--steps", "1", "--warmup", "0",
                       "--workers", "0")
    assert_clean(done)
    assert "attention imbalance" in done.stdout and "not the balance on GPUs" in done.stdout
