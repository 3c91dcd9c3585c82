"""The fast embedding paths give sentence-transformers' vectors, and fall back to them.

The cache's 0.965 threshold and the router's weights were learnt on ``encode``'s vectors, so
every other way of computing them must agree with it (cosine >= 0.9999) on any text.
"""
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.contract.cache import embedding, encoders

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

PROSE = ("The customer ordered two blenders on March 3rd, paid $129.99 each with a gift card, "
         "and asked whether ORD-48213 could ship to Oregon instead of Florida. ")
TEXTS = [
    "What is the warranty policy for SKU-4821?",
    "x",
    "",
    "   ",
    "  spaced \t out\n\n text  ",
    "Ünïcödé café naïve résumé Œuvre ß",
    "東京でおすすめのラーメン屋はどこですか？",
    "Как вернуть товар? ¿Dónde está mi pedido? ما هي سياسة الاسترجاع",
    "🚀🔥 emoji only 👍🏽",
    PROSE * 12,                                     # ~400 tokens: truncated at 256
    "Rule one: be concise.\n" * 300,                # long, lines joined by newlines
    ("a" * 150 + " ") * 40,                         # words longer than WordPiece's limit
    "東京都" * 1500,                                 # long, no spaces at all
    "nospace" * 1000,                               # one giant word
    "word " * 253 + "tail of the text",             # right around the 256-token cut
    # a word across the tokenizer's 2048-character prefix, inside the 256-token window
    "because " * 252 + " " * 26 + "extraordinarily long ending",
]


@pytest.fixture(scope="module")
def model():
    return embedding.get_model()


@pytest.fixture(scope="module")
def reference(model):
    return encoders.SentenceTransformerEncoder(model).encode(TEXTS)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("embedding-cache")


@pytest.fixture()
def restore_settings():
    saved = embedding.current_settings()
    yield
    embedding.configure(**saved)


def cosines(a, b):
    return (np.asarray(a) * np.asarray(b)).sum(axis=1)


def test_tokenizer_matches_sentence_transformers(model):
    """Same ids and mask as encode's own tokenizer call (truncation at max_seq_length 256,
    not the 128 tokenizer.json carries), long texts tokenized from a prefix included."""
    tok = encoders.Tokenizer(encoders.model_dir())
    assert tok.max_length == model.max_seq_length == 256
    ours = tok(TEXTS)
    theirs = model[0].tokenizer(TEXTS, padding=True, truncation="longest_first",
                                max_length=model.max_seq_length, return_tensors="np")
    for k in ("input_ids", "attention_mask", "token_type_ids"):
        assert np.array_equal(ours[k], theirs[k]), k
    for text in TEXTS:  # one at a time: no padding
        one, ref = tok([text]), model[0].tokenizer([text], truncation=True, max_length=256)
        assert one["input_ids"][0].tolist() == ref["input_ids"][0]


