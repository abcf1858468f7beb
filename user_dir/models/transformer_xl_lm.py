"""``transformer_xl_lm``: Transformer-XL language model (Dai et al., ACL 2019, arXiv 1901.02860).

Written for this plugin from the paper and the official code (``kimiyoung/transformer-xl``,
``pytorch/mem_transformer.py``, ``MemTransformerLM`` with ``attn_type=0``).

Where the paper's ideas live
----------------------------
* **Segment-level recurrence** (Sec. 3.2): layer ``n`` attends over ``h̃^{n-1} = [SG(m^{n-1}) ∘ h^{n-1}]``
  (queries from ``h^{n-1}``, keys and values from ``h̃^{n-1}``); the memory ``m^{n-1}`` holds the last
  ``mem_len`` inputs of layer ``n``, detached, updated after every segment as the reference's
  ``_update_mems`` (:meth:`TransformerXLDecoder.update_memory`, :meth:`TransformerXLDecoder.extract_features`).
* **Relative positional encodings** with the four terms (a)–(d), ``u``/``v`` shared across layers or per
  layer (``untie_r``), ``rel_shift``, ``clamp_len`` and ``same_length``:
  :mod:`user_dir.modules.relative_multihead_attention`.
* **Adaptive input and projected adaptive softmax** with ``cutoffs``, ``div_val``, tied weights and
  projections: :mod:`user_dir.modules.projected_adaptive`.
* **No absolute positions**: ``h^0 = E_s · sqrt(d_model)``; dropout on the embeddings, on ``R`` and on the last
  layer's output.
* **Reference initialisation** (``train.py::weights_init``, ``init='normal'``):
  :meth:`TransformerXLDecoder.reset_parameters`.
* **Truncated BPTT over contiguous streams**: the task :mod:`user_dir.tasks.bptt_lm`.

Reconstruction decisions (where the memory lives in fairseq)
------------------------------------------------------------
1. *Memory over streams.*  With ``bptt_lm`` the decoder keeps the memory itself between calls.  The task puts
   the batch's index in the streams in ``net_input["stream_pos"]``: position 0 (every epoch start, every
   validation or ``fairseq-eval-lm`` pass) starts without memory; later positions continue from the stored
   memory, which notes the position it continues (a batch at another position starts without memory, with a
   warning).  Without ``stream_pos`` (plain ``model(src_tokens)``, other tasks, the invariance helpers) a call
   is stateless: one segment, no memory.
2. *Train and eval slots.*  One stream memory for training mode and one for evaluation mode, so a validation
   in the middle of an epoch leaves the training memory as it was (training after it continues exactly as
   without it).  Saving the training memory with checkpoints: decision 4 of :mod:`user_dir.tasks.bptt_lm`.
3. *Generation* (``fairseq-interactive``, ``fairseq-generate``, hub ``sample()``/``score()``): the memory is the
   ``incremental_state``; each step feeds only the newest token and ``reorder_incremental_state`` reorders
   it for beam search.  The context a step sees is therefore ``mem_len`` tokens (raise it with
   ``--model-overrides '{"mem_len": N}'``).
4. *No trimming between streams*: ``ext_len`` is 0 (the reference default), so the reference's
   swapped-argument bug in ``_update_mems`` does not arise.
5. *Evaluation caches.*  In evaluation without autograd, the key/value projections of the memory and each
   layer's ``W_kR R`` are computed once and reused by the next segment of the same pass (same numbers).  They
   live next to the memory (evaluation slot or ``incremental_state``), never in a module, and are dropped at
   ``stream_pos`` 0, by any forward that does not cache (training mode, autograd on), by ``train()`` (which
   fairseq's trainer calls before every update) and by ``load_state_dict``: no cache survives a parameter
   update, whoever wrote the parameters (fairseq's optimizers write ``p.data``, which leaves
   ``weight._version`` unchanged).
6. *Activation checkpointing* (``--checkpoint-activations``): every layer in fairseq's ``checkpoint_wrapper``;
   dropout masks are replayed from the saved RNG state, so loss and gradients equal those without.
7. *Output of* ``forward``: ``net_output[0]`` are the final hidden states; :meth:`get_normalized_probs`
   applies the adaptive softmax and ``get_target_nll`` gives the targets' NLL alone (the loss of
   ``--criterion projected_adaptive_loss``).  As with fairseq's own adaptive-softmax models, ``--temperature``
   in generation scales these hidden states, not logits.
8. *Presets* apply to options not given on the command line (``--arch transformer_xl_lm_wt103_base --mem-len
   300`` keeps 300).  fairseq does not apply arch presets to hydra configs of dataclass models, so the YAMLs
   name the model ``transformer_xl_lm`` and spell out every value.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch import nn

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import FairseqDropout
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.models import (FairseqIncrementalDecoder, FairseqLanguageModel, register_model,
                            register_model_architecture)

from ..modules.projected_adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from ..modules.relative_multihead_attention import (RelativeSinusoid, TransformerXLLayer,
                                                     attention_mask, hidden_key_columns)
from ..tasks.bptt_lm import StreamMemoryModel
from ..tasks.kinds import check_task_kind

logger = logging.getLogger(__name__)

TIE_PROJS = ChoiceEnum(["none", "all_but_first", "all"])


@dataclass
class TransformerXLConfig(FairseqDataclass):
    n_layer: int = field(default=16, metadata={"help": "number of layers"})
    d_model: int = field(default=410, metadata={"help": "model dimension"})
    n_head: int = field(default=10, metadata={"help": "number of attention heads"})
    d_head: int = field(default=41, metadata={"help": "dimension of each head"})
    d_inner: int = field(default=2100, metadata={"help": "feed-forward inner dimension"})
    d_embed: int = field(default=-1, metadata={"help": "embedding dimension (-1: d_model)"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings, R, sub-layer outputs, FFN"})
    dropatt: float = field(default=0.0, metadata={"help": "dropout on attention probabilities"})
    mem_len: int = field(default=150, metadata={"help": "memory length M (states kept per layer; 0 = none)"})
    clamp_len: int = field(default=-1, metadata={"help": "clamp relative distances above this (-1: no clamp)"})
    same_length: bool = field(default=False, metadata={"help": "every query attends to the same number "
                                                                "(mem_len) of keys (reference evaluation setting)"})
    pre_lnorm: bool = field(default=False, metadata={"help": "pre-norm instead of the reference's post-norm"})
    untie_r: bool = field(default=False, metadata={"help": "per-layer u/v biases instead of shared ones"})
    cutoffs: List[int] = field(default_factory=list, metadata={
        "help": "adaptive input/softmax cutoffs (empty: full softmax); cutoffs >= vocabulary size are dropped"})
    div_val: int = field(default=1, metadata={"help": "cluster i has dimension d_embed // div_val**i"})
    tie_weight: bool = field(default=True, metadata={"help": "tie adaptive softmax and input word vectors"})
    tie_projs: TIE_PROJS = field(default="all_but_first", metadata={
        "help": "which softmax projections are tied to the input projections (reference WT103: all_but_first)"})
    init_std: float = field(default=0.02, metadata={"help": "std of the normal init of weights"})
    proj_init_std: float = field(default=0.01, metadata={"help": "std of the normal init of projections"})
    layer_norm_eps: float = field(default=1e-5, metadata={"help": "LayerNorm epsilon"})
    checkpoint_activations: bool = field(default=False, metadata={
        "help": "recompute each layer's activations in the backward pass instead of storing them"})
    max_target_positions: int = field(default=100000, metadata={
        "help": "longest sequence generation may produce (the memory makes the model length-free)"})


@register_model("transformer_xl_lm", dataclass=TransformerXLConfig)
class TransformerXLLanguageModel(StreamMemoryModel, FairseqLanguageModel):
    """Transformer-XL LM; see the module docstring for the memory protocol."""

    @classmethod
    def build_model(cls, cfg, task):
        check_task_kind("lm", cfg, task)
        dictionary = task.target_dictionary
        for name in ("mem_len", "n_layer", "d_model", "n_head", "d_head", "d_inner"):
            value = getattr(cfg, name)
            if value < 0 or (value == 0 and name != "mem_len"):
                raise ValueError(f"--{name.replace('_', '-')} must be {'>= 0' if name == 'mem_len' else '> 0'}, "
                                 f"got {value}")
        data = getattr(getattr(task, "cfg", None), "data", None)
        dict_path = os.path.join(str(data).split(os.pathsep)[0], "dict.txt") if data else "the task's dictionary"
        return cls(TransformerXLDecoder(cfg, dictionary, dict_path=dict_path))

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        saved = state_dict.get("decoder.vocab_size")
        if saved is not None and int(saved) != len(self.decoder.dictionary):
            raise ValueError(
                f"dictionary mismatch: the checkpoint was trained with a vocabulary of {int(saved)} symbols, "
                f"but {self.decoder.dict_path} has {len(self.decoder.dictionary)}; use the dictionary the "
                f"model was trained with")
        self.decoder.drop_caches()
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def get_target_nll(self, net_output, target):
        """Negative log-likelihood (float32) of ``target`` without the full-vocabulary log-probs
        (the training loss of ``--criterion projected_adaptive_loss``)."""
        return self.decoder.softmax.nll(net_output[0], target)


class TransformerXLDecoder(FairseqIncrementalDecoder):
    """``MemTransformerLM`` as a fairseq incremental decoder (batch-first)."""

    def __init__(self, cfg, dictionary, dict_path="dict.txt"):
        super().__init__(dictionary)
        self.cfg = cfg
        self.dict_path = dict_path
        n_token = len(dictionary)
        d_embed = cfg.d_embed if cfg.d_embed > 0 else cfg.d_model
        cutoffs = [c for c in cfg.cutoffs if c < n_token]
        if len(cutoffs) != len(cfg.cutoffs):
            logger.warning(f"--cutoffs {list(cfg.cutoffs)}: dropped the cutoffs >= vocabulary size {n_token}")
        self.mem_len, self.clamp_len, self.same_length = cfg.mem_len, cfg.clamp_len, cfg.same_length
        self.register_buffer("vocab_size", torch.tensor(n_token))

        self.embed = AdaptiveEmbedding(n_token, d_embed, cfg.d_model, cutoffs, cfg.div_val)
        n_bands = len(cutoffs) + 1
        tie_projs = {"none": [False] * n_bands, "all_but_first": [False] + [True] * (n_bands - 1),
                     "all": [True] * n_bands}[str(cfg.tie_projs)]
        self.softmax = ProjectedAdaptiveLogSoftmax(n_token, d_embed, cfg.d_model, cutoffs, cfg.div_val,
                                                   embedding=self.embed, tie_weight=cfg.tie_weight,
                                                   tie_projs=tie_projs)
        self.pos = RelativeSinusoid(cfg.d_model)
        self.dropout = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)
        if not cfg.untie_r:  # u, v shared by all layers (the PyTorch reference)
            self.r_w_bias = nn.Parameter(torch.zeros(cfg.n_head, cfg.d_head))
            self.r_r_bias = nn.Parameter(torch.zeros(cfg.n_head, cfg.d_head))
        else:
            self.r_w_bias = self.r_r_bias = None
        self.layers = nn.ModuleList([
            TransformerXLLayer(cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner, cfg.dropout, cfg.dropatt,
                               cfg.pre_lnorm, cfg.layer_norm_eps, own_biases=cfg.untie_r)
            for _ in range(cfg.n_layer)
        ])
        if cfg.checkpoint_activations:
            for layer in self.layers:
                checkpoint_wrapper(layer)
        self._stream_mems: Dict[str, Optional[List[torch.Tensor]]] = {}
        self.reset_parameters()

    def reset_parameters(self):
        """The reference initialisation (``weights_init`` in ``train.py``)."""
        std, proj_std = self.cfg.init_std, self.cfg.proj_init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, 1.0, std)
                nn.init.zeros_(module.bias)
        for p in list(self.embed.emb_projs) + list(self.softmax.out_projs):
            nn.init.normal_(p, 0.0, proj_std)
        if self.softmax.n_clusters > 0:
            nn.init.normal_(self.softmax.cluster_weight, 0.0, std)
            nn.init.zeros_(self.softmax.cluster_bias)
        for name, p in self.named_parameters():
            if name.endswith("r_w_bias") or name.endswith("r_r_bias"):
                nn.init.normal_(p, 0.0, std)
        if self.cfg.tie_weight:  # the tied output layers were re-initialised after the embeddings
            for emb in self.embed.emb_layers:
                nn.init.normal_(emb.weight, 0.0, std)

    # ------------------------------------------------------------------ memory
    def reset_memory(self, slot=None):
        """Forgets the stream memory of ``slot`` ("train" or "eval"), or of both (``None``)."""
        if slot is None:
            self._stream_mems = {}
        else:
            self._stream_mems.pop(slot, None)

    def update_memory(self, hids, mems):
        """``_update_mems``: keep the last ``mem_len`` inputs of every layer, detached."""
        if self.mem_len <= 0:
            return None
        with torch.no_grad():
            out = []
            for i, h in enumerate(hids):
                cat = h if mems is None else torch.cat([mems[i], h], dim=1)
                out.append(cat[:, -self.mem_len:].detach())
        return out

    def _caching(self):
        return not self.training and not torch.is_grad_enabled() and self.mem_len > 0

    def drop_caches(self):
        """Drops the evaluation caches (the memory's key/values and ``W_kR R``, computed with the
        weights of their pass); the memory itself stays."""
        for state in getattr(self, "_stream_mems", {}).values():
            if state is not None:
                state["cache"] = None

    def train(self, mode=True):
        self.drop_caches()  # fairseq's trainer calls train() before every update
        return super().train(mode)

    def _stream_memory(self, stream_pos, bsz):
        slot = "train" if self.training else "eval"
        if stream_pos == 0:
            self._stream_mems[slot] = None
        state = self._stream_mems.get(slot)
        if state is None or state["mems"][0].size(0) != bsz:
            if stream_pos != 0 and slot == "train" and self.mem_len > 0:
                logger.warning(f"transformer_xl_lm: no training memory for stream position {stream_pos}; this "
                               f"segment is read without memory")
            return slot, None, None  # a new (or a different set of) streams: start afresh
        if state["next_pos"] != stream_pos:
            logger.warning(f"transformer_xl_lm: the {slot} memory continues stream position {state['next_pos']}, "
                           f"not {stream_pos}; this segment is read without memory")
            return slot, None, None
        return slot, state["mems"], state["cache"] if self._caching() else None

    def memory_state(self, slot="train"):
        """The stream memory of ``slot`` as ``{"next_pos", "mems"}`` (CPU tensors), or ``None``: what a
        checkpoint keeps so that training resumed mid-epoch continues its streams exactly."""
        state = self._stream_mems.get(slot)
        if state is None:
            return None
        return {"next_pos": state["next_pos"], "mems": [m.detach().cpu() for m in state["mems"]]}

    def load_memory_state(self, saved, slot="train"):
        """Restores a :meth:`memory_state` (on the model's device; evaluation caches are recomputed)."""
        if saved is None:
            self._stream_mems.pop(slot, None)
            return
        device = next(self.parameters()).device
        self._stream_mems[slot] = {"mems": [m.to(device) for m in saved["mems"]], "cache": None,
                                   "next_pos": int(saved["next_pos"])}

    # ----------------------------------------------------------------- forward
    def forward(self, src_tokens, src_lengths=None, incremental_state=None, encoder_out=None,
                stream_pos=None, features_only=False, mems=None, **kwargs):
        """Returns ``(hidden (B, T, C), {"mems": new memory, "attn": [None]})``.

        ``net_output[0]`` are the final hidden states: the adaptive softmax
        turns them into log-probabilities in :meth:`get_normalized_probs`.
        ``mems`` may be given explicitly (a list of (B, M, C) tensors)."""
        slot, cache = None, None
        if incremental_state is not None:
            mems = self.get_incremental_state(incremental_state, "mems")
            cache = self.get_incremental_state(incremental_state, "cache") if self._caching() else None
            src_tokens = src_tokens[:, -1:]
        elif stream_pos is not None:
            slot, mems, cache = self._stream_memory(stream_pos, src_tokens.size(0))
        if not self._caching():
            self.drop_caches()  # a forward that may precede an update: no cache outlives it
        hidden, new_mems, new_cache = self.extract_features(src_tokens, mems, cache)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "mems", new_mems)
            self.set_incremental_state(incremental_state, "cache", new_cache)
        elif slot is not None and new_mems is not None:
            self._stream_mems[slot] = {"mems": new_mems, "cache": new_cache, "next_pos": stream_pos + 1}
        return hidden, {"mems": new_mems, "attn": [None]}

    def extract_features(self, tokens, mems=None, cache=None):
        """``MemTransformerLM._forward`` + ``_update_mems`` for one segment.

        ``cache``: per layer, the key/value projections of ``mems`` and ``W_kR R`` from the
        previous segment of the same evaluation pass (same results, without recomputing them).
        Returns the last hidden states, the new memory and (when caching) the new cache."""
        if mems is not None and len(mems) == 0:
            mems = None
        bsz, qlen = tokens.shape
        mlen = mems[0].size(1) if mems is not None else 0
        klen = mlen + qlen
        emb = self.embed(tokens)
        mask = attention_mask(qlen, mlen, self.mem_len, self.same_length, device=tokens.device)
        mask_columns = hidden_key_columns(qlen, mlen, self.mem_len, self.same_length)
        r = self.dropout(self.pos(klen, self.clamp_len, dtype=emb.dtype, device=tokens.device))
        h = self.dropout(emb)
        hids, new_cache = [], []
        for i, layer in enumerate(self.layers):
            hids.append(h)
            kv_i, r_k_i = (None, None) if cache is None else cache[i]
            h, kv_i, r_k_i = layer(h, r, mask, None if mems is None else mems[i], self.r_w_bias, self.r_r_bias,
                                   kv_i, r_k_i, mask_columns)
            new_cache.append((kv_i[:, -self.mem_len:], r_k_i) if kv_i is not None else None)
        h = self.dropout(h)
        return h, self.update_memory(hids, mems), new_cache if self._caching() else None

    def output_layer(self, features, **kwargs):
        return features

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        lprobs = self.softmax.log_prob(net_output[0])
        return lprobs if log_probs else lprobs.exp()

    def max_positions(self):
        return self.cfg.max_target_positions

    def reorder_incremental_state(self, incremental_state, new_order):
        mems = self.get_incremental_state(incremental_state, "mems")
        if mems is not None:
            self.set_incremental_state(incremental_state, "mems", [m.index_select(0, new_order) for m in mems])
        cache = self.get_incremental_state(incremental_state, "cache")
        if cache is not None:  # W_kR R does not depend on the batch
            self.set_incremental_state(incremental_state, "cache",
                                       [(kv.index_select(0, new_order), r_k) for kv, r_k in cache])


