"""preprocess/ scripts: BPE + binarisation, and clear errors on bad input."""
import os

import pytest

from tests.helpers.cli import fairseq, script


def _write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(line + "\n" for line in lines)


def _raw_corpus(root, n=30):
    for split in ("train", "valid", "test"):
        _write(os.path.join(root, f"{split}.en"), [f"the dog {i} sees a cat ." for i in range(n)])
        _write(os.path.join(root, f"{split}.de"), [f"der hund {i} sieht eine katze ." for i in range(n)])


def test_toy_corpus_is_deterministic_and_disjoint(tmp_path):
    for out in ("a", "b"):
        script("preprocess/toy_translation_corpus.py", "--out", tmp_path / out, "--train", 50, "--valid", 10, "--test", 10)
    a = (tmp_path / "a" / "train.de").read_text()
    assert a == (tmp_path / "b" / "train.de").read_text()
    train = set((tmp_path / "a" / "train.en").read_text().splitlines())
    test = set((tmp_path / "a" / "test.en").read_text().splitlines())
    assert len(train) == 50 and not train & test


@pytest.mark.parametrize("bpe", ["subword-nmt", "sentencepiece"])
def test_prepare_translation_binarizes(tmp_path, bpe):
    _raw_corpus(tmp_path / "raw")
    script("preprocess/prepare_translation.py", "--raw", tmp_path / "raw", "--src", "en", "--tgt", "de",
           "--dest", tmp_path / "bin", "--bpe", bpe, "--merges", 40)
    files = set(os.listdir(tmp_path / "bin"))
    for split in ("train", "valid", "test"):
        assert {f"{split}.en-de.en.bin", f"{split}.en-de.de.idx", f"{split}.raw.de"} <= files
    assert "dict.en.txt" in files and ("bpe.codes" in files or "spm.model" in files)


def test_multi30k_style_names_and_gz_are_found(tmp_path):
    import gzip

    for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for lang, word in (("en", "dog"), ("de", "hund")):
            with gzip.open(tmp_path / f"{name}.lc.norm.tok.{lang}.gz", "wt") as f:
                f.writelines(f"a {word} {i} .\n" for i in range(20))
    script("preprocess/prepare_translation.py", "--raw", tmp_path, "--src", "en", "--tgt", "de",
           "--dest", tmp_path / "bin", "--merges", 20)
    assert (tmp_path / "bin" / "test.en-de.de.bin").exists()


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    _raw_corpus(tmp_path / "raw")
    _write(str(tmp_path / "raw" / "valid.de"), ["nur eine zeile"])
    proc = script("preprocess/prepare_translation.py", "--raw", tmp_path / "raw", "--src", "en", "--tgt", "de",
                  "--dest", tmp_path / "bin", check=False)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()[-1]
    assert "misaligned" in err and "valid.en has 30 lines" in err and "valid.de has 1 lines" in err
    assert not (tmp_path / "bin").exists(), "partial output left behind"


def test_missing_directory_and_empty_corpus(tmp_path):
    proc = script("preprocess/prepare_translation.py", "--raw", tmp_path / "nope", "--src", "en", "--tgt", "de",
                  "--dest", tmp_path / "bin", check=False)
    assert proc.returncode != 0 and "raw data directory not found" in proc.stderr
    for split in ("train", "valid", "test"):
        _write(str(tmp_path / "empty" / f"{split}.en"), [])
        _write(str(tmp_path / "empty" / f"{split}.de"), [])
    proc = script("preprocess/prepare_translation.py", "--raw", tmp_path / "empty", "--src", "en", "--tgt", "de",
                  "--dest", tmp_path / "bin", check=False)
    assert proc.returncode != 0 and "empty corpus" in proc.stderr
    assert not (tmp_path / "bin").exists()


def test_cleaning_drops_long_and_unbalanced_pairs(tmp_path):
    _raw_corpus(tmp_path / "raw")
    _write(str(tmp_path / "raw" / "train.en"), ["a b c"] * 10 + ["x " * 30] * 5 + ["a"] * 5)
    _write(str(tmp_path / "raw" / "train.de"), ["d e f"] * 10 + ["y " * 30] * 5 + ["b c d e"] * 5)
    proc = script("preprocess/prepare_translation.py", "--raw", tmp_path / "raw", "--src", "en", "--tgt", "de",
                  "--dest", tmp_path / "bin", "--bpe", "none", "--max-len", 20, "--max-ratio", 3)
    assert "kept 10 of 20 pairs" in proc.stderr


def test_unknown_arch_is_one_clear_line(tmp_path):
    proc = fairseq("train", tmp_path, "--arch", "no_such_arch", check=False)
    assert proc.returncode != 0
    assert "invalid choice: 'no_such_arch'" in proc.stderr


def test_demo_script_rejects_missing_data_dir(tmp_path):
    from tests.helpers.cli import ROOT, run

    proc = run(["bash", os.path.join(ROOT, "examples/demo/run_demo.sh")], check=False,
               env={"DATA": str(tmp_path / "missing"), "WORK": str(tmp_path / "work")})
    assert proc.returncode != 0 and "DATA directory not found" in proc.stderr
