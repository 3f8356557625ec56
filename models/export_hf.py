#!/usr/bin/env python3
"""Exports the Hugging Face corpus: tiny random-weight models of `transformers` families (BERT, RoBERTa, DistilBERT,
GPT-2, Llama, Qwen2, ...) with torch's TorchScript exporter (opset 17) and its dynamo exporter (opset 18), each with
the PyTorch references the C++ side is checked against (tests/conformance/zoo_test.py, same layout as
models/export_zoo.py's corpus, so CI runs without torch).

Needs a newer torch and transformers than Debian's, in a virtual environment outside the repository (CPU is enough):
  python3 -m venv VENV && VENV/bin/pip install torch transformers onnx onnxscript onnxruntime
  VENV/bin/python models/export_hf.py                        # every variant into models/hf/
  VENV/bin/python models/export_hf.py --only llama_dynamo18_dyn --out /tmp/hf

Each variant goes to OUT/<name>/ (default OUT: models/hf), as export_zoo.py writes its corpus:
  model.onnx   the export (tiny configs: a few hundred KiB at most)
  zoo.json     family, exporter, opset, attention implementation, inputs, the loss, the initializers to freeze
               (buffers and exporter constants), the forward and training references
  forward/     inputs/<name>.npy and logits.npy: float64 PyTorch logits at another batch/sequence than the traced one
               when the axes are dynamic
  train/       <input>.npy per graph input + labels.npy; zoo.json holds the per-step losses of SGD (momentum) and
               AdamW in float64 and float32 (dropout is 0 in every config), step k on rows [k*B, (k+1)*B)
Inputs are right-padded: attention_mask is 1 then 0 per row, the padded positions hold the pad token, and language
models' labels ignore them. A variant that a torch/transformers cannot export is reported and skipped; --strict makes
that an error.
"""
import argparse
import contextlib
import copy
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_zoo import (IGNORE_INDEX, OPTIMIZERS, freeze_list, runs_in_onnxruntime,  # noqa: E402
                        save_npys, strip_machine_paths)

FORMAT = "onnxpipe-zoo/1"
VOCAB, D, HEADS, KV_HEADS, FFN, LAYERS, SEQ, CLASSES, MAX_POS = 40, 16, 4, 2, 32, 2, 12, 3, 32
IMAGE, PATCH = 8, 4  # vision families: 8 x 8 RGB images in 4 x 4 patches
PAD = 1  # the pad token of every family (RoBERTa's position ids count from it)
TRAIN_BATCH = 4


# Decoder families built like Llama from one config (sizes above) plus what sets each apart.
LLAMA_LIKE = {
    # squared-ReLU MLP without a gate, LayerNorm scaled by 1 + weight, rotary on half of each head
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(partial_rotary_factor=0.5)),
    # LayerNorm without parameters, queries, keys and values clipped to [-c, c]
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(clip_qkv=0.3)),
    # gate and up in one projection, interleaved rotary on half of each head, biased Q/K/V
    "glm": ("GlmConfig", "GlmForCausalLM", dict(partial_rotary_factor=0.5)),
    # squared-ReLU MLP without a gate
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {}),
    # every other layer without rotary (NoPE)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layer_interval=2)),
    # RMSNorm after attention and MLP, on queries and keys, a sliding window on some layers
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(sliding_window=4, sliding_window_pattern=2)),
    # RMSNorm, SwiGLU, rotary: Kyutai's Helium
    "helium": ("HeliumConfig", "HeliumForCausalLM", {}),
    # Llama 3.1's rope scaling: the inverse frequencies rescaled by wavelength band at export time
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM",
                    dict(rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=16))),
    # Phi-3's LongRoPE: per-frequency factors (the long ones beyond the original context) and a cos/sin scale
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM",
                      dict(original_max_position_embeddings=8,
                           rope_scaling=dict(type="longrope", short_factor=[1.0, 1.5], long_factor=[2.0, 3.0]))),
    # RMSNorm on queries and keys after the projections
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {}),
    # biased Q/K/V and an attention output bias, residual dropout (off here)
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", dict(residual_dropout=0.0)),
    # Baidu's ERNIE 4.5 dense decoder: interleaved rotary
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {}),
    # GLM-4: gate and up in one projection, RMSNorm after attention and after the MLP, partial interleaved rotary
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {}),
    # the xIELU activation (trainable alphas through softplus and expm1), no gate; QK RMSNorm
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {}),
    # squared ReLU, LayerNorm on queries and keys, partial rotary (Adept's Persimmon)
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", dict(partial_rotary_factor=0.5)),
}


