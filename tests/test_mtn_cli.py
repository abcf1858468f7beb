"""MTN through the real CLIs: synthetic sessions → prepare → fairseq-train → fairseq-generate --nbest → scoring."""
import os
import re

import pytest

from tests.helpers.cli import fairseq, run, script, tool

TRAIN_ARGS = ["--task", "query_suggestion", "--optimizer", "adam", "--lr", "2e-3", "--max-tokens", "2000",
              "--no-progress-bar", "--log-format", "simple", "--cpu", "--num-workers", "0", "--seed", "1",
              "--no-epoch-checkpoints", "--max-query-length", "12"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    work = tmp_path_factory.mktemp("mtn_syn")
    ses = work / "ses"
    script("preprocess/synthetic_sessions.py", "--out", ses, "--train", 200, "--valid", 15, "--test", 15)
    script("preprocess/query_suggestion_prepare.py", "--ses-dir", ses, "--dest", work / "bin",
           "--max-query-length", 12)
    return work


def test_train_generate_nbest_and_score(synthetic, tmp_path):
    data = synthetic / "bin"
    out = fairseq("train", data, "--arch", "mtn_tiny", "--max-update", 8, "--save-dir", tmp_path, *TRAIN_ARGS,
                  "--eval-suggestions", "--eval-nbest", 3)
    valid = [line for line in out.stdout.splitlines() if "valid on 'valid' subset" in line]
    assert valid and all(re.search(r"em@1 [\d.]+ \| em@3 [\d.]+ \| mrr [\d.]+ \| bleu [\d.]+", v) for v in valid)
    gen = fairseq("generate", data, "--task", "query_suggestion", "--path", tmp_path / "checkpoint_last.pt",
                  "--beam", 3, "--nbest", 3, "--cpu", "--max-len-b", 13)
    out_file = tmp_path / "gen.txt"
    out_file.write_text(gen.stdout)
    n_test = sum(1 for _ in open(data / "raw" / "test.tgt"))
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == 3 * n_test
    scored = script("preprocess/query_suggestion_score.py", out_file, "--k", 3, "--ref", data / "raw" / "test.tgt")
    last = scored.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"BLEU = [\d.]+ EM@1 = [\d.]+ EM@3 = [\d.]+ MRR = [\d.]+ \(n = {n_test}\)", last), last
    # hub interface: a flattened session in, k suggestions out
    from user_dir.models.mtn import MTNModel

    hub = MTNModel.from_pretrained(str(tmp_path), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data))
    session = (data / "raw" / "test.src").read_text().splitlines()[1]
    hyps = hub.generate(hub.encode(session), beam=3, nbest=3, max_len_b=13)
    assert len(hyps) == 3 and all(len(h["tokens"]) <= 14 for h in hyps)
    # the scorer refuses an output with a missing example
    truncated = tmp_path / "truncated.txt"
    truncated.write_text("\n".join(line for line in gen.stdout.splitlines() if not line.startswith("H-0\t")))
    bad = script("preprocess/query_suggestion_score.py", truncated, "--ref", data / "raw" / "test.tgt", check=False)
    assert bad.returncode != 0 and "no suggestion for 1 of" in bad.stderr


def test_hydra_yaml(synthetic, tmp_path):
    run([tool("fairseq-hydra-train"), "--config-dir", "examples/mtn", "--config-name", "mtn_tiny",
         f"task.data={synthetic / 'bin'}", f"common.user_dir={os.path.abspath('user_dir')}",
         "optimization.max_update=3", f"checkpoint.save_dir={tmp_path}", "common.cpu=true",
         "task.max_query_length=12", "model.encoder_embed_dim=16", "model.decoder_embed_dim=16",
         f"hydra.run.dir={tmp_path / 'hydra'}"])
    assert (tmp_path / "checkpoint_last.pt").exists()


def _task(data, **overrides):
    from fairseq.tasks import setup_task
    from tests.helpers.models import parse_cfg

    cfg = parse_cfg("mtn_tiny", task="query_suggestion", extra=["--max-query-length", 12]).task
    cfg.data = str(data)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return setup_task(cfg)


def test_task_reads_raw_sessions(synthetic, tmp_path):
    data = tmp_path / "raw_data"
    data.mkdir()
    for name in ("dict.src.txt", "dict.tgt.txt"):
        (data / name).write_text((synthetic / "bin" / name).read_text())
    first = (synthetic / "ses" / "train.ses").read_text().splitlines()[:3]  # words all in the dictionary
    (data / "test.ses").write_text("\n".join(first) + "\n")
    task = _task(data)
    task.load_dataset("test")
    expected = sum(len(line.split("\t")) - 1 for line in first)
    assert len(task.dataset("test")) == expected
    queries = first[0].split("\t")
    ex = task.dataset("test")[0]
    assert task.src_dict.string(ex["source"]) == queries[0] and task.tgt_dict.string(ex["target"]) == queries[1]
    if len(queries) > 2:
        ex = task.dataset("test")[1]
        assert task.src_dict.string(ex["source"]) == f"{queries[0]} </q> {queries[1]}"

    (data / "valid.ses").write_text(first[0] + "\nlonely query\n" + first[1] + "\n")
    with pytest.raises(ValueError, match=r"valid.ses:2: session has a single query"):
        task.load_dataset("valid")
    task = _task(data, bad_sessions="skip")
    task.load_dataset("valid")
    assert len(task.dataset("valid")) == len(first[0].split("\t")) - 1 + len(first[1].split("\t")) - 1


