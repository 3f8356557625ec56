"""Small PyTorch transformers of many export styles for the robustness corpus (export_zoo.py).

Every module here runs under PyTorch 1.13 (Debian) and 2.x (PyPI), has deterministic weights for a seed, and returns
one float tensor of logits: (B, C) for classifiers, (B, S, V) for language models. Each architecture writes its own
attention, norms and positions the way the model family it imitates does, so the exported graphs differ:

  gpt2       learned positions, Conv1D-style addmm projections, causal mask from triu + masked_fill/where,
             tanh GELU, lm head tied to the token embedding.
  llama      RMSNorm (pow/mean/sqrt/reciprocal), rotary embeddings (sin/cos computed in the graph from an
             inv_freq buffer, rotate_half with slice/neg/concat), grouped-query attention (K/V heads repeated by
             expand + reshape), SwiGLU MLP, no biases, additive causal mask from triu(full(-inf)).
  bert       word + position + token-type embeddings, attention_mask input turned into an additive mask, post-LN,
             erf GELU, pooler on the first token.
  encoder    nn.TransformerEncoder with a bool src_key_padding_mask input, mean pooling.
  t5         relative position bias from log-spaced buckets computed in the graph (abs/log/min/where), shared
             by the layers, RMSNorm without mean subtraction, unscaled attention, ReLU MLP.
  alibi      causal attention with ALiBi slopes (a buffer) times the key-query distance, no position
             embeddings.
  seq2seq    nn.Transformer encoder-decoder over src and tgt tokens with a square causal tgt mask made in the
             graph.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ARCHS = ("gpt2", "llama", "bert", "encoder", "t5", "alibi", "seq2seq")


def split_heads(x, heads):  # (B, S, H*Dh) -> (B, H, S, Dh)
    b, s, _ = x.shape
    return x.view(b, s, heads, -1).transpose(1, 2)


def merge_heads(x):  # (B, H, S, Dh) -> (B, S, H*Dh)
    b, h, s, dh = x.shape
    return x.transpose(1, 2).reshape(b, s, h * dh)


class Conv1D(nn.Module):
    """GPT-2's projection: weight (in, out), y = addmm(bias, x2d, weight)."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * 0.1)
        self.bias = nn.Parameter(torch.randn(d_out) * 0.02)

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(1),)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(shape)


class Gpt2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.heads = cfg["heads"]
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = Conv1D(d, 3 * d), Conv1D(d, d)
        self.c_fc, self.mlp_proj = Conv1D(d, 4 * d), Conv1D(4 * d, d)
        self.register_buffer("bias", torch.ones(cfg["seq"], cfg["seq"], dtype=torch.bool).tril().view(
            1, 1, cfg["seq"], cfg["seq"]))

    def forward(self, x):
        s = x.size(1)
        q, k, v = self.c_attn(self.ln_1(x)).split(x.size(-1), dim=2)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(v.size(-1))
        keep = self.bias[:, :, :s, :s]
        w = torch.where(keep, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        x = x + self.c_proj(merge_heads(torch.matmul(w.softmax(-1), v)))
        h = self.c_fc(self.ln_2(x))
        return x + self.mlp_proj(F.gelu(h, approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab"], cfg["d"])
        self.wpe = nn.Embedding(cfg["seq"], cfg["d"])
        self.h = nn.ModuleList(Gpt2Block(cfg) for _ in range(cfg["layers"]))
        self.ln_f = nn.LayerNorm(cfg["d"])
        self.lm_head = nn.Linear(cfg["d"], cfg["vocab"], bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, input_ids):
        pos = torch.arange(0, input_ids.size(1), dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w, written with pow/mean/sqrt/reciprocal as LLaMA and T5 code does."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.reciprocal(torch.sqrt(var + self.eps)))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, self.heads, self.kv_heads = cfg["d"], cfg["heads"], cfg["kv_heads"]
        self.dh = d // self.heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.dh, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.dh, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def repeat_kv(self, x):  # (B, KV, S, Dh) -> (B, H, S, Dh)
        b, kv, s, dh = x.shape
        rep = self.heads // kv
        return x[:, :, None, :, :].expand(b, kv, rep, s, dh).reshape(b, kv * rep, s, dh)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.dh).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.dh) + mask
        p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj(torch.matmul(p, v).transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f = cfg["d"], cfg["ffn"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(cfg["d"]), RMSNorm(cfg["d"])
        self.self_attn, self.mlp = LlamaAttention(cfg), LlamaMLP(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dh = cfg["d"] // cfg["heads"]
        self.embed_tokens = nn.Embedding(cfg["vocab"], cfg["d"])
        self.layers = nn.ModuleList(LlamaLayer(cfg) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["d"])
        self.lm_head = nn.Linear(cfg["d"], cfg["vocab"], bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)))

    def forward(self, input_ids):
        s, dt = input_ids.shape[1], self.embed_tokens.weight.dtype
        pos = torch.arange(s, device=input_ids.device).float()
        freqs = torch.outer(pos, self.inv_freq.float())  # (S, Dh/2), float32 whatever the weights' dtype
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None].to(dt), emb.sin()[None, None].to(dt)  # (1, 1, S, Dh)
        mask = torch.triu(torch.full((s, s), float("-inf"), device=input_ids.device, dtype=dt), diagonal=1)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


class BertLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.heads = cfg["heads"]
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_out, self.attn_norm = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.inter, self.out, self.out_norm = nn.Linear(d, cfg["ffn"]), nn.Linear(cfg["ffn"], d), nn.LayerNorm(d)

    def forward(self, x, ext_mask):
        q, k, v = (split_heads(f(x), self.heads) for f in (self.query, self.key, self.value))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1)) + ext_mask
        ctx = merge_heads(torch.matmul(F.softmax(scores, dim=-1), v))
        x = self.attn_norm(x + self.attn_out(ctx))
        return self.out_norm(x + self.out(F.gelu(self.inter(x))))


