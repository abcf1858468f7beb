#!/usr/bin/env python
"""Converts a HuggingFace ``TransfoXLLMHeadModel`` directory into a fairseq ``transformer_xl_lm`` checkpoint.

    python examples/transformer_xl/convert_hf_checkpoint.py HF_DIR OUT_DIR \\
        [--testpref wiki.test.tokens] [--validpref ...] [--trainpref ...] [--workers N]

``HF_DIR`` is a ``save_pretrained`` directory (or a download of the hub
repository): ``config.json``, the weights (``model.safetensors``,
``pytorch_model.bin`` or their sharded ``*.index.json`` form) and the
TransfoXLTokenizer vocabulary (``vocab.pkl``, ``vocab.bin`` or ``vocab.txt``;
optional ``tokenizer_config.json`` / ``special_tokens_map.json``).
``OUT_DIR`` receives ``checkpoint.pt`` and ``dict.txt``, plus the binarized
splits given with ``--trainpref/--validpref/--testpref`` (run through
``fairseq-preprocess --only-source --srcdict OUT_DIR/dict.txt``), so that
``OUT_DIR`` is both the model and the data directory::

    fairseq-eval-lm OUT_DIR --user-dir user_dir --task bptt_lm --path OUT_DIR/checkpoint.pt ...
    TransformerXLLanguageModel.from_pretrained(OUT_DIR, "checkpoint.pt", user_dir="user_dir")

Vocabulary (the choices, see also ``docs/transformer_xl.md``):

* fairseq's ``Dictionary`` always has ``<s> <pad> </s> <unk>`` at rows 0-3.
  HF's ``<eos>`` (the tokenizer's ``eos_token``, appended at every line end
  of WT103) becomes fairseq's ``</s>``, which fairseq also appends at every
  line end; HF's ``<unk>`` becomes fairseq's ``<unk>``.  The other HF tokens
  follow in HF order.
* ``<s>`` and ``<pad>`` (and ``<unk>`` when HF has none) are new rows: zero
  word vectors and an output bias of -10000, so their logit is -10000
  whatever the hidden state.  ``exp(-10000 - max logit)`` is exactly 0 in
  float32, so they take no probability from the HF tokens: every HF token
  keeps HF's log-probability, and the new symbols get about -10000.
* The new rows sit in the head of the adaptive softmax, in front of the HF
  tokens: every cutoff moves up by the number of new rows, so every HF token
  stays in its cluster.  This needs HF's ``<eos>``/``<unk>`` in the head
  (HF ids below the first cutoff; true for WT103, where both are among the
  most frequent symbols); otherwise the converter stops with an error.
* Text: the published WT103 model was trained on WT103 split at whitespace,
  with ``<eos>`` after every line (``lower_case`` False): exactly what
  ``fairseq-preprocess`` does.  When the saved tokenizer has ``lower_case``
  set, the text is lower-cased before binarizing; other ``delimiter`` values
  (character-level models) are not supported.  HF's
  ``TransfoXLTokenizer.tokenize`` additionally runs Moses normalisation
  (meant for raw text): it is not the corpus tokenization and not used here.

Model: every size and option comes from ``config.json`` (``d_model,
n_head, d_head, d_inner, d_embed, n_layer, cutoffs, div_val, mem_len,
clamp_len, same_length, pre_lnorm, untie_r, tie_word_embeddings,
tie_projs, dropout, dropatt, layer_norm_epsilon``); the weights go through
``state_dict_from_hf`` (the mapping the parity tests check).  Only
``attn_type 0`` and ``sample_softmax -1`` exist in this model.
"""
import argparse
import collections
import io
import json
import os
import pickle
import sys
import tempfile
import zipfile

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # rows 0-3 of every fairseq Dictionary
NEW_ROW_LOGIT = -1e4  # output bias of the rows HF does not have: probability 0 in float32


class ConversionError(Exception):
    """Bad input: the message names the file/option and what is wrong with it."""


# ------------------------------------------------------------------ reading HF files
def _read_json(path, required=True):
    if not os.path.exists(path):
        if required:
            raise ConversionError(f"{path} not found (expected a save_pretrained directory of a "
                                  f"TransfoXLLMHeadModel)")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: not valid JSON ({e})") from None