def family_model(family, attn):
    """(module, input names, is_lm) of a tiny random `transformers` model of `family`."""
    import transformers as tr

    common = dict(vocab_size=VOCAB, pad_token_id=PAD, attn_implementation=attn)
    if family == "bert":
        cfg = tr.BertConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                            intermediate_size=FFN, max_position_embeddings=MAX_POS, num_labels=CLASSES,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
        return tr.BertForSequenceClassification(cfg), ["input_ids", "attention_mask", "token_type_ids"], False
    if family == "roberta":
        cfg = tr.RobertaConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                               intermediate_size=FFN, max_position_embeddings=MAX_POS, num_labels=CLASSES,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
        return tr.RobertaForSequenceClassification(cfg), ["input_ids", "attention_mask"], False
    if family == "distilbert":
        cfg = tr.DistilBertConfig(dim=D, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN,
                                  max_position_embeddings=MAX_POS, num_labels=CLASSES, dropout=0.0,
                                  attention_dropout=0.0, seq_classif_dropout=0.0, **common)
        return tr.DistilBertForSequenceClassification(cfg), ["input_ids", "attention_mask"], False
    if family in ("gpt2", "gpt2cls"):
        cfg = tr.GPT2Config(n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=FFN, n_positions=MAX_POS,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                            bos_token_id=0, eos_token_id=0, num_labels=CLASSES, **common)
        if family == "gpt2cls":  # pools the logits at each row's last non-pad token (an index op on floats)
            return tr.GPT2ForSequenceClassification(cfg), ["input_ids", "attention_mask"], False
        return tr.GPT2LMHeadModel(cfg), ["input_ids", "attention_mask"], True
    if family in ("llama", "qwen2", "mistral"):
        config_cls, model_cls = {"llama": (tr.LlamaConfig, tr.LlamaForCausalLM),
                                 "qwen2": (tr.Qwen2Config, tr.Qwen2ForCausalLM),
                                 "mistral": (tr.MistralConfig, tr.MistralForCausalLM)}[family]
        cfg = config_cls(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POS, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=0, **common)
        return model_cls(cfg), ["input_ids", "attention_mask"], True
    if family == "bart":
        cfg = tr.BartConfig(d_model=D, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
                            decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                            max_position_embeddings=MAX_POS, dropout=0.0, attention_dropout=0.0,
                            activation_dropout=0.0, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                            forced_eos_token_id=None, **common)
        return tr.BartForConditionalGeneration(cfg), ["input_ids", "attention_mask", "decoder_input_ids"], True
    if family == "t5":
        cfg = tr.T5Config(d_model=D, d_kv=D // HEADS, d_ff=FFN, num_layers=1, num_decoder_layers=1, num_heads=HEADS,
                          relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                          feed_forward_proj="relu", eos_token_id=2, decoder_start_token_id=0, **common)
        return tr.T5ForConditionalGeneration(cfg), ["input_ids", "attention_mask", "decoder_input_ids"], True
    if family == "longt5":  # T5 whose encoder attends within blocks of 3 (local_radius 2): the sequence padded to a
        # multiple of the block at run time, block scores through an Einsum with an ellipsis
        cfg = tr.LongT5Config(d_model=D, d_kv=D // HEADS, d_ff=FFN, num_layers=1, num_decoder_layers=1, num_heads=HEADS,
                              local_radius=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                              dropout_rate=0.0, eos_token_id=2, decoder_start_token_id=0, **common)
        return tr.LongT5ForConditionalGeneration(cfg), ["input_ids", "attention_mask", "decoder_input_ids"], True
    if family in ("albert", "electra", "xlm_roberta", "mpnet", "deberta_v2"):
        # Encoders with sequence classification heads. ALBERT factorises the embedding (E < D) and shares one
        # layer's weights across all layers; ELECTRA projects its E-wide embeddings up to D; MPNet adds T5-style
        # relative position buckets; DeBERTa-v2 uses disentangled (content-to-position) attention.
        enc = dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                   max_position_embeddings=MAX_POS, num_labels=CLASSES, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0, **common)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        if family == "albert":
            cfg = tr.AlbertConfig(embedding_size=8, classifier_dropout_prob=0.0, **enc)
            return tr.AlbertForSequenceClassification(cfg), names, False
        if family == "electra":
            cfg = tr.ElectraConfig(embedding_size=8, **enc)
            return tr.ElectraForSequenceClassification(cfg), names, False
        if family == "xlm_roberta":
            cfg = tr.XLMRobertaConfig(**enc)
            return tr.XLMRobertaForSequenceClassification(cfg), names[:2], False
        if family == "mpnet":
            cfg = tr.MPNetConfig(relative_attention_num_buckets=32, **enc)  # MPNet's bias hard-codes 32 buckets
            return tr.MPNetForSequenceClassification(cfg), names[:2], False
        cfg = tr.DebertaV2Config(relative_attention=True, position_buckets=8, max_relative_positions=MAX_POS,
                                 pos_att_type=["p2c", "c2p"], pooler_dropout=0.0, type_vocab_size=2, **enc)
        return tr.DebertaV2ForSequenceClassification(cfg), names, False
    names, lm = ["input_ids", "attention_mask"], True
    if family == "gpt_neox":  # rotary on half of each head, attention and MLP in parallel off the input
        cfg = tr.GPTNeoXConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                               intermediate_size=FFN, rotary_pct=0.5, use_parallel_residual=True,
                               max_position_embeddings=MAX_POS, attention_dropout=0.0, hidden_dropout=0.0,
                               tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, **common)
        return tr.GPTNeoXForCausalLM(cfg), names, lm
    if family == "opt":  # learned positions offset by 2, from the attention mask's cumulative sum
        cfg = tr.OPTConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, ffn_dim=FFN,
                           word_embed_proj_dim=D, max_position_embeddings=MAX_POS, dropout=0.0,
                           attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0, bos_token_id=0,
                           eos_token_id=0, **common)
        return tr.OPTForCausalLM(cfg), names, lm
    if family == "phi":  # partial rotary, one LayerNorm feeding attention and MLP in parallel, LM head with bias
        cfg = tr.PhiConfig(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                           num_key_value_heads=KV_HEADS, partial_rotary_factor=0.5, max_position_embeddings=MAX_POS,
                           resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
                           **common)
        return tr.PhiForCausalLM(cfg), names, lm
    if family in ("gemma", "qwen3", "olmo2", "stablelm"):
        # Gemma: RMSNorm scaled by 1 + weight, tanh GELU gate, embeddings times sqrt(D), tied LM head; Qwen3 and
        # OLMo2: RMSNorm on the queries and keys; StableLM: LayerNorm with partial rotary.
        config_cls, model_cls = {"gemma": (tr.GemmaConfig, tr.GemmaForCausalLM),
                                 "qwen3": (tr.Qwen3Config, tr.Qwen3ForCausalLM),
                                 "olmo2": (tr.Olmo2Config, tr.Olmo2ForCausalLM),
                                 "stablelm": (tr.StableLmConfig, tr.StableLmForCausalLM)}[family]
        extra = dict(head_dim=D // HEADS) if family in ("gemma", "qwen3") else {}
        if family == "stablelm":
            extra = dict(partial_rotary_factor=0.5, hidden_dropout=0.0)
        cfg = config_cls(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POS, attention_dropout=0.0,
                         bos_token_id=0, eos_token_id=0, **extra, **common)
        return model_cls(cfg), names, lm
    if family == "phi3":  # Q, K and V in one projection, gate and up in one (split in halves), partial rotary
        cfg = tr.Phi3Config(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                            num_key_value_heads=KV_HEADS, partial_rotary_factor=0.5, max_position_embeddings=MAX_POS,
                            original_max_position_embeddings=MAX_POS, resid_pdrop=0.0, embd_pdrop=0.0,
                            attention_dropout=0.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                            **common)
        return tr.Phi3ForCausalLM(cfg), names, lm
    if family == "gemma2":  # tanh soft-capped scores and logits, a sliding window on every other layer, 4 norms
        cfg = tr.Gemma2Config(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                              num_key_value_heads=KV_HEADS, head_dim=D // HEADS, query_pre_attn_scalar=D // HEADS,
                              sliding_window=4, attn_logit_softcapping=20.0, final_logit_softcapping=10.0,
                              max_position_embeddings=MAX_POS, attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
                              **common)
        return tr.Gemma2ForCausalLM(cfg), names, lm
    if family == "granite":  # Llama with scaled embeddings, residual branches, attention scores and logits
        cfg = tr.GraniteConfig(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                               num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POS, embedding_multiplier=3.0,
                               residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0,
                               tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, **common)
        return tr.GraniteForCausalLM(cfg), names, lm
    if family == "starcoder2":  # LayerNorm, biased projections, tanh-GELU MLP, GQA with a sliding window, rotary
        cfg = tr.Starcoder2Config(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, sliding_window=4,
                                  max_position_embeddings=MAX_POS, residual_dropout=0.0, embedding_dropout=0.0,
                                  attention_dropout=0.0, bos_token_id=0, eos_token_id=0, **common)
        return tr.Starcoder2ForCausalLM(cfg), names, lm
    if family == "gemma3":  # Gemma 2's layout with RMSNorm on the queries and keys, local and global rotary bases
        cfg = tr.Gemma3TextConfig(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=D // HEADS,
                                  query_pre_attn_scalar=D // HEADS, sliding_window=4, max_position_embeddings=MAX_POS,
                                  attention_dropout=0.0, bos_token_id=0, eos_token_id=0, **common)
        return tr.Gemma3ForCausalLM(cfg), names, lm
    if family == "cohere":  # parallel attention and MLP after one bias-free LayerNorm, interleaved rotary, scaled logits
        cfg = tr.CohereConfig(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                              num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POS, logit_scale=0.5,
                              attention_dropout=0.0, bos_token_id=0, eos_token_id=0, **common)
        return tr.CohereForCausalLM(cfg), names, lm
    if family in LLAMA_LIKE:
        config_cls, model_cls, extra = LLAMA_LIKE[family]
        cfg = getattr(tr, config_cls)(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=D // HEADS,
                                      max_position_embeddings=MAX_POS, attention_dropout=0.0, bos_token_id=0,
                                      eos_token_id=0, **extra, **common)
        return getattr(tr, model_cls)(cfg), names, lm
    if family == "modernbert":  # rotary, GeGLU, bias-free LayerNorm, local (windowed) attention on every other layer
        cfg = tr.ModernBertConfig(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, max_position_embeddings=MAX_POS, local_attention=4,
                                  global_attn_every_n_layers=2, num_labels=CLASSES, classifier_pooling="mean",
                                  embedding_dropout=0.0, mlp_dropout=0.0, attention_dropout=0.0, bos_token_id=0,
                                  eos_token_id=0, cls_token_id=0, sep_token_id=0, **common)
        return tr.ModernBertForSequenceClassification(cfg), ["input_ids", "attention_mask"], False
    if family == "mpt":  # ALiBi on every head, sliced by max(0, 1 - S); bias-free LayerNorm; no position table
        cfg = tr.MptConfig(d_model=D, n_heads=HEADS, n_layers=LAYERS, expansion_ratio=2, max_seq_len=MAX_POS,
                           **common)
        return tr.MptForCausalLM(cfg), ["input_ids", "attention_mask"], True
    if family == "ctrl":  # fixed sinusoidal positions added to sqrt(d)-scaled embeddings, pre-LN, untied biased head
        cfg = tr.CTRLConfig(n_positions=MAX_POS, n_embd=D, dff=FFN, n_layer=LAYERS, n_head=HEADS, resid_pdrop=0.0,
                            embd_pdrop=0.0, **common)
        return tr.CTRLLMHeadModel(cfg), ["input_ids", "attention_mask"], True
    if family in ("roformer", "esm", "rembert"):
        # Encoders: RoFormer (interleaved sinusoidal rotary on Q and K), ESM-2 (rotary, pre-LN, no token types),
        # RemBERT (embeddings narrower than the layers, untied wide output embeddings)
        enc = dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                   max_position_embeddings=MAX_POS, num_labels=CLASSES, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0, **common)
        if family == "roformer":
            cfg = tr.RoFormerConfig(embedding_size=D, **enc)
            return tr.RoFormerForSequenceClassification(cfg), ["input_ids", "attention_mask", "token_type_ids"], False
        if family == "esm":
            cfg = tr.EsmConfig(position_embedding_type="rotary", mask_token_id=3, **enc)
            return tr.EsmForSequenceClassification(cfg), ["input_ids", "attention_mask"], False
        cfg = tr.RemBertConfig(input_embedding_size=8, output_embedding_size=8, classifier_dropout_prob=0.0, **enc)
        return tr.RemBertForSequenceClassification(cfg), ["input_ids", "attention_mask", "token_type_ids"], False
    if family in ("vit", "deit", "dinov2", "siglip"):
        # Vision transformers classifying 8 x 8 images: the patch embedding is a Conv with strides equal to its
        # kernel. DeiT adds a distillation token, DINOv2 layer scale, SigLIP mean pooling without a class token.
        vis = dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                   image_size=IMAGE, patch_size=PATCH, num_channels=3, num_labels=CLASSES, attn_implementation=attn)
        drop = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        if family == "vit":
            return tr.ViTForImageClassification(tr.ViTConfig(**vis, **drop)), ["pixel_values"], False
        if family == "deit":
            return tr.DeiTForImageClassification(tr.DeiTConfig(**vis, **drop)), ["pixel_values"], False
        if family == "dinov2":
            cfg = tr.Dinov2Config(layerscale_value=0.1, drop_path_rate=0.0, **vis, **drop)
            return tr.Dinov2ForImageClassification(cfg), ["pixel_values"], False
        cfg = tr.SiglipConfig(vision_config=dict(vis, attention_dropout=0.0), text_config=dict(vocab_size=VOCAB),
                              num_labels=CLASSES)
        return tr.SiglipForImageClassification(cfg), ["pixel_values"], False
    if family == "mobilebert":  # bottlenecked BERT: NoNorm (an elementwise scale and shift), stacked FFNs, trigram
        # embeddings (the token embeddings of each position's neighbours, shifted in by padding, concatenated)
        cfg = tr.MobileBertConfig(hidden_size=D, embedding_size=8, intra_bottleneck_size=8, true_hidden_size=8,
                                  num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                                  num_feedforward_networks=2, max_position_embeddings=MAX_POS, num_labels=CLASSES,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  classifier_dropout=0.0, **common)
        return tr.MobileBertForSequenceClassification(cfg), ["input_ids", "attention_mask", "token_type_ids"], False
    if family == "ernie":  # BERT with task-type embeddings left out
        cfg = tr.ErnieConfig(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                             max_position_embeddings=MAX_POS, num_labels=CLASSES, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, **common)
        return tr.ErnieForSequenceClassification(cfg), ["input_ids", "attention_mask"], False
    if family == "biogpt":  # learned positions from the mask's cumulative sum, scaled embeddings, pre-LN
        cfg = tr.BioGptConfig(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                              max_position_embeddings=MAX_POS, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, layerdrop=0.0, **common)
        return tr.BioGptForCausalLM(cfg), names, lm
    if family == "codegen":  # GPT-J's interleaved partial rotary with Q, K and V from one projection in 4 groups
        cfg = tr.CodeGenConfig(n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=FFN, rotary_dim=2, n_positions=MAX_POS,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                               tie_word_embeddings=False, **common)
        return tr.CodeGenForCausalLM(cfg), names, lm
    if family == "bloom":  # ALiBi position biases, LayerNorm after the embedding, tied LM head
        cfg = tr.BloomConfig(hidden_size=D, n_layer=LAYERS, n_head=HEADS, hidden_dropout=0.0, attention_dropout=0.0,
                             bos_token_id=0, eos_token_id=0, **common)
        return tr.BloomForCausalLM(cfg), names, lm
    if family == "falcon":  # multi-query attention, parallel attention and MLP, rotary
        cfg = tr.FalconConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                              max_position_embeddings=MAX_POS, hidden_dropout=0.0, attention_dropout=0.0,
                              bos_token_id=0, eos_token_id=0, **common)
        return tr.FalconForCausalLM(cfg), names, lm
    if family == "gptj":  # interleaved (rotate-every-two) rotary on half of each head, parallel residual
        cfg = tr.GPTJConfig(n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=FFN, rotary_dim=2, n_positions=MAX_POS,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                            tie_word_embeddings=False, **common)
        return tr.GPTJForCausalLM(cfg), names, lm
    if family == "gpt_neo":  # alternating global and local (windowed) causal attention, unscaled scores
        cfg = tr.GPTNeoConfig(hidden_size=D, num_layers=LAYERS, num_heads=HEADS, intermediate_size=FFN,
                              attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=MAX_POS,
                              resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0, bos_token_id=0,
                              eos_token_id=0, **common)
        return tr.GPTNeoForCausalLM(cfg), names, lm
    if family == "gpt_bigcode":  # multi-query attention (one K/V head), GPT-2 layout with Linear layers
        cfg = tr.GPTBigCodeConfig(n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=FFN, n_positions=MAX_POS,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, multi_query=True,
                                  bos_token_id=0, eos_token_id=0, **common)
        return tr.GPTBigCodeForCausalLM(cfg), names, lm
    raise ValueError(f"unknown family {family!r}")


