"""preprocess/ scripts: BPE + binarisation, and clear errors on bad input."""
import os

import pytest

from tests.helpers import cli
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


def _n_sentences(prefix):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    return len(MMapIndexedDataset(str(prefix)))


def _multi_test_corpus(root):
    """train / val / three test sets of different sizes (test_c has words unseen in training)."""
    _raw_corpus(root)
    for name, n, extra in (("test_a", 3, ""), ("test_b", 5, ""), ("test_c", 7, " zebraquagga")):
        _write(os.path.join(root, f"{name}.en"), [f"a cat {i} sees the dog{extra} ." for i in range(n)])
        _write(os.path.join(root, f"{name}.de"), [f"eine katze {i} sieht den hund{extra} ." for i in range(n)])


def test_prepare_translation_several_test_sets(tmp_path):
    """--test-pref a,b,c → test, test1, test2 (as fairseq-preprocess --testpref), one BPE and one dictionary."""
    from fairseq.data import Dictionary
    from subword_nmt.apply_bpe import BPE

    _multi_test_corpus(tmp_path / "raw")
    script("preprocess/prepare_translation.py", "--raw", tmp_path / "raw", "--src", "en", "--tgt", "de",
           "--dest", tmp_path / "bin", "--merges", 40, "--test-pref", "test_a,test_b,test_c")
    out = tmp_path / "bin"
    for name, n, raw in (("test", 3, "test_a"), ("test1", 5, "test_b"), ("test2", 7, "test_c")):
        for lang in ("en", "de"):
            assert _n_sentences(out / f"{name}.en-de.{lang}") == n
            assert (out / f"{name}.raw.{lang}").read_text() == (tmp_path / "raw" / f"{raw}.{lang}").read_text()
    assert not list(out.glob("test3.*"))
    # every test set is segmented with the training split's codes and indexed with the one dictionary
    dictionary = Dictionary.load(str(out / "dict.de.txt"))
    with open(out / "bpe.codes", encoding="utf-8") as f:
        bpe = BPE(f)
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    test2 = MMapIndexedDataset(str(out / "test2.en-de.de"))
    for i, line in enumerate((tmp_path / "raw" / "test_c.de").read_text().splitlines()):
        expected = dictionary.encode_line(bpe.process_line(line), add_if_not_exist=False).tolist()
        assert test2[i].tolist() == expected
    assert "zebraquagga" not in (out / "dict.de.txt").read_text()


def test_prepare_translation_missing_test_set_is_one_line_and_writes_nothing(tmp_path):
    _multi_test_corpus(tmp_path / "raw")
    proc = script("preprocess/prepare_translation.py", "--raw", tmp_path / "raw", "--src", "en", "--tgt", "de",
                  "--dest", tmp_path / "bin", "--merges", 40, "--test-pref", "test_a,test_missing,test_c", check=False)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len([line for line in err if "error" in line]) == 1
    assert "--test-pref" in err[-1] and "test_missing.en" in err[-1] and "test1 split" in err[-1]
    assert not (tmp_path / "bin").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".prepare-")], "temporary directory left behind"


MULTI30K_TOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                            "multi30k", "tok")


@pytest.mark.skipif(not os.path.isfile(os.path.join(MULTI30K_TOK, "test_2016_flickr.lc.norm.tok.en")),
                    reason=f"Multi30k not found at {MULTI30K_TOK} (shared/data)")
def test_prepare_translation_multi30k_test_sets(tmp_path):
    """Real Multi30k: every test set present (test_2016_flickr, and test_2017_* / test_2018_* where shared/data
    has them; the validation file as a further set otherwise), one BPE and dictionary, sizes kept."""
    import glob

    sets = sorted(os.path.basename(p)[: -len(".en")] for p in glob.glob(os.path.join(MULTI30K_TOK, "test_*.lc.norm.tok.en")))
    if len(sets) < 2:
        sets.append("val.lc.norm.tok")
    script("preprocess/prepare_translation.py", "--raw", MULTI30K_TOK, "--src", "en", "--tgt", "de",
           "--dest", tmp_path / "bin", "--merges", 200, "--train-pref", "train.lc.norm.tok",
           "--valid-pref", "val.lc.norm.tok", "--test-pref", ",".join(sets))
    for k, name in enumerate(sets):
        split = "test" if k == 0 else f"test{k}"
        with open(os.path.join(MULTI30K_TOK, f"{name}.de"), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        assert _n_sentences(tmp_path / "bin" / f"{split}.en-de.de") == n
    assert _n_sentences(tmp_path / "bin" / "test.en-de.en") == 1000  # test_2016_flickr


def test_mlu_prepare_generates_correct_disjoint_character_data(tmp_path):
    """MLU questions from a seed: the answers are right, the splits disjoint, the output deterministic and
    binarized as character-level translation data."""
    cli.script("preprocess/mlu_prepare.py", "--out", tmp_path / "raw", "--train", 200, "--valid", 20, "--test", 30,
               "--seed", 3, "--dest", tmp_path / "bin")
    sources = {}
    for split, n in (("train", 200), ("valid", 20), ("test", 30)):
        src = (tmp_path / "raw" / f"{split}.src").read_text().splitlines()
        tgt = (tmp_path / "raw" / f"{split}.tgt").read_text().splitlines()
        assert len(src) == len(tgt) == n
        for s, t in zip(src, tgt):
            text = s.replace(" ", "")
            first, second, question = text.split(",")
            values = dict(part.split("=") for part in (first, second))
            assert sorted(values) == ["x", "y"] and all(-1000 <= int(v) < 1000 for v in values.values())
            a, op, b = question[0], question[1], question[2]
            expected = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](int(values[a]), int(values[b]))
            assert t == " ".join(str(expected))
        sources[split] = set(src)
    assert not (sources["train"] & sources["test"]) and not (sources["train"] & sources["valid"])
    assert os.path.exists(tmp_path / "bin" / "train.src-tgt.src.bin")
    again = tmp_path / "again"
    cli.script("preprocess/mlu_prepare.py", "--out", again, "--train", 200, "--valid", 20, "--test", 30, "--seed", 3)
    assert (again / "test.src").read_text() == (tmp_path / "raw" / "test.src").read_text()