def read_config(hf_dir):
    """The model options of ``config.json``, checked for what ``transformer_xl_lm`` supports."""
    path = os.path.join(hf_dir, "config.json")
    c = _read_json(path)
    model_type = c.get("model_type")
    archs = c.get("architectures") or []
    if model_type not in (None, "transfo-xl") or (model_type is None and not any("TransfoXL" in a for a in archs)
                                                   and "div_val" not in c):
        raise ConversionError(f"{path}: model_type {model_type!r} (architectures {archs}) is not a TransfoXL model")
    if archs and "TransfoXLLMHeadModel" not in archs:
        raise ConversionError(f"{path}: architectures {archs} has no language-model head (TransfoXLLMHeadModel)")
    vocab_size = c.get("vocab_size", c.get("n_token"))
    missing = [k for k in ("d_model", "n_head", "d_head", "d_inner", "n_layer") if k not in c]
    if vocab_size is None or missing:
        raise ConversionError(f"{path}: missing {missing or ['vocab_size']}")
    if c.get("attn_type", 0) != 0:
        raise ConversionError(f"{path}: attn_type {c['attn_type']} is not supported (transformer_xl_lm has the "
                              f"relative attention of the paper, attn_type 0)")
    if (c.get("sample_softmax") or -1) > 0:
        raise ConversionError(f"{path}: sample_softmax {c['sample_softmax']} is not supported (transformer_xl_lm "
                              f"has the adaptive softmax)")
    if c.get("ext_len", 0) not in (0, None):
        raise ConversionError(f"{path}: ext_len {c['ext_len']} is not supported (transformer_xl_lm has ext_len 0)")
    cutoffs = list(c.get("cutoffs", []))
    if cutoffs != sorted(set(cutoffs)) or any(x <= 0 or x >= vocab_size for x in cutoffs):
        raise ConversionError(f"{path}: cutoffs {cutoffs} must be increasing and below vocab_size {vocab_size}")
    n_bands = len(cutoffs) + 1
    if "tie_projs" in c:
        tie_projs = list(c["tie_projs"])
    else:
        tie_projs = [False] + [bool(c.get("proj_share_all_but_first", True))] * len(cutoffs)
    choices = {"none": [False] * n_bands, "all_but_first": [False] + [True] * (n_bands - 1), "all": [True] * n_bands}
    tie_projs_name = next((k for k, v in choices.items() if v == tie_projs), None)
    div_val, d_model = c.get("div_val", 1), c["d_model"]
    d_embed = c.get("d_embed", d_model)
    if tie_projs_name is None:
        if div_val == 1 and d_embed == d_model:  # no projections: the flags tie nothing
            tie_projs_name = "none"
        else:
            raise ConversionError(f"{path}: tie_projs {tie_projs} is not supported (transformer_xl_lm ties none, "
                                  f"all but the first, or all projections)")
    return {
        "vocab_size": vocab_size, "cutoffs": cutoffs, "div_val": div_val, "tie_projs": tie_projs,
        "tgt_len": c.get("tgt_len", 128),
        "model": dict(
            n_layer=c["n_layer"], d_model=d_model, n_head=c["n_head"], d_head=c["d_head"], d_inner=c["d_inner"],
            d_embed=d_embed, dropout=c.get("dropout", 0.1), dropatt=c.get("dropatt", 0.0),
            mem_len=c.get("mem_len", 0) or 0, clamp_len=c.get("clamp_len", -1),
            same_length=bool(c.get("same_length", False)), pre_lnorm=bool(c.get("pre_lnorm", False)),
            untie_r=bool(c.get("untie_r", True)), div_val=div_val,
            tie_weight=bool(c.get("tie_word_embeddings", c.get("tie_weight", True))), tie_projs=tie_projs_name,
            init_std=c.get("init_std", 0.02), proj_init_std=c.get("proj_init_std", 0.01),
            layer_norm_eps=c.get("layer_norm_epsilon", 1e-5),
        ),
    }