class LogitsOnly(torch.nn.Module):
    """The model with positional inputs and the logits as its only output (what an exporter and a trainer see)."""

    def __init__(self, model, names, is_lm):
        super().__init__()
        self.m, self.names, self.is_lm = model, names, is_lm

    def forward(self, *inputs):
        kw = dict(zip(self.names, inputs))
        if self.is_lm:
            kw["use_cache"] = False
        return self.m(**kw).logits


# transformers computes some parts of a model in float32 whatever the model's dtype: the rotary cos/sin caches,
# RMSNorm's normalisation (T5's too) and eager attention's softmax. That would leave ~1e-7 relative errors in a float64
# reference, while a float64 trainer computes everything in float64; so the float64 references run under
# softmax_in_working_precision, where those upcasts keep float64 tensors in float64 and each family's own code runs
# unchanged (Llama's and Cohere's rotary layouts, RMSNorm, Gemma's 1 + weight, Cohere's LayerNorm alike). float32
# runs are unchanged: the same arithmetic.
@contextlib.contextmanager
def softmax_in_working_precision():
    """Softmax, and the casts to float32 that some attention code makes (GPT-Neo's and GPT-J's eager attention
    `query.to(torch.float32)`, Gemma's `x.float()`), keep float64 tensors in float64."""
    softmax, to, to_float = F.softmax, torch.Tensor.to, torch.Tensor.float

    def patched(x, *args, dtype=None, **kw):
        return softmax(x, *args, dtype=None if dtype == torch.float32 and x.dtype == torch.float64 else dtype, **kw)

    def patched_to(self, *args, **kw):
        out = to(self, *args, **kw)
        return self if self.dtype == torch.float64 and out.dtype == torch.float32 else out

    def patched_float(self, *args, **kw):
        return self if self.dtype == torch.float64 else to_float(self, *args, **kw)

    F.softmax, torch.Tensor.to, torch.Tensor.float = patched, patched_to, patched_float
    try:
        yield
    finally:
        F.softmax, torch.Tensor.to, torch.Tensor.float = softmax, to, to_float


