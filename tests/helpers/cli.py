"""Run the real fairseq console entry points (and the plugin's scripts) on tiny data."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(ROOT, "user_dir")
BIN = os.path.dirname(sys.executable)

# the smallest sensible encoder-decoder, for CLI smoke runs
TINY_TRANSLATION_ARGS = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


def tool(name):
    """Path of a console script (``fairseq-train`` ...) of the running interpreter's environment."""
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else name


def run(cmd, cwd=None, check=True, input=None, timeout=900, env=None):
    """Runs ``cmd``; on failure the assertion message carries the command's output."""
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd or ROOT, input=input, capture_output=True, text=True,
        timeout=timeout, env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def fairseq(name, *args, user_dir=True, **kwargs):
    """Runs ``fairseq-<name>`` (train, generate, preprocess, ...) with ``--user-dir user_dir``."""
    cmd = [tool(f"fairseq-{name}"), *map(str, args)]
    if user_dir:
        cmd += ["--user-dir", USER_DIR]
    return run(cmd, **kwargs)


def script(path, *args, **kwargs):
    """Runs one of the project's Python scripts (path relative to the repository root)."""
    return run([sys.executable, os.path.join(ROOT, path), *map(str, args)], **kwargs)


def load_script(path):
    """Imports one of the project's Python scripts (path relative to the repository root) as a module.

    As ``python PATH`` would run it, the script's directory comes first on ``sys.path`` while it is imported, so
    that it imports its sibling modules (``import speed``); those are then dropped from ``sys.modules``, so that a
    script of another directory gets its own ``speed``."""
    full = os.path.join(ROOT, path)
    folder = os.path.dirname(full)
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], full)
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
        for name in set(sys.modules) - before:
            if os.path.dirname(os.path.abspath(getattr(sys.modules[name], "__file__", None) or "")) == folder:
                del sys.modules[name]
    return module


def make_toy_translation_data(workdir, train=300, valid=37, test=43, merges=200):
    """Synthetic en→de corpus → BPE → fairseq-preprocess. Returns the binarized directory."""
    raw, dest = os.path.join(workdir, "raw"), os.path.join(workdir, "bin")
    script("preprocess/toy_translation_corpus.py", "--out", raw, "--train", train,
           "--valid", valid, "--test", test)
    script("preprocess/prepare_translation.py", "--raw", raw, "--src", "en", "--tgt", "de",
           "--dest", dest, "--merges", merges)
    return dest


def make_toy_sst_data(workdir, train=120):
    """Random SST-format sentences (``LABEL words``, 5 classes) through preprocess/sst_prepare.py. Returns the
    binarized directory."""
    import random

    raw, dest = os.path.join(workdir, "raw"), os.path.join(workdir, "bin")
    os.makedirs(raw, exist_ok=True)
    rng = random.Random(0)
    words = "good bad fine awful great poor nice dull the a movie plot film".split()
    for split, n in (("train", train), ("dev", 16), ("test", 16)):
        with open(os.path.join(raw, f"stsa.fine.{split}"), "w") as f:
            for _ in range(n):
                f.write(f"{rng.randint(0, 4)} {' '.join(rng.choice(words) for _ in range(rng.randint(2, 9)))}\n")
    script("preprocess/sst_prepare.py", "--raw", raw, "--classes", 5, "--dest", dest)
    return dest


def make_toy_lm_data(workdir, lines=400):
    """Target side of the synthetic corpus, binarized as a monolingual LM corpus."""
    raw = os.path.join(workdir, "raw")
    script("preprocess/toy_translation_corpus.py", "--out", raw, "--train", lines,
           "--valid", 60, "--test", 60)
    dest = os.path.join(workdir, "bin")
    fairseq("preprocess", "--only-source", "--trainpref", os.path.join(raw, "train.de"),
            "--validpref", os.path.join(raw, "valid.de"), "--testpref", os.path.join(raw, "test.de"),
            "--destdir", dest, user_dir=False)
    return dest


def train_translation(data, save_dir, arch, *extra, max_update=5):
    """A few ``fairseq-train`` updates of a translation model; returns the checkpoint path."""
    fairseq(
        "train", data, "--task", "translation", "--arch", arch, "--optimizer", "adam", "--lr", "1e-3",
        "--max-tokens", "1000", "--max-update", max_update, "--save-dir", save_dir,
        "--no-progress-bar", "--log-format", "simple", "--cpu", "--num-workers", "0", "--seed", "1",
        "--no-epoch-checkpoints", *extra,
    )
    return os.path.join(save_dir, "checkpoint_last.pt")


def num_lines(path):
    """Number of lines of a text file (e.g. the references a generation run must cover)."""
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)