class _Skipped:
    """Stands in for every object of a vocabulary pickle that is not plain data (Moses tokenizers,
    compiled patterns, HF internals): created without running any of their code."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _DataUnpickler(pickle.Unpickler):
    """Unpickles plain data only: builtins, ``Counter`` and ``OrderedDict``; any other global becomes
    :class:`_Skipped` (so a pickle cannot run code, and the parts we need are read as usual)."""

    ALLOWED = {("collections", "Counter"): collections.Counter,
               ("collections", "OrderedDict"): collections.OrderedDict}

    def find_class(self, module, name):
        return self.ALLOWED.get((module, name), _Skipped)


class _DataPickleModule:
    """``pickle_module`` for ``torch.load`` of torch-saved vocabularies (the hub's ``vocab.pkl``)."""

    Unpickler = _DataUnpickler
    __name__ = "fairseq_struct_data_pickle"

    @staticmethod
    def load(f, **kwargs):
        return _DataUnpickler(f, **kwargs).load()


def _load_vocab_pickle(path):
    import torch

    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = None if zipfile.is_zipfile(io.BytesIO(raw)) else _DataUnpickler(io.BytesIO(raw)).load()
        if not isinstance(data, dict):  # a torch.save file (legacy: the pickle starts with a magic number)
            data = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=False,
                              pickle_module=_DataPickleModule)
    except Exception as e:
        raise ConversionError(f"{path}: cannot read the TransfoXLTokenizer vocabulary ({type(e).__name__}: {e})") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("idx2sym"), list):
        raise ConversionError(f"{path}: no idx2sym list in it (not a TransfoXLTokenizer vocabulary)")
    return data


def read_vocab(hf_dir):
    """``(symbols in HF id order, counts, eos token, unk token, lower_case, delimiter)``."""
    tok_cfg = _read_json(os.path.join(hf_dir, "tokenizer_config.json"), required=False)
    specials = _read_json(os.path.join(hf_dir, "special_tokens_map.json"), required=False)
    for name in ("vocab.pkl", "vocab.bin"):
        if os.path.exists(os.path.join(hf_dir, name)):
            data = _load_vocab_pickle(os.path.join(hf_dir, name))
            symbols, counter = data["idx2sym"], data.get("counter") or {}
            break
    else:
        path = os.path.join(hf_dir, "vocab.txt")
        if not os.path.exists(path):
            raise ConversionError(f"{hf_dir}: no vocabulary (vocab.pkl, vocab.bin or vocab.txt; save the "
                                  f"TransfoXLTokenizer with save_pretrained next to the model)")
        with open(path, encoding="utf-8") as f:
            symbols = [line.split()[0] for line in f if line.strip()]
        data, counter = {}, {}

    def token(key, default):
        value = tok_cfg.get(key) or specials.get(key) or default
        return value.get("content", default) if isinstance(value, dict) else value

    # as TransfoXLTokenizer: the init options (tokenizer_config.json) take precedence over the pickle's
    lower_case = tok_cfg.get("lower_case", data.get("lower_case", False))
    delimiter = tok_cfg.get("delimiter", data.get("delimiter"))
    return symbols, counter, token("eos_token", "<eos>"), token("unk_token", "<unk>"), bool(lower_case), delimiter


def read_weights(hf_dir):
    import torch

    def load(name):
        path = os.path.join(hf_dir, name)
        if name.endswith(".safetensors"):
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise ConversionError(f"{path}: reading safetensors needs `pip install safetensors`") from None
            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)

    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if os.path.exists(os.path.join(hf_dir, single)):
            return load(single)
        if os.path.exists(os.path.join(hf_dir, index)):
            state = {}
            for shard in sorted(set(_read_json(os.path.join(hf_dir, index))["weight_map"].values())):
                state.update(load(shard))
            return state
    raise ConversionError(f"{hf_dir}: no weights (model.safetensors or pytorch_model.bin)")


# ------------------------------------------------------------------ the vocabulary map
def vocabulary_map(symbols, eos, unk, cutoffs, where):
    """For every fairseq id, the HF id it takes its rows from (-1: a new row), and the fairseq cutoffs.

    fairseq ids 0-3 are ``<s> <pad> </s> <unk>``: ``</s>`` is HF's ``eos``, ``<unk>`` HF's ``unk`` (if
    any); the other HF tokens follow in HF order.  The new rows are in the head, so every cutoff moves
    up by their number and every HF token stays in its cluster (HF's eos/unk must be in the head)."""
    hf_id = {s: i for i, s in enumerate(symbols)}
    if len(hf_id) != len(symbols):
        raise ConversionError(f"{where}: the vocabulary has duplicate symbols")
    if eos not in hf_id:
        raise ConversionError(f"{where}: the vocabulary has no end-of-line symbol {eos!r}; fairseq ends every "
                              f"line with </s>, which needs one")
    mapped = {"</s>": hf_id[eos], "<unk>": hf_id.get(unk)}
    for name, i in mapped.items():
        if i is not None and cutoffs and i >= cutoffs[0]:
            raise ConversionError(f"{where}: {symbols[i]!r} (HF id {i}) is outside the softmax head "
                                  f"(first cutoff {cutoffs[0]}); fairseq keeps {name} at row "
                                  f"{FAIRSEQ_SPECIALS.index(name)}, which would move it to another cluster")
    taken = {i for i in mapped.values() if i is not None}
    for i, s in enumerate(symbols):
        if s in FAIRSEQ_SPECIALS and i not in taken:
            raise ConversionError(f"{where}: HF token {s!r} (id {i}) has the name of a fairseq special symbol")
    new_to_hf = [-1 if mapped.get(s) is None else mapped[s] for s in FAIRSEQ_SPECIALS]
    new_to_hf += [i for i in range(len(symbols)) if i not in taken]
    n_new = len(new_to_hf) - len(symbols)
    return new_to_hf, [c + n_new for c in cutoffs]


