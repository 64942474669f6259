"""A BERT encoder in plain torch, for embedding models that are BERTs: loaded from a local folder's config.json,
model.safetensors and tokenizer.json without importing transformers.

Why: on a CPU host, importing transformers and its `from_pretrained` take longer than everything else a one-question
`qasc query` does after torch's own import (bench/RESULTS.md, "One question"); every Ray actor and retriever pays it
too. The forward pass runs the operations of transformers' `BertModel` (SDPA attention, the default) in the same
order with the same arguments, so its vectors are the same bit for bit (tests/engine/test_bert.py compares them
on real sentences, padded batches included). Any folder this module does not recognise exactly (another
architecture, relative positions, another activation, no safetensors or tokenizer.json, extra config fields it
does not model) is loaded by transformers as before: `load_native_bert` returns None.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

# config.json fields this forward pass models, with the values it supports (None: any value)
SUPPORTED = {"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "absolute", "is_decoder": False,
             "add_cross_attention": False, "chunk_size_feed_forward": 0, "_attn_implementation": "sdpa",
             "attn_implementation": "sdpa"}
REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "layer_norm_eps",
            "vocab_size", "max_position_embeddings", "type_vocab_size")


class NativeTokenizer:
    """tokenizer.json through the `tokenizers` library (what transformers' fast BERT tokenizer wraps): the ids a
    transformers tokenizer gives with add_special_tokens and truncation to max_length, no padding."""

    def __init__(self, path: Path, pad_token_id: int) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(path))
        self.backend.no_padding()
        self.backend.no_truncation()
        self.pad_token_id = pad_token_id
        self._truncation: int | None = None

    def ids(self, texts: list[str], add_special_tokens: bool, max_length: int | None) -> list[list[int]]:
        """texts -> token ids; max_length None: not truncated."""
        if max_length != self._truncation:
            if max_length is None:
                self.backend.no_truncation()
            else:
                self.backend.enable_truncation(max_length, strategy="longest_first")
            self._truncation = max_length
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]


class NativeBert:
    """BertModel's forward in plain torch: `NativeBert(weights, config)(input_ids, mask)` -> last hidden state
    (B, T, hidden) in the weights' dtype. weights: the safetensors state dict (names with or without `bert.`)."""

    def __init__(self, weights: dict[str, torch.Tensor], config: dict) -> None:
        self.w = {k.removeprefix("bert."): v for k, v in weights.items()}
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        self.head_size = self.hidden // self.heads
        self.scaling = self.head_size**-0.5
        self.eps = float(config["layer_norm_eps"])
        self.layers = int(config["num_hidden_layers"])
        self.dtype = self.w["embeddings.word_embeddings.weight"].dtype

    def to(self, device: torch.device, dtype: torch.dtype | None = None) -> NativeBert:
        self.w = {k: v.to(device=device, dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype)
                  for k, v in self.w.items()}
        self.dtype = self.w["embeddings.word_embeddings.weight"].dtype
        return self

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden,), self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def __call__(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) int64, mask (B, T) 1 for tokens, 0 for padding -> (B, T, hidden)."""
        b, t = input_ids.shape
        w = self.w
        positions = torch.arange(t, device=input_ids.device)[None, :]
        x = F.embedding(input_ids, w["embeddings.word_embeddings.weight"])
        x = x + F.embedding(torch.zeros_like(positions).expand(b, t), w["embeddings.token_type_embeddings.weight"])
        x = x + F.embedding(positions, w["embeddings.position_embeddings.weight"])
        x = self._norm(x, "embeddings.LayerNorm")
        # transformers' bidirectional mask for SDPA: none when no token is padding, else a (B, 1, T, T) bool
        attend = None if bool(mask.all()) else mask.bool()[:, None, None, :].expand(b, 1, t, t).contiguous()
        shape = (b, t, self.heads, self.head_size)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = self._linear(x, p + "attention.self.query").view(shape).transpose(1, 2)
            k = self._linear(x, p + "attention.self.key").view(shape).transpose(1, 2)
            v = self._linear(x, p + "attention.self.value").view(shape).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, dropout_p=0.0, scale=self.scaling,
                                               is_causal=False)
            a = a.reshape(b, self.heads, t, self.head_size).transpose(1, 2).contiguous().reshape(b, t, -1).contiguous()
            x = self._norm(self._linear(a, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = F.gelu(self._linear(x, p + "intermediate.dense"))
            x = self._norm(self._linear(h, p + "output.dense") + x, p + "output.LayerNorm")
        return x


def native_config(folder: Path) -> dict | None:
    """The folder's config.json when this module models it exactly, else None."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or any(config.get(k) not in (None, v) for k, v in SUPPORTED.items()):
        return None
    if any(k not in config for k in REQUIRED) or config.get("model_type") != "bert":
        return None
    if config["hidden_size"] % config["num_attention_heads"]:
        return None
    return config


def load_native_bert(path: str, device: torch.device, dtype: torch.dtype) -> tuple[NativeBert, NativeTokenizer,
                                                                                   dict] | None:
    """A local BERT folder -> (model on device in dtype, tokenizer, config), or None where transformers must load it
    (not a folder, not a BERT this module models, no model.safetensors or tokenizer.json)."""
    folder = Path(path)
    if not folder.is_dir() or not (folder / "model.safetensors").is_file() or not (folder / "tokenizer.json").is_file():
        return None
    config = native_config(folder)
    if config is None:
        return None
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    names = {k.removeprefix("bert.") for k in weights}
    needed = {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
              "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight"}
    needed |= {f"encoder.layer.{i}.output.LayerNorm.bias" for i in range(int(config["num_hidden_layers"]))}
    if not needed <= names:
        return None
    model = NativeBert(weights, config).to(device, dtype)
    tokenizer = NativeTokenizer(folder / "tokenizer.json", int(config.get("pad_token_id") or 0))
    return model, tokenizer, config