def test_pooling_config_is_mean_then_normalise():
    mdir = encoders.model_dir()
    encoders.check_pooling(mdir)  # raises for any other pooling
    pooling = json.loads((mdir / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] is True


@pytest.mark.parametrize("make", ["torch", "onnx"])
def test_fast_paths_give_encodes_vectors(make, model, reference, export_dir):
    mdir = encoders.model_dir()
    enc = (encoders.TorchEncoder(model, mdir) if make == "torch"
           else encoders.load_onnx(export_dir, mdir, lambda: model))
    batch = enc.encode(TEXTS)
    single = np.stack([enc.encode([t])[0] for t in TEXTS])
    small_batches = enc.encode(TEXTS, batch_size=3)
    for got in (batch, single, small_batches):
        assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        assert cosines(got, reference).min() >= 0.9999


def test_auto_uses_onnx_and_the_export_is_reused(export_dir, reference, restore_settings):
    embedding.configure("auto", cache_dir=export_dir)
    enc = embedding.get_encoder()
    assert enc.name == "onnx"
    assert cosines(embedding.embed_many(TEXTS), reference).min() >= 0.9999
    assert cosines([embedding.embed(TEXTS[0])], reference[:1]).min() >= 0.9999
    exports = [p for p in export_dir.iterdir()]
    assert len(exports) == 1 and (exports[0] / "model.onnx").is_file()  # no temp folders left
    stamp = (exports[0] / "model.onnx").stat().st_mtime_ns
    embedding.configure("auto", cache_dir=export_dir, threads=2)  # a new encoder, same export
    assert embedding.get_encoder().threads == 2
    assert (exports[0] / "model.onnx").stat().st_mtime_ns == stamp


def test_unwritable_cache_falls_back_to_sentence_transformers(tmp_path, reference, caplog,
                                                               restore_settings):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    embedding.configure("auto", cache_dir=blocker / "cache")  # cannot be created, even by root
    with caplog.at_level(logging.WARNING, logger="app.contract.cache.embedding"):
        vecs = embedding.embed_many(TEXTS)
        embedding.embed("again")
        embedding.embed("and again")
    assert embedding.get_encoder().name == "sentence-transformers"
    assert cosines(vecs, reference).min() >= 0.99999
    warnings = [r for r in caplog.records if "ONNX path unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "not writable" in warnings[0].getMessage()


def test_onnx_by_name_does_not_fall_back(tmp_path, restore_settings):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    embedding.configure("onnx", cache_dir=blocker / "cache")
    with pytest.raises(encoders.EncoderUnavailable):
        embedding.embed("hello")


def test_an_export_that_disagrees_with_encode_is_refused(export_dir, tmp_path, reference,
                                                         restore_settings):
    """An export whose probe vectors do not match what it computes (a wrong or damaged
    model) is never used: auto falls back to encode."""
    mdir = encoders.model_dir()
    good = encoders.cached_export(export_dir, mdir, embedding.get_model)
    bad = tmp_path / "cache" / good.name
    bad.mkdir(parents=True)
    (bad / "model.onnx").symlink_to(good / "model.onnx")
    probe = json.loads((good / "probe.json").read_text())
    probe["vectors"] = probe["vectors"][1:] + probe["vectors"][:1]  # each text, another's vector
    (bad / "probe.json").write_text(json.dumps(probe))
    with pytest.raises(encoders.EncoderUnavailable, match="disagrees"):
        encoders.load_onnx(tmp_path / "cache", mdir, embedding.get_model)
    embedding.configure("auto", cache_dir=tmp_path / "cache")
    assert embedding.get_encoder().name == "sentence-transformers"
    assert cosines(embedding.embed_many(TEXTS), reference).min() >= 0.99999


EXPORT_ONCE = """
import sys
from pathlib import Path
from app.contract.cache import embedding
embedding.configure("onnx", cache_dir=sys.argv[1])
print(embedding.get_encoder().name, embedding.embed("same vectors").tolist()[:4])
"""


def test_two_processes_exporting_at_once_share_one_whole_export(tmp_path):
    cache = tmp_path / "shared-cache"
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", EXPORT_ONCE, str(cache)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    lines = [o[0].strip().splitlines()[-1] for o in outs]
    assert lines[0].startswith("onnx ") and lines[0] == lines[1]
    entries = list(cache.iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".export-")
    assert {p.name for p in entries[0].iterdir()} == {"model.onnx", "probe.json"}


def test_the_gateway_configures_its_embedding_from_config(tmp_path, export_dir, restore_settings):
    """A gateway worker embeds (for the cache and the router) with what its config says."""
    from app.gateway.stages.s00_cache import GatewayCache
    from config import load_config
    GatewayCache(load_config("test", environ={"SLUICE_EMBEDDING_CACHE_DIR": str(export_dir)}))
    settings = embedding.current_settings()
    assert {k: settings[k] for k in ("backend", "threads", "cache_dir")} == \
        {"backend": "auto", "threads": 1, "cache_dir": export_dir}
    assert embedding.get_encoder().name == "onnx"
    GatewayCache(load_config("test", environ={"SLUICE_EMBEDDING_BACKEND": "torch"}))
    assert embedding.get_encoder().name == "torch"