def _rows(tensor, new_to_hf, n_new, fill=0.0):
    """The rows of ``tensor`` (an HF table of HF ids ``[0, n)``) in fairseq order: ``n + n_new`` rows
    (the head keeps its HF tokens and gains the new rows); rows of new symbols are ``fill``."""
    import torch

    n = tensor.size(0) + n_new
    ids = torch.tensor(new_to_hf[:n])
    out = tensor.new_full((n,) + tuple(tensor.shape[1:]), fill)
    keep = ids >= 0
    out[keep] = tensor[ids[keep]]
    return out


def remap_hf_state(state, cfg, new_to_hf, where):
    """HF state dict → the same in fairseq row order (tied tensors dropped by ``save_pretrained`` restored)."""
    state = dict(state)
    m = cfg["model"]
    n_layers_out = 1 if m["div_val"] == 1 else len(cfg["cutoffs"]) + 1
    if m["tie_weight"]:
        for i in range(n_layers_out):
            state.setdefault(f"crit.out_layers.{i}.weight", state.get(f"transformer.word_emb.emb_layers.{i}.weight"))
    for i, tied in enumerate(cfg["tie_projs"]):
        src = f"transformer.word_emb.emb_projs.{0 if m['div_val'] == 1 else i}"
        if tied and src in state:
            state.setdefault(f"crit.out_projs.{i}", state[src])
    if not m["untie_r"]:  # shared u, v: save_pretrained may keep them under a layer's name only
        for name in ("r_w_bias", "r_r_bias"):
            state.setdefault(f"transformer.{name}", state.get(f"transformer.layers.0.dec_attn.{name}"))
    head_rows = cfg["vocab_size"] if m["div_val"] == 1 else (cfg["cutoffs"] or [cfg["vocab_size"]])[0]
    for key in ("transformer.word_emb.emb_layers.0.weight", "crit.out_layers.0.weight", "crit.out_layers.0.bias"):
        if state.get(key) is None:
            raise ConversionError(f"{where}: the weights have no {key} (not a TransfoXLLMHeadModel state dict?)")
        if state[key].size(0) != head_rows:
            raise ConversionError(f"{where}: {key} has {state[key].size(0)} rows, config.json implies {head_rows}")
        state[key] = _rows(state[key], new_to_hf, len(new_to_hf) - cfg["vocab_size"],
                           NEW_ROW_LOGIT if key.endswith("bias") else 0.0)
    return {k: v for k, v in state.items() if v is not None}


# ------------------------------------------------------------------ fairseq side
def _import_plugin():
    import user_dir  # noqa: F401  (registers transformer_xl_lm and bptt_lm)


def write_dictionary(path, symbols, counter, new_to_hf):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in new_to_hf[len(FAIRSEQ_SPECIALS):]:
        d.add_symbol(symbols[i], n=int(counter.get(symbols[i], 0)))
    assert len(d) == len(new_to_hf)
    d.save(path)