def test_prepare_names_bad_session(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.ses").write_text("a b\tc d\n")
    (tmp_path / "valid.ses").write_text("a b\tc d\n" + "\t".join(["w " * 20] * 2) + "\n")
    proc = script("preprocess/query_suggestion_prepare.py", "--ses-dir", tmp_path, "--dest", tmp_path / "bin",
                  check=False)
    assert proc.returncode != 0 and "valid.ses:2: a query has 20 words, more than --max-query-length 16" in proc.stderr
    assert not (tmp_path / "bin").exists()


def test_query_log_sessions(tmp_path):
    tsv = tmp_path / "log.tsv"
    tsv.write_text("AnonID\tQueryTime\tQuery\n"
                   "7\t2006-03-01 10:00:00\tCheap Flights!\n"
                   "7\t2006-03-01 10:05:00\tcheap flights\n"      # immediate repeat after normalisation
                   "7\t2006-03-01 10:20:00\tcheap flights paris\n"
                   "7\t2006-03-01 11:00:01\tweather paris\n"      # > 30 min later: new session
                   "7\t2006-03-01 11:10:00\tweather  paris today\n"
                   "9\t2006-03-01 09:00:00\tsolo\n")               # single-query session: dropped
    out = tmp_path / "log.ses"
    proc = script("preprocess/query_log_sessions.py", tsv, "--out", out)
    assert out.read_text() == "cheap flights\tcheap flights paris\nweather paris\tweather paris today\n"
    assert "1 immediate repeats" in proc.stdout and "1 single-query sessions" in proc.stdout
    tsv.write_text(tsv.read_text() + "7\t2006-03-01 12:00:00\n")
    bad = script("preprocess/query_log_sessions.py", tsv, "--out", out, check=False)
    assert bad.returncode != 0 and f"{tsv}:8: 2 TAB-separated column(s), need 3" in bad.stderr
    skip = script("preprocess/query_log_sessions.py", tsv, "--out", out, "--bad-rows", "skip")
    assert "1 rows with missing columns" in skip.stdout


def test_trec_session_reader(shared_data, tmp_path):
    xml = os.path.join(shared_data, "trec-session-2013", "sessiontrack2013.xml.xz")
    proc = script("preprocess/trec_session_sessions.py", xml, "--out", tmp_path)
    assert "133 sessions" in proc.stdout
    splits = {s: (tmp_path / f"{s}.ses").read_text().splitlines() for s in ("train", "valid", "test")}
    assert all(splits.values())
    for lines in splits.values():
        for line in lines:
            queries = line.split("\t")
            assert len(queries) >= 2 and all(q and q == q.lower() for q in queries)
    assert "us civil war causes\tus civil war economic causes" in splits["train"] + splits["valid"] + splits["test"]


def test_sessions_typed_with_tabs_in_interactive_and_hub(synthetic, tmp_path):
    """fairseq-interactive and the hub take a session in the .ses layout (queries separated by TAB) as the same
    source as `q1 </q> q2`; before, the TABs were read as spaces and the session as one long query."""
    data = synthetic / "bin"
    fairseq("train", data, "--arch", "mtn_tiny", "--max-update", 4, "--save-dir", tmp_path, *TRAIN_ARGS)
    joined = [line for line in (data / "raw" / "test.src").read_text().splitlines() if " </q> " in line][:4]
    assert joined, "the synthetic test split has no multi-query session"
    tabbed = [line.replace(" </q> ", "\t") for line in joined]

    def interactive(lines):
        out = fairseq("interactive", data, "--task", "query_suggestion", "--path", tmp_path / "checkpoint_last.pt",
                      "--beam", 3, "--nbest", 2, "--cpu", "--max-query-length", 12, input="\n".join(lines) + "\n")
        return [line for line in out.stdout.splitlines() if line[:2] in ("S-", "H-")]

    from_tabs = interactive(tabbed)
    assert from_tabs == interactive(joined)
    assert sum(line.startswith("S-") for line in from_tabs) == len(joined)
    assert all(" </q> " in line for line in from_tabs if line.startswith("S-"))
    from user_dir.models.mtn import MTNModel

    hub = MTNModel.from_pretrained(str(tmp_path), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data))
    for tab_line, joined_line in zip(tabbed, joined):
        assert hub.encode(tab_line).tolist() == hub.encode(joined_line).tolist()
    assert hub.sample(tabbed[0], beam=3) == hub.sample(joined[0], beam=3)