def _preset(name, **values):
    """Registers a preset: its values apply to every option not given on the command line."""

    def arch(cfg):
        for key, value in values.items():
            if getattr(cfg, key, None) is None:
                setattr(cfg, key, value)

    register_model_architecture("transformer_xl_lm", name)(arch)


# (the plain ``transformer_xl_lm`` arch uses the dataclass defaults: the WT103 base model)
# PyTorch reference run_wt103_base.sh: 16L, 410, 10x41, 2100, adaptive [20k,40k,200k], div_val 1
_preset("transformer_xl_lm_wt103_base", n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100,
        dropout=0.1, dropatt=0.0, mem_len=150, cutoffs=[20000, 40000, 200000], div_val=1)
# run_wt103_large.sh / tf sota: 18L, 1024, 16x64, 4096, div_val 4, untie_r, proj_share_all_but_first
_preset("transformer_xl_lm_wt103_large", n_layer=18, d_model=1024, n_head=16, d_head=64, d_inner=4096,
        dropout=0.2, dropatt=0.2, mem_len=384, cutoffs=[20000, 40000, 200000], div_val=4, untie_r=True)
# run_enwik8_base.sh: 12L, 512, 8x64, 2048, character level (full softmax)
_preset("transformer_xl_lm_enwik8_base", n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048,
        dropout=0.1, dropatt=0.0, mem_len=512, cutoffs=[])