def build_checkpoint(out_dir, cfg, fairseq_state):
    """Builds ``transformer_xl_lm`` exactly as ``fairseq-train`` would, loads the weights and saves the
    checkpoint in fairseq's format (plain containers: loadable with ``weights_only``)."""
    import torch
    from omegaconf import OmegaConf

    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    _import_plugin()
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [out_dir, "--task", "bptt_lm", "--arch", "transformer_xl_lm",
                                                "--tokens-per-sample", str(cfg["tgt_len"])])
    for key, value in cfg["model"].items():
        setattr(args, key, value)
    fs_cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(fs_cfg.task)
    model = task.build_model(fs_cfg.model)
    from user_dir.models.transformer_xl_lm import state_dict_from_hf

    state = state_dict_from_hf(fairseq_state, model.decoder)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        detail = " ".join(line.strip() for line in str(e).splitlines()[1:2])  # (the first problem)
        raise ConversionError(f"the HF weights do not fit transformer_xl_lm: {detail}") from None
    fs_cfg.task.data = "."  # hub from_pretrained and fairseq-eval-lm set the data directory themselves
    torch.save({
        "args": None,
        "cfg": OmegaConf.to_container(fs_cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {},
    }, os.path.join(out_dir, "checkpoint.pt"))
    return model


def train_flags(model_cfg):
    """The ``fairseq-train`` flags that rebuild this model (for ``--finetune-from-model``)."""
    flags = ["--arch", "transformer_xl_lm"]
    for key, value in model_cfg.items():
        name = "--" + key.replace("_", "-")
        if key == "tie_weight":  # (a store_false flag: given means False)
            flags += [] if value else [name]
        elif isinstance(value, bool):
            flags += [name] if value else []
        else:
            flags += [name, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return flags


def binarize(out_dir, prefs, lower_case, workers):
    """``fairseq-preprocess --only-source --srcdict OUT_DIR/dict.txt`` (text lower-cased first if the
    HF vocabulary is lower-case)."""
    from fairseq import options
    from fairseq_cli import preprocess

    with tempfile.TemporaryDirectory() as tmp:
        flags = []
        for split, path in prefs.items():
            if lower_case:
                lowered = os.path.join(tmp, split)
                with open(path, encoding="utf-8") as src, open(lowered, "w", encoding="utf-8") as dst:
                    for line in src:
                        dst.write(line.lower())
                path = lowered
            flags += [f"--{split}pref", path]
        args = options.get_preprocessing_parser().parse_args(
            ["--only-source", "--srcdict", os.path.join(out_dir, "dict.txt"), "--destdir", out_dir,
             "--workers", str(workers), *flags])
        preprocess.main(args)


def convert(hf_dir, out_dir, prefs=None, workers=1):
    if not os.path.isdir(hf_dir):
        raise ConversionError(f"{hf_dir}: not a directory")
    for split, path in (prefs or {}).items():
        if not os.path.isfile(path):
            raise ConversionError(f"--{split}pref {path}: file not found")
    cfg = read_config(hf_dir)
    symbols, counter, eos, unk, lower_case, delimiter = read_vocab(hf_dir)
    if delimiter not in (None, " "):
        raise ConversionError(f"{hf_dir}: tokenizer delimiter {delimiter!r} is not supported (fairseq-preprocess "
                              f"splits at whitespace)")
    if len(symbols) != cfg["vocab_size"]:
        raise ConversionError(f"{hf_dir}: the vocabulary has {len(symbols)} symbols, config.json vocab_size is "
                              f"{cfg['vocab_size']}")
    new_to_hf, cutoffs = vocabulary_map(symbols, eos, unk, cfg["cutoffs"], hf_dir)
    state = remap_hf_state(read_weights(hf_dir), cfg, new_to_hf, hf_dir)
    cfg["model"]["cutoffs"] = cutoffs
    os.makedirs(out_dir, exist_ok=True)
    _import_plugin()
    write_dictionary(os.path.join(out_dir, "dict.txt"), symbols, counter, new_to_hf)
    build_checkpoint(out_dir, cfg, state)
    if prefs:
        binarize(out_dir, prefs, lower_case, workers)
    return new_to_hf, train_flags(cfg["model"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hf_dir", help="save_pretrained directory of a TransfoXLLMHeadModel + its tokenizer")
    parser.add_argument("out_dir", help="where checkpoint.pt, dict.txt (and the binarized splits) go")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}pref", help=f"text of the {split} split to binarize with the converted dict")
    parser.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    args = parser.parse_args(argv)
    prefs = {s: getattr(args, f"{s}pref") for s in ("train", "valid", "test") if getattr(args, f"{s}pref")}
    try:
        _, flags = convert(args.hf_dir, args.out_dir, prefs, args.workers)
    except ConversionError as e:
        print(f"convert_hf_checkpoint.py: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {os.path.join(args.out_dir, 'checkpoint.pt')} and dict.txt; to fine-tune: fairseq-train "
          f"DATA --user-dir user_dir --task bptt_lm --finetune-from-model {args.out_dir}/checkpoint.pt "
          f"{' '.join(flags)} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
