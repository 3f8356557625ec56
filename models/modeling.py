"""PyTorch definitions of the model families that onnxpipe ships and tests (shared by export.py and
torch_reference.py, so the exported graph and the training reference are the same module).

Families (config keys as in the .json sidecar that export.py writes):
  classifier  the benchmark structure: token embedding * sqrt(d) + positions (learned parameter or a sinusoidal
              table registered as a buffer), nn.TransformerEncoder of nn.TransformerEncoderLayer (GELU,
              batch_first / norm_first configurable), final LayerNorm, mean-pool (or first token), Linear head.
  gpt         GPT-style causal LM with hand-written blocks: token + learned position embeddings, causal
              self-attention (q/k/v Linear, view/transpose head split, masked_fill with a tril buffer or an additive
              -inf triangle buffer), tanh-GELU MLP, final LayerNorm, lm head tied to the token embedding.
  bert        BERT-style encoder: tokens + attention_mask inputs, additive mask (1 - mask) * -10000 broadcast to
              (B, 1, 1, S), post-LN (or pre-LN) blocks with erf GELU, hand-written attention, tanh pooler on the
              first token, Linear head.

Weights are deterministic for a seed: construction under torch.manual_seed(seed) followed by init_weights(), which
also gives every layer distinct weights (nn.TransformerEncoder deep-copies one layer) and non-trivial LayerNorm
scales and biases (so training goldens exercise their gradients).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

FAMILIES = ("classifier", "gpt", "bert")


class SinusoidalPositions(nn.Module):
    """The fixed sin/cos table of "Attention is all you need", a buffer (1, seq, d): exported as an initializer
    that is not a parameter, so a trainer must freeze it."""

    def __init__(self, seq, d):
        super().__init__()
        pos = torch.arange(seq, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
        table = torch.zeros(seq, d)
        table[:, 0::2] = torch.sin(pos * div)
        table[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("table", table.unsqueeze(0))

    def forward(self, s):
        return self.table[:, :s]


class LearnedPositions(nn.Module):
    """A learned (1, seq, d) parameter, as in the benchmark model."""

    def __init__(self, seq, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, seq, d) * 0.02)

    def forward(self, s):
        return self.weight[:, :s]


class Classifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.d_model, self.batch_first, self.pooling = d, cfg["batch_first"], cfg["pooling"]
        self.emb = nn.Embedding(cfg["vocab"], d)
        self.pos = (SinusoidalPositions if cfg["positions"] == "sinusoidal" else LearnedPositions)(cfg["seq"], d)
        layer = nn.TransformerEncoderLayer(d, cfg["heads"], cfg["ffn"], cfg["dropout"], activation="gelu",
                                           batch_first=cfg["batch_first"], norm_first=cfg["norm_first"])
        self.encoder = nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg["classes"])

    def forward(self, tokens):  # tokens (B, S) int64 -> logits (B, C)
        h = self.emb(tokens) * math.sqrt(self.d_model) + self.pos(tokens.size(1))  # (B, S, D)
        if self.batch_first:
            h = self.encoder(h)
        else:
            h = self.encoder(h.transpose(0, 1)).transpose(0, 1)  # the encoder runs on (S, B, D)
        h = self.norm(h)
        pooled = h.mean(1) if self.pooling == "mean" else h[:, 0]
        return self.head(pooled)


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, dropout, seq, causal_mask):
        super().__init__()
        self.heads, self.head_dim, self.causal_mask = heads, d // heads, causal_mask
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.attn_drop, self.resid_drop = nn.Dropout(dropout), nn.Dropout(dropout)
        if causal_mask == "tril":  # nanoGPT style: ones on and below the diagonal, masked_fill where == 0
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))
        else:  # additive: 0 on and below the diagonal, -inf above
            self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1).view(1, 1, seq, seq))

    def forward(self, x):  # (B, S, D)
        b, s, d = x.size()
        h, dh = self.heads, self.head_dim
        q = self.q(x).view(b, s, h, dh).transpose(1, 2)  # (B, H, S, Dh)
        k = self.k(x).view(b, s, h, dh).transpose(1, 2)
        v = self.v(x).view(b, s, h, dh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(dh)  # (B, H, S, S)
        if self.causal_mask == "tril":
            att = att.masked_fill(self.mask[:, :, :s, :s] == 0, float("-inf"))
        else:
            att = att + self.mask[:, :, :s, :s]
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, s, d)
        return self.resid_drop(self.proj(y))


class GptMlp(nn.Module):
    def __init__(self, d, ffn, dropout):
        super().__init__()
        self.fc, self.proj, self.drop = nn.Linear(d, ffn), nn.Linear(ffn, d), nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class GptBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.norm_first = cfg["norm_first"]
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, cfg["heads"], cfg["dropout"], cfg["seq"], cfg["causal_mask"])
        self.mlp = GptMlp(d, cfg["ffn"], cfg["dropout"])

    def forward(self, x):
        if self.norm_first:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Gpt(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.tok_emb = nn.Embedding(cfg["vocab"], d)
        self.pos_emb = nn.Embedding(cfg["seq"], d)
        self.drop = nn.Dropout(cfg["dropout"])
        self.blocks = nn.ModuleList([GptBlock(cfg) for _ in range(cfg["layers"])])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, cfg["vocab"], bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied: one Parameter, one initializer

    def forward(self, tokens):  # tokens (B, S) int64 -> logits (B, S, V)
        s = tokens.size(1)
        pos = torch.arange(0, s, dtype=torch.long, device=tokens.device)
        h = self.drop(self.tok_emb(tokens) + self.pos_emb(pos))
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h))


class BertSelfAttention(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.attn_drop, self.out_drop = nn.Dropout(dropout), nn.Dropout(dropout)

    def split(self, t, b, s, d):
        return t.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)  # (B, H, S, Dh)

    def forward(self, x, ext_mask):  # x (B, S, D), ext_mask (B, 1, 1, S) additive
        b, s, d = x.size()
        q = self.split(self.query(x), b, s, d)
        k = self.split(self.key(x), b, s, d)
        v = self.split(self.value(x), b, s, d)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + ext_mask
        probs = self.attn_drop(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(b, s, d)
        return self.out_drop(self.out(ctx))


class BertLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.norm_first = cfg["norm_first"]
        self.attention = BertSelfAttention(d, cfg["heads"], cfg["dropout"])
        self.attn_norm = nn.LayerNorm(d, eps=1e-12)
        self.intermediate = nn.Linear(d, cfg["ffn"])
        self.output = nn.Linear(cfg["ffn"], d)
        self.out_drop = nn.Dropout(cfg["dropout"])
        self.out_norm = nn.LayerNorm(d, eps=1e-12)

    def ffn(self, x):
        return self.out_drop(self.output(F.gelu(self.intermediate(x))))  # erf GELU

    def forward(self, x, ext_mask):
        if self.norm_first:
            x = x + self.attention(self.attn_norm(x), ext_mask)
            return x + self.ffn(self.out_norm(x))
        x = self.attn_norm(x + self.attention(x, ext_mask))
        return self.out_norm(x + self.ffn(x))


class Bert(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.word_emb = nn.Embedding(cfg["vocab"], d)
        self.pos_emb = nn.Embedding(cfg["seq"], d)
        self.emb_norm = nn.LayerNorm(d, eps=1e-12)
        self.emb_drop = nn.Dropout(cfg["dropout"])
        self.layers = nn.ModuleList([BertLayer(cfg) for _ in range(cfg["layers"])])
        self.final_norm = nn.LayerNorm(d, eps=1e-12) if cfg["norm_first"] else None
        self.pooler = nn.Linear(d, d)
        self.cls_drop = nn.Dropout(cfg["dropout"])
        self.classifier = nn.Linear(d, cfg["classes"])

    def forward(self, tokens, attention_mask):  # (B, S) int64 each -> logits (B, C)
        s = tokens.size(1)
        pos = torch.arange(0, s, dtype=torch.long, device=tokens.device)
        h = self.emb_drop(self.emb_norm(self.word_emb(tokens) + self.pos_emb(pos)))
        ext = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * -10000.0  # (B, 1, 1, S)
        for layer in self.layers:
            h = layer(h, ext)
        if self.final_norm is not None:
            h = self.final_norm(h)
        pooled = torch.tanh(self.pooler(h[:, 0]))
        return self.classifier(self.cls_drop(pooled))


def build(cfg):
    """Seeded, deterministic construction of the family's module from a config dict (the sidecar's keys)."""
    torch.manual_seed(cfg["seed"])
    model = {"classifier": Classifier, "gpt": Gpt, "bert": Bert}[cfg["family"]](cfg)
    init_weights(model)
    return model


@torch.no_grad()
def init_weights(model):
    """Distinct per-layer weights (Xavier for matrices, N(0, 0.02) for embeddings) and perturbed LayerNorm
    scales (1 + N(0, 0.1)) and biases (N(0, 0.02)), drawn in named_parameters() order."""
    emb_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, p in model.named_parameters():
        if id(p) in emb_weights:
            p.normal_(0.0, 0.02)
        elif name.endswith("pos.weight"):
            p.normal_(0.0, 0.02)
        elif p.dim() >= 2:
            nn.init.xavier_uniform_(p)
        elif "norm" in name.split(".")[-2] or name.split(".")[-2].startswith("ln"):
            if name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.02)
        else:  # Linear / in-projection biases
            p.normal_(0.0, 0.02)


def example_inputs(cfg, batch=2, generator_seed=None):
    """Inputs for tracing the export: tokens (and for bert an attention mask with some padding)."""
    g = torch.Generator().manual_seed(cfg["seed"] + 1 if generator_seed is None else generator_seed)
    tokens = torch.randint(0, cfg["vocab"], (batch, cfg["seq"]), generator=g)
    if cfg["family"] != "bert":
        return (tokens,)
    mask = torch.ones(batch, cfg["seq"], dtype=torch.long)
    mask[0, cfg["seq"] // 2:] = 0
    return tokens, mask


def io_names(family):
    inputs = ["tokens", "attention_mask"] if family == "bert" else ["tokens"]
    return inputs, ["logits"]
