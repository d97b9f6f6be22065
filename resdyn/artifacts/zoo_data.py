"""The data side's artifacts: a zoo model's training curve, the corpus splits, the token samples
(HDF5) and the record of where a checkpoint's weights are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from resdyn import io
from resdyn.artifacts.base import Artifact, ArtifactError, TsvArtifact, kinds
from resdyn.io import PathLike

__all__ = ["TrainingCurve", "Corpus", "Samples", "CheckpointRecord"]


class TrainingCurve(TsvArtifact):
    """``models/{model}/training.tsv``: the loss curve of a zoo model's training.

    One row per evaluation (:func:`resdyn.lm.zoo.train_zoo_model`): ``step``, ``lr`` float,
    ``train_loss`` (NaN at step 0, whose ``reason`` says there was no batch yet),
    ``heldout_loss``, ``unigram_loss`` (the held-out loss of the unigram baseline) float,
    ``reason`` str.
    """

    relpath = "models/{model}/training.tsv"
    columns = kinds("step:int lr:float train_loss:float heldout_loss:float unigram_loss:float reason:str")
    units = {
        "step": "optimizer steps",
        "train_loss": "nats/token",
        "heldout_loss": "nats/token",
        "unigram_loss": "nats/token",
    }


class Corpus(Artifact):
    """``results/data/{dataset}/{split}.jsonl`` (split train | heldout): the documents of a corpus split.

    UTF-8 JSON lines, one object ``{"text": str}`` per document, in corpus order.
    """

    relpath = "results/data/{dataset}/{split}.jsonl"

    @staticmethod
    def write(docs: Sequence[str], path: PathLike) -> None:
        """Write the documents atomically, one JSON line each."""
        with io.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")

    @staticmethod
    def read(path: PathLike) -> list[str]:
        """The documents; ValueError naming file and line for a line that is not ``{"text": str}``."""
        docs = []
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError) as err:
                    raise ValueError(f"{path}:{i}: not a document line ({err})") from err
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{i}: not a document line (text is a {type(text).__name__}, not a string)")
                docs.append(text)
        return docs


class Samples(Artifact):
    """``results/{model}/samples.h5`` (and ``lens_tokens.h5``): the token blocks every analysis reads.

    HDF5 datasets ``input_ids`` (N, T) integer token ids and ``sample_ids`` (N,) integer (the
    block's start offset in its token stream); root attrs: the caller's (dataset, split file,
    seed, …; dicts/lists as JSON strings) and ``samples_hash`` = SHA-256 of both arrays
    (:func:`resdyn.io.sha256_array`), re-checked on read.
    """

    relpath = "results/{model}/samples.h5"

    @staticmethod
    def write(path: PathLike, input_ids: np.ndarray, sample_ids: np.ndarray, attrs: Mapping[str, Any]) -> str:
        """Write the samples atomically; returns their ``samples_hash``."""
        import h5py

        digest = io.sha256_array(input_ids, sample_ids)
        with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.create_dataset("input_ids", data=input_ids)
            f.create_dataset("sample_ids", data=sample_ids)
            for k, v in {**attrs, "samples_hash": digest}.items():
                f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
        return digest

    @staticmethod
    def read(path: PathLike) -> tuple[np.ndarray, np.ndarray, dict]:
        """(input_ids, sample_ids, attrs), validated: shapes, integer dtypes and the content hash."""
        import h5py

        try:
            with h5py.File(path, "r") as f:
                ids, sids = f["input_ids"][()], f["sample_ids"][()]
                attrs = dict(f.attrs)
        except (OSError, KeyError) as err:
            raise ValueError(f"{path}: not a readable samples file ({err})") from err
        if ids.ndim != 2 or sids.shape != (ids.shape[0],):
            raise ArtifactError(
                f"{path}: input_ids must be (N, T) and sample_ids (N,), got {ids.shape} and {sids.shape}"
            )
        if ids.dtype.kind not in "iu" or sids.dtype.kind not in "iu":
            raise ArtifactError(f"{path}: input_ids and sample_ids must be integers, got {ids.dtype} and {sids.dtype}")
        if attrs.get("samples_hash") != io.sha256_array(ids, sids):
            raise ValueError(f"{path}: content does not match its recorded samples_hash (corrupted?)")
        return ids, sids, attrs


class JsonRecord(Artifact):
    """Base of the one-object JSON artifacts: ``validate`` (per class), and the atomic writer and
    validating reader built on it."""

    @classmethod
    def validate(cls, record: Any, where: PathLike) -> dict:
        """The record, checked (each subclass)."""
        raise NotImplementedError

    @classmethod
    def write(cls, record: dict, path: PathLike) -> None:
        """Write the record atomically (validated first)."""
        io.write_json(cls.validate(record, path), path)

    @classmethod
    def read(cls, path: PathLike) -> dict:
        """The validated record."""
        return cls.validate(io.read_json(path), path)


class CheckpointRecord(JsonRecord):
    """``models/{model}/{ckpt}/checkpoint.json``: where one checkpoint's weights are, and their hash.

    The JSON object of :func:`resdyn.lm.models.resolve_checkpoint`: the checkpoint's config entry
    (``model``, ``checkpoint``, ``source``, ``dtype``, ``repo``/``revision`` or ``path``, …) plus
    ``folder`` (absolute path of the weights), ``resolved_commit`` (hub commit or null),
    ``weight_files`` (list of names), ``content_hash`` and ``tokenizer_hash`` (SHA-256 hex of the
    weight and tokenizer files, :func:`resdyn.io.sha256_tree`).
    """

    relpath = "models/{model}/{ckpt}/checkpoint.json"
    REQUIRED: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "model": str,
        "checkpoint": str,
        "source": str,
        "folder": str,
        "weight_files": list,
        "content_hash": str,
        "tokenizer_hash": str,
    }

    @classmethod
    def validate(cls, record: Any, where: PathLike) -> dict:
        """The record if it has every required key with the right type; ArtifactError naming ``where``."""
        if not isinstance(record, dict):
            raise ArtifactError(f"{where}: expected a JSON object (checkpoint record), got {type(record).__name__}")
        missing = [k for k in cls.REQUIRED if k not in record]
        if missing:
            raise ArtifactError(f"{where}: lacks key(s) {missing} (a checkpoint record has {list(cls.REQUIRED)})")
        for k, t in cls.REQUIRED.items():
            if not isinstance(record[k], t):
                raise ArtifactError(f"{where}: {k} must be a {t.__name__}, got {record[k]!r:.80}")
        for k in ("content_hash", "tokenizer_hash"):
            if not re.fullmatch(r"[0-9a-f]{64}", record[k]):
                raise ArtifactError(f"{where}: {k} must be a SHA-256 hex digest, got {record[k]!r:.80}")
        return record


class CheckpointIntegrity(JsonRecord):
    """``models/{model}/{ckpt}/integrity.json``: one checkpoint against the checkpoints before it.

    The JSON object of :func:`resdyn.lm.integrity.check`: ``ckpt``, ``weights_sha256`` (digest of
    the weight files alone), ``architecture`` (family and shapes), ``duplicate_of`` and
    ``architecture_differs_from`` (earlier checkpoints, in training order; non-empty only where
    the model sets ``allow_duplicate_weights: true``) and ``allowed``.
    """

    relpath = "models/{model}/{ckpt}/integrity.json"
    REQUIRED: ClassVar[dict[str, type]] = {
        "ckpt": str,
        "weights_sha256": str,
        "architecture": dict,
        "duplicate_of": list,
        "architecture_differs_from": list,
        "allowed": bool,
    }

    @classmethod
    def validate(cls, record: Any, where: PathLike) -> dict:
        """The record if it has every required key with the right type; ArtifactError naming ``where``."""
        if not isinstance(record, dict):
            raise ArtifactError(f"{where}: expected a JSON object (checkpoint integrity), got {type(record).__name__}")
        bad = [k for k, t in cls.REQUIRED.items() if not isinstance(record.get(k), t)]
        if bad:
            raise ArtifactError(f"{where}: key(s) {bad} missing or of the wrong type (expected {cls.REQUIRED})")
        return record
