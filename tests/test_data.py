"""Embedded corpus, splits, tokenizer and sample drawing: determinism, sizes, corruption checks."""

import numpy as np
import pytest

from resdyn.lm import corpus


@pytest.fixture(scope="module")
def docs():
    return corpus.load_documents({"source": "embedded", "parts": ["kjv", "python_docs"]})


def test_embedded_corpus_is_real_prose_and_large(docs):
    kjv = corpus.kjv_chapters()
    assert len(kjv) == 1189  # chapters of the King James Bible
    assert kjv[0].startswith("In the beginning God created the heaven and the earth.")
    assert sum(map(len, docs)) > 2_000_000
    assert any("Return" in d or "return" in d for d in corpus.stdlib_docstrings(max_modules=20))


def test_split_is_seeded_disjoint_and_complete(docs):
    a_train, a_held = corpus.split_documents(docs, 0.1, seed=3)
    b_train, b_held = corpus.split_documents(docs, 0.1, seed=3)
    c_train, c_held = corpus.split_documents(docs, 0.1, seed=4)
    assert a_held == b_held and a_train == b_train
    assert a_held != c_held
    assert len(a_train) + len(a_held) == len(docs)
    assert abs(len(a_held) - round(0.1 * len(docs))) <= 1
    with pytest.raises(ValueError, match="heldout_fraction"):
        corpus.split_documents(docs, 1.0, 0)


def test_text_source_and_missing_file(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one para.\n\ntwo para.\n")
    assert corpus.load_documents({"source": "text", "paths": [str(f)], "split_paragraphs": True}) == [
        "one para.",
        "two para.",
    ]
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        corpus.load_documents({"source": "text", "paths": [str(tmp_path / "missing.txt")]})
    with pytest.raises(ValueError, match="allowed: embedded, text, hf"):
        corpus.load_documents({"source": "ftp"})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    corpus.train_tokenizer(corpus.kjv_chapters()[:200], 400, out)
    return corpus.load_tokenizer(out)


def test_tokenizer_roundtrip_and_eos(tokenizer):
    text = "And God said, Let there be light: and there was light."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 400
    stream = corpus.token_stream(tokenizer, ["a b", "c"])
    assert (stream == tokenizer.eos_token_id).sum() == 2


def test_plain_token_encoder_matches_autotokenizer(tmp_path):
    """The torch-free encoder gives the AutoTokenizer's token stream, id for id; a folder whose
    config could change the encoding falls back to the AutoTokenizer."""
    import json
    import shutil

    from transformers import PreTrainedTokenizerBase

    folder = tmp_path / "tok"
    docs = corpus.kjv_chapters()[:60]
    corpus.train_tokenizer(docs, 300, folder)
    light, full = corpus.load_token_encoder(folder), corpus.load_tokenizer(folder)
    assert isinstance(light, corpus.PlainTokenizer) and light.eos_token_id == full.eos_token_id is not None
    texts = docs[40:] + corpus.stdlib_docstrings(3) + ["  leading spaces\n\ttabs  ", "unicode: ß, ü, 日本, 🙂", ""]
    np.testing.assert_array_equal(corpus.token_stream(light, texts), corpus.token_stream(full, texts))
    with pytest.raises(ValueError, match="special tokens"):
        light("x", add_special_tokens=True)
    # a checkpoint record naming the folder resolves to it
    record = tmp_path / "ckpt" / "checkpoint.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"folder": str(folder)}))
    assert isinstance(corpus.load_token_encoder(record), corpus.PlainTokenizer)
    # another tokenizer class, or a config key that may change encoding: the AutoTokenizer
    for i, change in enumerate(
        ({"tokenizer_class": "GPT2TokenizerFast"}, {"add_prefix_space": True}, {"eos_token": "<nope>"})
    ):
        other = tmp_path / f"other{i}"
        shutil.copytree(folder, other)
        cfg = json.loads((other / "tokenizer_config.json").read_text())
        (other / "tokenizer_config.json").write_text(json.dumps({**cfg, **change}))
        assert corpus._plain_tokenizer(other) is None
        if i == 0:
            assert isinstance(corpus.load_token_encoder(other), PreTrainedTokenizerBase)


def test_draw_blocks_deterministic_nonoverlapping():
    stream = np.arange(1000, dtype=np.int32)
    ids, sids = corpus.draw_blocks(stream, 10, 16, seed=0)
    ids2, sids2 = corpus.draw_blocks(stream, 10, 16, seed=0)
    np.testing.assert_array_equal(ids, ids2)
    assert ids.shape == (10, 16) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids[:, 0], sids)  # the sample id is the start offset
    assert np.all(np.diff(sids) >= 16)  # sorted, non-overlapping windows
    assert not np.array_equal(corpus.draw_blocks(stream, 10, 16, seed=1)[1], sids)
    with pytest.raises(ValueError, match="only 1000 tokens"):
        corpus.draw_blocks(stream, 100, 16, seed=0)


class _Numbers:
    """A stand-in tokenizer: a document of space-separated integers encodes to them; EOS is -1."""

    eos_token_id = -1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}


def test_fresh_lens_blocks_are_disjoint_from_heldout_and_analysis_and_used_once():
    """Every token id of the corpus is unique (but EOS), so blocks share a token only where they
    overlap in text. The lens's fresh training windows (⌈train_tokens / length⌉ of them, shuffled)
    share no token with each other, with the lens's held-out windows, or with the analysis samples
    drawn from the held-out documents."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(20, 200, size=300)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    docs = [" ".join(map(str, range(s, s + n))) for s, n in zip(starts, sizes)]
    train_docs, held_docs = corpus.split_documents(docs, 0.1, seed=0)
    tok, length, train_tokens, n_heldout = _Numbers(), 16, 20_000, 8
    samples, _ = corpus.draw_blocks(corpus.token_stream(tok, held_docs), 50, length, seed=0)
    stream = corpus.token_stream(tok, train_docs)
    corpus.check_lens_stream(len(stream), train_tokens, n_heldout, length, "the test corpus")
    n_train = corpus.lens_train_blocks({"train_tokens": train_tokens, "n_train_blocks": 3}, length)
    assert n_train == 1250 and corpus.lens_train_blocks({"train_tokens": 0, "n_train_blocks": 3}, length) == 3
    ids, offsets = corpus.draw_blocks(stream, n_train + n_heldout, length, seed=1)
    from resdyn.study_b.lens import shuffled_rows

    train = shuffled_rows(ids[:n_train], seed=1)
    assert sorted(map(tuple, train)) == sorted(map(tuple, ids[:n_train])) and not np.array_equal(train, ids[:n_train])
    tokens = train[train >= 0]
    assert len(np.unique(tokens)) == len(tokens)  # no token in two training windows: each used once
    assert np.all(np.diff(offsets) >= length)  # non-overlapping windows of the stream
    for other in (ids[n_train:], samples):
        assert not np.intersect1d(tokens, other[other >= 0]).size


def test_lens_stream_larger_than_the_split_names_key_numbers_and_split():
    corpus.check_lens_stream(1000, 960, 2, 16, "x")  # 60 + 2 windows of 62: fits
    with pytest.raises(ValueError) as err:
        corpus.check_lens_stream(1000, 961, 2, 16, "dataset 'kjv' (results/data/kjv/train.jsonl)")
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("config key 'lens.train_tokens': 961 tokens (61 windows"), msg
    assert "the train split of dataset 'kjv' (results/data/kjv/train.jsonl) holds 1,000 tokens (62 windows)" in msg
    assert "lower lens.train_tokens to at most 960" in msg
