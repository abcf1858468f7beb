"""capsule_transformer through the real fairseq CLIs: train → generate → interactive, hub, hydra."""
import os

import pytest

from tests.helpers.cli import ROOT, TINY_TRANSLATION_ARGS, USER_DIR, fairseq, num_lines, script, train_translation

CAPSULE = TINY_TRANSLATION_ARGS + ["--routing-iters", "2", "--routed-attention", "enc_self,dec_self,enc_dec"]


@pytest.fixture(scope="module")
def trained(toy_translation_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("capsule_ckpt")
    return train_translation(toy_translation_bin, str(save), "capsule_transformer", *CAPSULE, max_update=6)


def test_generate_with_beam_5(toy_translation_bin, trained):
    out = fairseq("generate", toy_translation_bin, "--path", trained, "--beam", "5", "--batch-size", "16",
                  "--max-len-b", "20", "--cpu").stdout
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == num_lines(os.path.join(toy_translation_bin, "test.raw.de"))  # every test sentence
    assert "BLEU" in out


def test_interactive(toy_translation_bin, trained):
    out = fairseq("interactive", toy_translation_bin, "--path", trained, "--beam", "5", "--cpu",
                  "--source-lang", "en", "--target-lang", "de", "--max-len-b", "10",
                  input="the cat sees a dog\nred house\n").stdout
    assert sum(line.startswith("H-") for line in out.splitlines()) == 2


def test_hub_translate(toy_translation_bin, trained):
    from user_dir.models.capsule_transformer import CapsuleTransformerModel
    from user_dir.modules.capsule_routing import CapsuleMultiheadAttention

    hub = CapsuleTransformerModel.from_pretrained(
        os.path.dirname(trained), checkpoint_file=os.path.basename(trained), data_name_or_path=toy_translation_bin,
        bpe="subword_nmt", bpe_codes=os.path.join(toy_translation_bin, "bpe.codes"), user_dir=USER_DIR,
        source_lang="en", target_lang="de", max_len_b=10)
    assert any(isinstance(m, CapsuleMultiheadAttention) for m in hub.models[0].modules())
    out = hub.translate(["the cat sees a dog", "red house"], beam=5)
    assert len(out) == 2 and all(isinstance(s, str) for s in out)


@pytest.mark.parametrize("module", ["encoder.layers.0.self_attn", "decoder.layers.0.encoder_attn"])
def test_plot_routing_writes_png(toy_translation_bin, trained, tmp_path, module):
    """examples/capsule_transformer/plot_routing.py on a trained checkpoint: a PNG for a self- and a cross-attention."""
    out = tmp_path / "routing.png"
    script("examples/capsule_transformer/plot_routing.py", "--checkpoint", trained, "--data", toy_translation_bin,
           "--bpe-codes", os.path.join(toy_translation_bin, "bpe.codes"), "--source", "the cat sees a dog",
           "--target", "die katze sieht einen hund", "--module", module, "--head", "1", "--out", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_routing_names_a_bad_head_and_module(toy_translation_bin, trained, tmp_path):
    common = ["--checkpoint", trained, "--data", toy_translation_bin, "--source", "red house",
              "--target", "rotes haus", "--out", tmp_path / "x.png"]
    proc = script("examples/capsule_transformer/plot_routing.py", *common, "--head", "7", check=False)
    assert proc.returncode != 0 and "--head 7 out of range (the module has 2 heads)" in proc.stderr
    proc = script("examples/capsule_transformer/plot_routing.py", *common, "--module", "encoder.layers.0.fc1",
                  check=False)
    assert proc.returncode != 0 and "is not routed; routed modules: encoder.layers.0.self_attn" in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_checkpoint_with_other_routing_settings_is_refused(toy_translation_bin, trained):
    proc = fairseq("generate", toy_translation_bin, "--path", trained, "--beam", "2", "--cpu",
                   "--model-overrides", "{'capsule_routing': 'vertical'}", check=False)
    assert proc.returncode != 0
    assert "different capsule routing settings" in proc.stderr


def test_hydra_train_yaml(toy_translation_bin, tmp_path):
    fairseq("hydra-train", "--config-dir", os.path.join(ROOT, "examples", "capsule_transformer"),
            "--config-name", "multi30k", f"task.data={toy_translation_bin}", f"common.user_dir={USER_DIR}",
            "model.encoder_layers=1", "model.decoder_layers=1", "model.encoder_embed_dim=16",
            "model.decoder_embed_dim=16", "model.encoder_ffn_embed_dim=16", "model.decoder_ffn_embed_dim=16",
            "optimization.max_update=2", "dataset.max_tokens=500", f"checkpoint.save_dir={tmp_path}",
            f"hydra.run.dir={tmp_path}/hydra",
            user_dir=False)
    from fairseq import checkpoint_utils

    from user_dir.modules.capsule_routing import CapsuleMultiheadAttention

    models, cfg = checkpoint_utils.load_model_ensemble([os.path.join(tmp_path, "checkpoint_last.pt")])
    routed = [m for m in models[0].modules() if isinstance(m, CapsuleMultiheadAttention)]
    assert len(routed) == 1 and not routed[0].capsule.causal and cfg.model.routing_iters == 3  # encoder self-attention only (enc_self), from the YAML


@pytest.mark.parametrize("flags", [["--memory-efficient-fp16"], ["--fp16", "--fp16-no-flatten-grads"]],
                         ids=["memory-efficient-fp16", "fp16-no-flatten-grads"])
def test_fp16_training_through_fairseq_train(toy_translation_bin, tmp_path, flags):
    """fairseq's float16 trainer path as far as it runs on CPU (``--fp16`` with flattened grads
    needs CUDA; an overflow makes fairseq call ``.cuda()``, hence ``--fp16-init-scale 1``): the
    model trains in float16 (routing in float32 inside) with finite losses."""
    import re

    proc = fairseq("train", toy_translation_bin, "--task", "translation", "--arch", "capsule_transformer",
                   *CAPSULE, *flags, "--fp16-init-scale", "1", "--optimizer", "adam", "--lr", "1e-3",
                   "--max-tokens", "1000", "--max-update", "4", "--save-dir", tmp_path, "--log-interval", "1",
                   "--no-progress-bar", "--log-format", "simple", "--cpu", "--num-workers", "0", "--seed", "1",
                   "--no-save")
    text = proc.stdout + proc.stderr
    losses = [float(x) for x in re.findall(r"train_inner .* loss=([\d.]+|nan|inf),", text)]
    assert len(losses) >= 4, "\n".join(line for line in text.splitlines() if "| " in line or "Error" in line)
    assert all(0 < x < 100 for x in losses), f"non-finite or absurd losses: {losses}"
    assert "loss_scale=1" in text  # fairseq's float16 optimizer ran (its loss scale is logged)