class Bert(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.word = nn.Embedding(cfg["vocab"], d)
        self.position = nn.Embedding(cfg["seq"], d)
        self.token_type = nn.Embedding(2, d)
        self.emb_norm = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg["layers"]))
        self.pooler = nn.Linear(d, d)
        self.classifier = nn.Linear(d, cfg["classes"])
        self.register_buffer("position_ids", torch.arange(cfg["seq"]).unsqueeze(0))

    def forward(self, input_ids, token_type_ids, attention_mask):
        s = input_ids.size(1)
        x = self.word(input_ids) + self.position(self.position_ids[:, :s]) + self.token_type(token_type_ids)
        x = self.emb_norm(x)
        ext = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, ext)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.emb = nn.Embedding(cfg["vocab"], d)
        self.pos = nn.Parameter(torch.randn(1, cfg["seq"], d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, cfg["heads"], cfg["ffn"], dropout=0.0, batch_first=True,
                                           norm_first=cfg.get("norm_first", False))
        self.encoder = nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
        self.head = nn.Linear(d, cfg["classes"])

    def forward(self, tokens, padding_mask):  # padding_mask (B, S) bool, True = padding
        h = self.emb(tokens) + self.pos[:, : tokens.size(1)]
        h = self.encoder(h, src_key_padding_mask=padding_mask)
        keep = (~padding_mask).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


def t5_bucket(relative, num_buckets, max_distance):
    """T5's bidirectional relative-position bucket of (S, S) int64 distances."""
    num_buckets //= 2
    buckets = (relative > 0).to(torch.long) * num_buckets
    n = torch.abs(relative)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, n, large)


class T5Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.heads = cfg["heads"]
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.wi, self.wo = nn.Linear(d, cfg["ffn"], bias=False), nn.Linear(cfg["ffn"], d, bias=False)

    def forward(self, x, bias):
        h = self.norm1(x)
        q, k, v = (split_heads(f(h), self.heads) for f in (self.q, self.k, self.v))
        scores = torch.matmul(q, k.transpose(3, 2)) + bias  # T5 does not scale
        x = x + self.o(merge_heads(torch.matmul(F.softmax(scores.float(), dim=-1).type_as(scores), v)))
        return x + self.wo(F.relu(self.wi(self.norm2(x))))


class T5(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_buckets, self.max_distance = 16, 32
        self.embed = nn.Embedding(cfg["vocab"], cfg["d"])
        self.relative_attention_bias = nn.Embedding(self.num_buckets, cfg["heads"])
        self.layers = nn.ModuleList(T5Layer(cfg) for _ in range(cfg["layers"]))
        self.final_norm = RMSNorm(cfg["d"])
        self.head = nn.Linear(cfg["d"], cfg["classes"])

    def forward(self, input_ids):
        s = input_ids.size(1)
        ctx = torch.arange(s, dtype=torch.long, device=input_ids.device)[:, None]
        mem = torch.arange(s, dtype=torch.long, device=input_ids.device)[None, :]
        buckets = t5_bucket(mem - ctx, self.num_buckets, self.max_distance)  # (S, S)
        bias = self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, H, S, S)
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, bias)
        return self.head(self.final_norm(x).mean(dim=1))


class AlibiLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.heads = cfg["heads"]
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, cfg["ffn"]), nn.Linear(cfg["ffn"], d)

    def forward(self, x, bias):
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5 + bias
        x = x + self.proj(merge_heads(scores.softmax(-1) @ v))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Alibi(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["heads"]
        self.embed = nn.Embedding(cfg["vocab"], cfg["d"])
        self.layers = nn.ModuleList(AlibiLayer(cfg) for _ in range(cfg["layers"]))
        self.norm = nn.LayerNorm(cfg["d"])
        self.out = nn.Linear(cfg["d"], cfg["vocab"])
        self.register_buffer("slopes", torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)]).view(h, 1, 1))

    def forward(self, input_ids):
        s = input_ids.size(1)
        pos = torch.arange(s, device=input_ids.device)
        dist = (pos[None, :] - pos[:, None]).to(torch.float32)  # key - query
        causal = pos[None, :] > pos[:, None]
        bias = (self.slopes * dist).masked_fill(causal, float("-inf")).unsqueeze(0)  # (1, H, S, S)
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, bias)
        return self.out(self.norm(x))


class Seq2Seq(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.src_emb, self.tgt_emb = nn.Embedding(cfg["vocab"], d), nn.Embedding(cfg["vocab"], d)
        self.transformer = nn.Transformer(d, cfg["heads"], cfg["layers"], cfg["layers"], cfg["ffn"], dropout=0.0,
                                          batch_first=True)
        self.out = nn.Linear(d, cfg["vocab"])

    def forward(self, src, tgt):
        t = tgt.size(1)
        tgt_mask = torch.triu(torch.full((t, t), float("-inf"), device=tgt.device), diagonal=1)
        h = self.transformer(self.src_emb(src), self.tgt_emb(tgt), tgt_mask=tgt_mask)
        return self.out(h)


MODULES = dict(gpt2=Gpt2, llama=Llama, bert=Bert, encoder=Encoder, t5=T5, alibi=Alibi, seq2seq=Seq2Seq)


def build(cfg):
    """The module of cfg["arch"] with deterministic, non-trivial weights (norm scales 1 + N(0, 0.1))."""
    torch.manual_seed(cfg.get("seed", 0))
    model = MODULES[cfg["arch"]](cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.3 / math.sqrt(p.shape[-1]) if "emb" not in name else 0.5)
            elif name.endswith("weight"):
                nn.init.normal_(p, mean=1.0, std=0.1)
            else:
                nn.init.normal_(p, std=0.05)
    return model.eval()


def make_inputs(cfg, batch, seq, rng):
    """{input name: int64/bool array} for cfg's architecture."""
    import numpy as np

    v = cfg["vocab"]
    ids = rng.integers(0, v, size=(batch, seq), dtype=np.int64)
    arch = cfg["arch"]
    if arch == "bert":
        types = (np.arange(seq)[None, :] >= rng.integers(1, seq, size=(batch, 1))).astype(np.int64)
        mask = (np.arange(seq)[None, :] < rng.integers(seq // 2, seq + 1, size=(batch, 1))).astype(np.int64)
        mask[0] = 1
        return dict(input_ids=ids, token_type_ids=types, attention_mask=mask)
    if arch == "encoder":
        pad = np.arange(seq)[None, :] >= rng.integers(seq // 2, seq + 1, size=(batch, 1))
        pad[0] = False
        return dict(tokens=ids, padding_mask=pad)
    if arch == "seq2seq":
        return dict(src=ids, tgt=rng.integers(0, v, size=(batch, seq), dtype=np.int64))
    return dict(input_ids=ids)


def input_names(arch):
    return dict(bert=["input_ids", "token_type_ids", "attention_mask"], encoder=["tokens", "padding_mask"],
                seq2seq=["src", "tgt"]).get(arch, ["input_ids"])


def is_lm(arch):
    """True when the output is per-token logits (B, S, V), else per-sample (B, C)."""
    return arch in ("gpt2", "llama", "alibi", "seq2seq")