def at_dtype(base, dtype):
    """A copy of the model in `dtype` (float64: run it under softmax_in_working_precision, see above)."""
    return copy.deepcopy(base).to(dtype)


def build_model(family, attn, seed=0):
    torch.manual_seed(seed)
    model, names, is_lm = family_model(family, attn)
    # Non-trivial values everywhere (LayerNorm/RMSNorm scales 1 + noise, biases non-zero) so that the references
    # exercise every gradient; tied weights stay tied (named_parameters lists them once).
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return LogitsOnly(model.eval(), names, is_lm)


def make_inputs(names, batch, seq, rng):
    """Right-padded rows: lengths in [seq/2, seq], the padded tail holds PAD and mask 0; token types 0 then 1.
    Images (pixel_values): IMAGE x IMAGE, three channels of normal noise."""
    lengths = rng.integers(max(2, seq // 2), seq + 1, size=batch)
    lengths[0] = seq
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(2, VOCAB, size=(batch, seq), dtype=np.int64)
    ids[mask == 0] = PAD
    out = {"input_ids": ids, "attention_mask": mask}
    if "decoder_input_ids" in names:  # teacher forcing: the decoder reads other tokens of the same length
        out["decoder_input_ids"] = rng.integers(2, VOCAB, size=(batch, seq), dtype=np.int64)
    if "pixel_values" in names:
        out["pixel_values"] = rng.normal(size=(batch, 3, IMAGE, IMAGE)).astype(np.float32)
    if "token_type_ids" in names:
        out["token_type_ids"] = (np.arange(seq)[None, :] >= (lengths[:, None] // 2)).astype(np.int64) * mask
    return {n: out[n] for n in names}


def make_labels(is_lm, inputs, rng):
    if not is_lm:
        return rng.integers(0, CLASSES, size=(next(iter(inputs.values())).shape[0],), dtype=np.int64)
    ids = inputs["input_ids"]
    labels = rng.integers(0, VOCAB, size=ids.shape, dtype=np.int64)
    labels[inputs["attention_mask"] == 0] = IGNORE_INDEX
    labels[rng.random(labels.shape) < 0.2] = IGNORE_INDEX
    return labels


def loss_of(is_lm, logits, labels):
    if is_lm:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    return F.cross_entropy(logits, labels)


def variant(family, exporter, opset, attn, dynamic=True):
    kind = "ts" if exporter == "torchscript" else "dynamo"
    name = f"{family}_{kind}{opset}_{attn}_{'dyn' if dynamic else 'fixed'}"
    return dict(name=name, family=family, exporter=exporter, opset=opset, attn=attn, dynamic=dynamic)


VARIANTS = [variant(f, "torchscript", 17, "eager") for f in ("bert", "roberta", "distilbert", "gpt2", "llama",
                                                              "qwen2")]
VARIANTS += [variant(f, "dynamo", 18, "sdpa") for f in ("bert", "roberta", "distilbert", "gpt2", "llama", "qwen2")]
VARIANTS += [variant("llama", "dynamo", 18, "eager"), variant("bert", "torchscript", 17, "sdpa"),
             variant("gpt2", "dynamo", 18, "eager", dynamic=False), variant("mistral", "torchscript", 17, "eager"),
             variant("mistral", "dynamo", 18, "sdpa")]
VARIANTS += [variant(f, e, o, "eager") for f in ("bart", "t5", "longt5")
             for e, o in (("torchscript", 17), ("dynamo", 18))]
VARIANTS += [variant("gpt2cls", "torchscript", 17, "eager"), variant("gpt2cls", "dynamo", 18, "sdpa")]
# Families added by the architecture sweep: TorchScript/eager and dynamo/sdpa (eager where the family has no sdpa).
NO_SDPA = ("bloom", "mpnet", "deberta_v2", "gpt_neo", "gemma2", "roformer", "rembert", "ctrl", "mpt")
SWEEP = ("albert", "electra", "xlm_roberta", "mpnet", "deberta_v2", "gpt_neox", "opt", "phi", "gemma", "qwen3",
         "olmo2", "stablelm", "bloom", "falcon", "gptj", "gpt_neo", "gpt_bigcode", "phi3", "gemma2", "granite",
         "starcoder2", "gemma3", "cohere", *LLAMA_LIKE, "modernbert", "ernie", "biogpt", "codegen",
         "mobilebert", "mpt", "ctrl", "roformer", "esm", "rembert", "vit", "deit", "dinov2", "siglip")
# Cohere's and Helium's TorchScript exports reshape the queries by another head count at any shape but the traced
# one (onnxruntime cannot run them either), and GLM's fails in the exporter: only their dynamo exports are kept.
# Of the third sweep, ERNIE 4.5's TorchScript export has the same fault; Phi-3 LongRoPE's (aten::copy) and Apertus's
# (aten::expm1) fail in the TorchScript exporter, and GLM-4's in its Concat. DINOv2's TorchScript export always
# interpolates its position table (bicubic Resize, which onnxpipe does not import).
TS_BROKEN = ("cohere", "helium", "glm", "ernie4_5", "phi3_longrope", "apertus", "glm4", "dinov2")
VARIANTS += [variant(f, "torchscript", 17, "eager") for f in SWEEP if f not in TS_BROKEN]
VARIANTS += [variant(f, "dynamo", 18, "eager" if f in NO_SDPA else "sdpa") for f in SWEEP]
# Opset 23: the dynamo exporter writes ONNX's own Attention (sdpa) and RotaryEmbedding (transformers' rotary) ops.
VARIANTS += [variant(f, "dynamo", 23, "sdpa") for f in ("llama", "mistral", "phi3", "gpt_neox", "gptj", "bert")]


def export(model, v, args, path):
    names = model.names
    kw = dict(input_names=names, output_names=["logits"], opset_version=v["opset"])
    if v["exporter"] == "torchscript":
        axes = None
        if v["dynamic"]:
            axes = {n: {0: "batch"} if n == "pixel_values" else {0: "batch", 1: "seq"} for n in names}
            axes["logits"] = {0: "batch", 1: "seq"} if model.is_lm else {0: "batch"}
        torch.onnx.export(model, args, path, dynamo=False, dynamic_axes=axes, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING, **kw)
    else:
        shapes = None
        if v["dynamic"]:
            b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=MAX_POS - 4)
            shapes = (tuple({0: b} if n == "pixel_values" else {0: b, 1: s} for n in names),)  # one varargs tuple
        prog = torch.onnx.export(model, args, None, dynamo=True, dynamic_shapes=shapes, **kw)
        prog.save(path, external_data=False)
    import onnx

    proto = onnx.load(path)
    # The dynamo exporter's per-node metadata (stack traces naming the exporting machine's paths, module
    # hierarchies, fx node text) is three quarters of these files: dropped, but for the module path of each node
    # ("pkg.torch.onnx.name_scopes"), which onnxpipe reads as the node's layer.
    if strip_machine_paths(proto) or any(len(n.metadata_props) for n in proto.graph.node):
        for n in proto.graph.node:
            keep = [p for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
            del n.metadata_props[:]
            n.metadata_props.extend(keep)
        onnx.save_model(proto, path)
    return proto


def train_losses(base, inputs, labels, steps, opt_name, dtype, lost):
    model = at_dtype(base, dtype).train()
    for name, p in model.named_parameters():
        p.requires_grad_(name not in lost)
    params = [p for p in model.parameters() if p.requires_grad]
    h = OPTIMIZERS[opt_name]
    if opt_name == "sgd":
        opt = torch.optim.SGD(params, lr=h["lr"], momentum=h["momentum"], weight_decay=h["weight_decay"])
    else:
        opt = torch.optim.AdamW(params, lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"],
                                weight_decay=h["weight_decay"])
    losses = []
    for k in range(steps):
        rows = slice(k * TRAIN_BATCH, (k + 1) * TRAIN_BATCH)
        logits = model(*[torch.from_numpy(inputs[n][rows]) for n in model.names])
        loss = loss_of(model.is_lm, logits, torch.from_numpy(labels[rows]))
        opt.zero_grad()
        loss.backward()
        losses.append(float(loss))
        opt.step()
    return dict(optimizer=opt_name, hyperparams=h, dtype=str(dtype).replace("torch.", ""), losses=losses)


def build_variant(v, out_dir, steps):
    import onnx
    import transformers

    base = build_model(v["family"], v["attn"])
    names = base.names
    rng = np.random.default_rng(1)
    batch = 2 if v["dynamic"] else TRAIN_BATCH
    trace = make_inputs(names, batch, SEQ, rng)
    tmp = tempfile.mkdtemp(prefix=v["name"] + ".", dir=os.path.dirname(os.path.abspath(out_dir)))
    try:
        path = os.path.join(tmp, "model.onnx")
        proto = export(copy.deepcopy(base), v, tuple(torch.from_numpy(trace[n]) for n in names), path)
        fb, fs = (3, SEQ - 3) if v["dynamic"] else (batch, SEQ)
        fwd_in = make_inputs(names, fb, fs, rng)
        note = None
        if v["dynamic"] and not runs_in_onnxruntime(path, fwd_in):
            fb, fs = 3, SEQ
            fwd_in = make_inputs(names, fb, fs, rng)
            note = "onnxruntime cannot run this export at a sequence length other than the traced one"
        with torch.no_grad(), softmax_in_working_precision():
            ref = at_dtype(base, torch.float64)(*[torch.from_numpy(fwd_in[n]) for n in names]).numpy()
        save_npys(os.path.join(tmp, "forward", "inputs"), fwd_in)
        save_npys(os.path.join(tmp, "forward"), {"logits": ref})
        data = make_inputs(names, TRAIN_BATCH * steps, SEQ, rng)
        labels = make_labels(base.is_lm, data, rng)
        save_npys(os.path.join(tmp, "train"), dict(data, labels=labels))
        frozen, lost = freeze_list(proto, base)
        with softmax_in_working_precision():
            runs = [train_losses(base, data, labels, steps, o, d, lost)
                    for o in ("sgd", "adamw") for d in (torch.float64, torch.float32)]
        graph_inputs = [i for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
        sidecar = dict(
            format=FORMAT, name=v["name"], arch=v["family"], family=v["family"], attn_implementation=v["attn"],
            config=dict(vocab=VOCAB, d=D, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN, layers=LAYERS, seq=SEQ,
                        classes=CLASSES, pad=PAD),
            exporter=v["exporter"], opset=v["opset"], torch=torch.__version__, transformers=transformers.__version__,
            onnx=onnx.__version__, dynamic=v["dynamic"], external_data=False, weights="float32",
            ir_version=proto.ir_version, nodes=len(proto.graph.node),
            inputs=[dict(name=i.name, elem_type=i.type.tensor_type.elem_type,
                         dims=[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
                    for i in graph_inputs],
            outputs=[o.name for o in proto.graph.output],
            parameters=sum(p.numel() for p in base.parameters()),
            freeze=frozen, lost_parameters=lost, forward_note=note,
            loss=dict(logits="logits", labels="labels", per="token" if base.is_lm else "sample",
                      ignore_index=IGNORE_INDEX),
            forward=dict(batch=fb, seq=fs, inputs="forward/inputs", outputs={"logits": "forward/logits.npy"},
                         dtype="float64"),
            train=dict(dir="train", batch=TRAIN_BATCH, steps=steps, runs=runs))
        with open(os.path.join(tmp, "zoo.json"), "w") as fh:
            json.dump(sidecar, fh, indent=1)
            fh.write("\n")
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs_ in os.walk(out_dir) for f in fs_)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(here, "hf"), help="corpus folder (default models/hf)")
    p.add_argument("--only", action="append", help="variant name (repeatable); default: every variant")
    p.add_argument("--steps", type=int, default=5, help="training steps per reference run (default 5)")
    p.add_argument("--strict", action="store_true", help="fail when a variant cannot be exported")
    p.add_argument("--list", action="store_true", help="print the variants and exit")
    a = p.parse_args(argv)
    if a.list:
        for v in VARIANTS:
            print(f"{v['name']:32} {v['family']:10} {v['exporter']:11} opset {v['opset']} {v['attn']:5} "
                  f"{'dynamic' if v['dynamic'] else 'fixed'}")
        return
    known = {v["name"] for v in VARIANTS}
    for n in a.only or []:
        if n not in known:
            raise SystemExit(f"export_hf.py: unknown variant {n!r} (--list shows them)")
    chosen = [v for v in VARIANTS if not a.only or v["name"] in a.only]
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    failed = 0
    for i, v in enumerate(chosen):
        try:
            size = build_variant(v, os.path.join(a.out, v["name"]), a.steps)
            print(f"[{i + 1}/{len(chosen)}] {v['name']}: {size / 1024:.0f} KiB", flush=True)
        except Exception as e:  # noqa: BLE001 - an exporter failure is reported, not fatal unless --strict
            failed += 1
            print(f"[{i + 1}/{len(chosen)}] {v['name']}: not exported with torch {torch.__version__}: "
                  f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            if a.strict:
                raise
    print(f"{len(chosen) - failed} exported, {failed} failed")


if __name__ == "__main__":
    main()