# run_enwik8_large.sh: 24L, 1024, 8x128, 3072
_preset("transformer_xl_lm_enwik8_large", n_layer=24, d_model=1024, n_head=8, d_head=128, d_inner=3072,
        dropout=0.15, dropatt=0.15, mem_len=768, cutoffs=[])
# a small PTB-sized model (the benchmark's calibration setting: 4L, 256, 4x64, 1024, memory 70)
_preset("transformer_xl_lm_ptb_small", n_layer=4, d_model=256, n_head=4, d_head=64, d_inner=1024,
        dropout=0.3, dropatt=0.0, mem_len=70, cutoffs=[])


def state_dict_from_hf(hf_state: Dict[str, torch.Tensor], decoder: TransformerXLDecoder) -> Dict[str, torch.Tensor]:
    """Maps a HuggingFace ``TransfoXLLMHeadModel`` state dict onto ``decoder``'s parameters.

    The parameters correspond one to one (the reference parameterisation);
    only the order of the softmax cluster rows differs (see
    :func:`user_dir.modules.projected_adaptive.hf_cluster_rows`).  Returns a
    state dict for ``TransformerXLLanguageModel.load_state_dict``.
    """
    from ..modules.projected_adaptive import hf_cluster_rows

    renames = [("transformer.word_emb.", "decoder.embed."), ("transformer.layers.", "decoder.layers."),
               (".dec_attn.", ".attn."), (".pos_ff.CoreNet.0.", ".ff.fc1."), (".pos_ff.CoreNet.3.", ".ff.fc2."),
               (".pos_ff.layer_norm.", ".ff.layer_norm."), ("transformer.r_", "decoder.r_")]
    out = {"decoder.vocab_size": decoder.vocab_size.clone()}
    for key, value in hf_state.items():
        if key.endswith("pos_emb.inv_freq") or value is None:
            continue
        if key.startswith("crit.") or (key.endswith(("dec_attn.r_w_bias", "dec_attn.r_r_bias")) and decoder.r_w_bias is not None):
            continue  # softmax below; shared u/v appear once more under every layer
        for old, new in renames:
            key = key.replace(old, new)
        out[key] = value
    sm = decoder.softmax
    if sm.n_clusters > 0:
        out["decoder.softmax.cluster_weight"] = hf_cluster_rows(hf_state["crit.cluster_weight"])
        out["decoder.softmax.cluster_bias"] = hf_cluster_rows(hf_state["crit.cluster_bias"])
    for i, layer in enumerate(sm.out_layers):
        out[f"decoder.softmax.out_layers.{i}.bias"] = hf_state[f"crit.out_layers.{i}.bias"]
        out[f"decoder.softmax.out_layers.{i}.weight"] = hf_state[f"crit.out_layers.{i}.weight"]
    for i, src in enumerate(sm._proj_source):
        if src is not None and src[0] == "own":
            out[f"decoder.softmax.out_projs.{src[1]}"] = hf_state[f"crit.out_projs.{i}"]
    return out
