"""StringIndex: brute-force oracles over built vocabularies, edges, errors, files."""

import doctest
import importlib
import json
import os

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="vocabularies are trained with `tokenizers` in the tests")
from string_oracles import EOS_TEXT
from string_oracles import MEMBERS
from string_oracles import Oracle
from string_oracles import byte_level_tokenizer_json
from string_oracles import byte_level_vocabulary
from string_oracles import explore
from string_oracles import random_byte_vocabulary
from string_oracles import reachable_by_step
from string_oracles import tokenizer_from_json

from static_keras.strings import StringIndex
from static_keras.strings import TokenVocabulary
from static_keras.strings import kernels
from static_keras.strings.byte_trie import build_byte_trie
from static_keras.strings.byte_trie import sort_unique


@pytest.fixture(scope="module")
def bpe():
    return byte_level_vocabulary()


@pytest.fixture(scope="module")
def bpe_index(bpe):
    eos = bpe.eos_token_id
    return StringIndex.from_strings(MEMBERS, bpe, eos_token_id=eos)


def _check_against_oracle(index, vocabulary, members, *, limit=None, prune=True):
    oracle = Oracle(members, vocabulary, index.eos_token_id, prune=prune)
    visited = explore(index, vocabulary, limit=limit)
    assert visited, "nothing reachable"
    states = np.array([s for s, _, _ in visited])
    allowed = index.allowed_tokens(states)
    for row, (state, prefix, _) in enumerate(visited):
        expected = oracle.allowed(prefix)
        got = set(np.flatnonzero(allowed[row]).tolist())
        assert got == expected, (prefix, sorted(got ^ expected)[:10])
    return visited


# Oracles --------------------------------------------------------------------


def test_every_reachable_node_matches_brute_force(bpe, bpe_index):
    visited = _check_against_oracle(bpe_index, bpe, MEMBERS)
    assert len(visited) == bpe_index.num_states - bpe_index.num_members


def test_step_widths_are_exact_over_reachable_states(bpe_index):
    widths = []
    for frontier in reachable_by_step(bpe_index):
        row, _, _ = bpe_index.edges(sorted(frontier))
        counts = np.bincount(row, minlength=len(frontier))
        widths.append(max(1, int(counts.max(initial=0))))
    assert tuple(widths) == bpe_index.step_widths
    # length: the longest tokenization of any member, plus EOS.
    members = set(bpe_index.strings)
    longest = max(len(m.encode()) for m in members)  # byte-level: one token per byte
    assert bpe_index.length == longest + 1


def test_random_walks_spell_members_and_item_ids(bpe, bpe_index):
    rng = np.random.default_rng(0)
    for _ in range(200):
        state, tokens = 0, []
        while not bpe_index.is_finished([state])[0]:
            row, options, targets = bpe_index.edges([state])
            assert options.size, "a dead end was reachable"
            pick = rng.integers(options.size)
            tokens.append(int(options[pick]))
            state = int(targets[pick])
        assert len(tokens) <= bpe_index.length
        text = bpe.decode(tokens).decode("utf-8")
        assert text in MEMBERS
        item = int(bpe_index.item_ids([state])[0])
        assert MEMBERS[item] == text
        assert bpe_index.lookup_item_ids([tokens]).tolist() == [item]


def test_canonical_tokenization_of_every_member_is_accepted(bpe_index):
    tokenizer = tokenizer_from_json(byte_level_tokenizer_json())
    eos = bpe_index.eos_token_id
    sequences = [tokenizer.encode(m).ids + [eos] for m in MEMBERS]
    assert any(len(s) < len(m.encode()) + 1 for s, m in zip(sequences, MEMBERS)), "no merges"
    assert bpe_index.lookup_item_ids(sequences).tolist() == list(range(len(MEMBERS)))
    # Without EOS, or with a token outside the set, nothing is accepted.
    assert bpe_index.lookup_item_ids([s[:-1] for s in sequences]).tolist() == [-1] * len(MEMBERS)
    assert bpe_index.lookup_item_ids([[eos]]).tolist() == [-1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_sets_and_vocabularies_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    vocab = random_byte_vocabulary(seed, size=60, alphabet=b"abcd", max_len=4)
    members = {
        bytes(rng.choice(list(b"abcd"), int(rng.integers(1, 9))).tolist()) for _ in range(25)
    }
    members = sorted(members)
    index = StringIndex.from_strings(members, vocab, eos_token_id=vocab.eos_token_id)
    _check_against_oracle(index, vocab, members)
    for t, frontier in enumerate(reachable_by_step(index)):
        row, _, _ = index.edges(sorted(frontier))
        assert max(1, int(np.bincount(row).max(initial=0))) == index.step_widths[t]


def test_large_set_sampled_states_match_brute_force(bpe):
    rng = np.random.default_rng(5)
    words = ["alpha", "beta", "gamma", "delta", "東京", "🍕", "kitchen", "home", " > "]
    members = sorted({"".join(rng.choice(words, int(rng.integers(1, 6)))) for _ in range(300)})
    index = StringIndex.from_strings(members, bpe, eos_token_id=bpe.eos_token_id)
    _check_against_oracle(index, bpe, members, limit=25)


# Edges ----------------------------------------------------------------------


def test_vocabulary_without_some_single_bytes_prunes_dead_ends():
    # No single-byte token for "b": "abc" is a|bc or ab|c; "cab" is c|ab, and
    # c|a strands the walk at "ca" (nothing spells the remaining "b").
    tokens = [b"a", b"c", b"d", b"ab", b"bc", b"abd", b"<eos>"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[6])
    members = ["abc", "abd", "cab"]
    index = StringIndex.from_strings(members, vocab, eos_token_id=6)
    _check_against_oracle(index, vocab, members, prune=True)
    state_c = index.walk([[1]])[0]
    assert np.flatnonzero(index.allowed_tokens([state_c])[0]).tolist() == [3]
    assert Oracle(members, vocab, 6, prune=False).allowed(b"c") == {0, 3}
    state_a = index.walk([[0]])[0]
    assert np.flatnonzero(index.allowed_tokens([state_a])[0]).tolist() == [4]
    assert index.lookup_item_ids([[0, 4, 6], [3, 1, 6], [5, 6], [1, 3, 6], [1, 0]]).tolist() == [
        0,
        0,
        1,
        2,
        -1,
    ]


def test_unpruned_oracle_holds_where_every_byte_is_a_token(bpe, bpe_index):
    _check_against_oracle(bpe_index, bpe, MEMBERS, prune=False, limit=40)


def test_k_equals_one_duplicates_and_prefix_members():
    vocab = random_byte_vocabulary(3, size=40, alphabet=b"xyz")
    eos = vocab.eos_token_id
    one = StringIndex.from_strings(["xyzzy"], vocab, eos_token_id=eos)
    assert one.num_members == 1 and one.num_strings == 1
    _check_against_oracle(one, vocab, ["xyzzy"])
    dup = StringIndex.from_strings(["xy", "xyz", "xy", "z", "xyz"], vocab, eos_token_id=eos)
    assert dup.num_members == 3 and dup.num_strings == 5
    seq_xy = [vocab.token_bytes.index(b"x"), vocab.token_bytes.index(b"y"), eos]
    seq_xyz = seq_xy[:2] + [vocab.token_bytes.index(b"z"), eos]
    assert dup.lookup_item_ids([seq_xy, seq_xyz]).tolist() == [0, 1]
    # At "xy" both EOS (member) and "z" (towards "xyz") are allowed.
    state = dup.walk([seq_xy[:2]])[0]
    allowed = set(np.flatnonzero(dup.allowed_tokens([state])[0]).tolist())
    assert eos in allowed and vocab.token_bytes.index(b"z") in allowed


def test_tokens_crossing_several_trie_edges_and_shared_next_states():
    tokens = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"abcab", b"<eos>"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[7])
    index = StringIndex.from_strings(["abcabc", "abcb"], vocab, eos_token_id=7)
    _check_against_oracle(index, vocab, ["abcabc", "abcb"])
    # a|b|c, ab|c, a|bc and abc all reach the node "abc": one state.
    ends = index.walk([[0, 1, 2], [3, 2], [0, 4], [5]])
    assert len(set(ends.tolist())) == 1 and ends[0] >= 0
    # "abcab" crosses five trie edges in one step.
    assert index.walk([[6, 2, 7]]).tolist() == index.walk([[5, 5, 7]]).tolist()
    assert index.lookup_item_ids([[6, 2, 7]]).tolist() == [0]


def test_dense_automaton_outgrows_the_compilers_first_buffers():
    # Runs of "a" up to 12 bytes under a 40-byte member: 12 tokens per state,
    # more edges than the join's first guess (4 per trie node).
    tokens = [b"a" * n for n in range(1, 13)] + [b"<eos>"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[12])
    members = ["a" * 40, "a" * 7]
    index = StringIndex.from_strings(members, vocab, eos_token_id=12)
    assert index.layout.num_edges > 4 * 41
    _check_against_oracle(index, vocab, members)
    assert index.lookup_item_ids([[11, 11, 11, 3, 12], [6, 12], [2, 3, 12]]).tolist() == [0, 1, 1]


def test_special_tokens_and_eos_are_never_text():
    # A special token and EOS both spell "ab": neither may be used as text.
    tokens = [b"a", b"b", b"ab", b"ab", b"ab"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[3])
    index = StringIndex.from_strings(["ab"], vocab, eos_token_id=4)
    assert np.flatnonzero(index.allowed_tokens([0])[0]).tolist() == [0, 2]


def test_multibyte_utf8_cut_inside_characters(bpe, bpe_index):
    tokenizer = tokenizer_from_json(byte_level_tokenizer_json())
    # Walk "東京都" byte by byte (single-byte tokens, each half a character).
    single = {
        bpe.token_bytes[t]: t
        for t in np.flatnonzero(bpe.text_tokens)
        if len(bpe.token_bytes[t]) == 1
    }
    path = [single[bytes([b])] for b in "東京都".encode()] + [bpe.eos_token_id]
    assert bpe_index.lookup_item_ids([path]).tolist() == [MEMBERS.index("東京都")]
    ids = tokenizer.encode("🍕🍕").ids + [bpe.eos_token_id]
    assert bpe_index.lookup_item_ids([ids]).tolist() == [MEMBERS.index("🍕🍕")]


# Vocabularies ---------------------------------------------------------------


def test_tokenizer_json_byte_level_decodes_like_the_tokenizer(tmp_path):
    vocab = byte_level_vocabulary(tmp_path)
    tokenizer = tokenizer_from_json(byte_level_tokenizer_json())
    assert vocab.vocab_size == tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id(EOS_TEXT)
    assert vocab.eos_token_id == eos and vocab.special[eos]
    assert vocab.special.sum() == 1
    for text in MEMBERS + ["plain text, 東京 🍔 brûlée"]:
        ids = tokenizer.encode(text).ids
        assert vocab.decode(ids) == text.encode()
    assert sorted(set(b for t in vocab.token_bytes for b in t if len(t) == 1)) == list(range(256))


def test_tokenizer_json_sentencepiece_byte_fallback(tmp_path):
    from string_oracles import sentencepiece_tokenizer_json

    text = sentencepiece_tokenizer_json()
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    vocab = TokenVocabulary.from_tokenizer_json(path)
    tokenizer = tokenizer_from_json(text)
    assert vocab.eos_token_id == tokenizer.token_to_id("</s>")
    assert vocab.special[[0, 1, 2]].all()
    assert vocab.token_bytes[3 + 0xF0] == b"\xf0"
    for member in MEMBERS:
        ids = tokenizer.encode(member).ids
        assert vocab.decode(ids) == (" " + member).encode()  # Metaspace prepends "▁"
    # Characters the pieces lack go through byte fallback: <0xF0> <0x9F> ...
    ids = tokenizer.encode("😎").ids
    assert [vocab.token_bytes[i] for i in ids][-4:] == [bytes([b]) for b in "😎".encode()]
    members = [" " + m for m in MEMBERS]
    index = StringIndex.from_strings(members, vocab)
    eos = vocab.eos_token_id
    assert index.lookup_item_ids(
        [tokenizer.encode(m).ids + [eos] for m in MEMBERS]
    ).tolist() == list(range(len(MEMBERS)))
    _check_against_oracle(index, vocab, members, limit=30)


def _write_gguf(path, model, tokens, types, eos):
    gguf = pytest.importorskip("gguf", reason="the `gguf` package is optional")
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_eos_token_id(eos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_byte_level_and_sentencepiece(tmp_path):
    from static_keras.strings.byte_decoding import bytes_to_unicode

    table = bytes_to_unicode()
    pieces = [b"a", b"b", b" ab", "é".encode(), b"\xe6\x9d\xb1"]
    texts = ["".join(table[b] for b in p) for p in pieces] + ["<|end|>", "[PAD]"]
    _write_gguf(tmp_path / "bpe.gguf", "gpt2", texts, [1, 1, 1, 1, 1, 3, 4], eos=5)
    vocab = TokenVocabulary.load(tmp_path / "bpe.gguf")
    assert vocab.token_bytes[:5] == pieces
    assert vocab.eos_token_id == 5
    # user-defined: raw text; "[PAD]" is a padding row, special by default
    assert vocab.special.tolist() == [False] * 5 + [True, True]
    assert vocab.token_bytes[6] == b"[PAD]"
    as_text = TokenVocabulary.load(tmp_path / "bpe.gguf", padding_pattern=None)
    assert as_text.special.tolist() == [False] * 5 + [True, False]

    spm = ["<unk>", "<s>", "</s>", "<0x41>", "<0xE6>", "\u2581the", "he"]
    _write_gguf(tmp_path / "spm.gguf", "llama", spm, [2, 3, 3, 6, 6, 1, 1], eos=2)
    vocab = TokenVocabulary.from_gguf(tmp_path / "spm.gguf")
    assert vocab.token_bytes[3:] == [b"A", b"\xe6", b" the", b"he"]
    assert vocab.special.tolist() == [True, True, True, False, False, False, False]
    index = StringIndex.from_strings([" the", "A"], vocab)
    assert index.eos_token_id == 2
    assert index.lookup_item_ids([[5, 2], [3, 2]]).tolist() == [0, 1]


def test_gguf_metadata_reader_matches_the_gguf_package(tmp_path):
    gguf = pytest.importorskip("gguf", reason="the `gguf` package is optional")
    from static_keras.strings.gguf_metadata import read_gguf_metadata

    path = tmp_path / "meta.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "é", "", "<|end|>"])
    writer.add_token_types([1, 1, 1, 3])
    writer.add_eos_token_id(3)
    writer.add_float32("test.float", 0.5)
    writer.add_bool("test.flag", True)
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_tensor("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_gguf_metadata(path)
    reference = gguf.GGUFReader(str(path))
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):  # the reader's own header pseudo-fields
            continue
        value = ours[key]
        if field.types[0] == gguf.GGUFValueType.STRING:
            assert value == bytes(field.parts[field.data[0]])
        elif field.types[0] == gguf.GGUFValueType.ARRAY:
            parts = [field.parts[i] for i in field.data]
            if field.types[-1] == gguf.GGUFValueType.STRING:
                assert value == [bytes(p) for p in parts]
            else:
                np.testing.assert_array_equal(value, [p[0] for p in parts])
        else:
            assert value == field.parts[field.data[0]][0]
    assert ours["test.flag"] is True and ours["tokenizer.ggml.tokens"][2] == b""

    data = path.read_bytes()
    for bad, match in [
        (b"", "empty"),
        (b"GGML" + data[4:], "magic"),
        (data[:4] + (7).to_bytes(4, "little") + data[8:], "version 7"),
        (data[:40], "truncated"),
    ]:
        path.write_bytes(bad)
        with pytest.raises(ValueError, match=match):
            read_gguf_metadata(path)
    path.write_bytes(data[:40])
    with pytest.raises(ValueError, match="truncated"):
        TokenVocabulary.from_gguf(path)


def test_tiktoken_file(tmp_path):
    import base64

    tokens = [bytes([b]) for b in range(256)] + [b" the", b"th"]
    path = tmp_path / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    vocab = TokenVocabulary.load(path, special_tokens={"<|endoftext|>": 258})
    assert vocab.vocab_size == 259 and vocab.eos_token_id == 258
    assert vocab.token_bytes[256] == b" the" and vocab.special.tolist().count(True) == 1
    index = StringIndex.from_strings([" the"], vocab)
    assert index.lookup_item_ids([[256, 258]]).tolist() == [0]
    path.write_text("not base64!! x\n")
    with pytest.raises(ValueError, match="line 1"):
        TokenVocabulary.from_tiktoken(path)


def test_vocabulary_trie_is_built_once_and_reused(bpe):
    first = bpe.trie
    StringIndex.from_strings(["search"], bpe, eos_token_id=bpe.eos_token_id)
    StringIndex.from_strings(["get_weather"], bpe, eos_token_id=bpe.eos_token_id)
    assert bpe.trie is first


# Bad input ------------------------------------------------------------------


def test_bad_input_gets_clear_errors(bpe):
    eos = bpe.eos_token_id
    with pytest.raises(ValueError, match="empty"):
        StringIndex.from_strings([], bpe, eos_token_id=eos)
    with pytest.raises(ValueError, match=r"strings\[1\]` is the empty string"):
        StringIndex.from_strings(["a", ""], bpe, eos_token_id=eos)
    with pytest.raises(ValueError, match="not a single string"):
        StringIndex.from_strings("abc", bpe, eos_token_id=eos)
    with pytest.raises(ValueError, match=r"strings\[0\]` must be str or bytes"):
        StringIndex.from_strings([3], bpe, eos_token_id=eos)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        StringIndex.from_strings(["a"], bpe, eos_token_id=bpe.vocab_size)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        StringIndex.from_strings(["a"], bpe, eos_token_id=-1)
    with pytest.raises(ValueError, match="must be an int"):
        StringIndex.from_strings(["a"], bpe, eos_token_id=1.5)
    with pytest.raises(ValueError, match="`eos_token_id` is required"):
        StringIndex.from_strings(["a"], [b"a", b"b"])
    with pytest.raises(ValueError, match="too short"):
        StringIndex.from_strings(["get_weather_forecast"], bpe, eos_token_id=eos, max_length=3)
    with pytest.raises(ValueError, match="not valid Unicode"):
        StringIndex.from_strings(["\ud800"], bpe, eos_token_id=eos)


def test_bad_vocabularies_get_errors_that_name_them(tmp_path):
    with pytest.raises(ValueError, match="`vocabulary` must be a TokenVocabulary.*None"):
        StringIndex.from_strings(["a"], None)
    with pytest.raises(FileNotFoundError, match="No vocabulary file at .*missing.json"):
        StringIndex.from_strings(["a"], str(tmp_path / "missing.json"))
    not_a_tokenizer = tmp_path / "tools.json"
    not_a_tokenizer.write_text('{"tools": ["a", "b"]}')
    with pytest.raises(ValueError, match="tools.json' is not a Hugging Face tokenizer.json"):
        TokenVocabulary.load(not_a_tokenizer)
    tiktoken = tmp_path / "small.tiktoken"
    tiktoken.write_text("YQ== 0\nYg== 1\n")
    with pytest.raises(ValueError, match=r"eos_token_id=.*special_tokens="):
        StringIndex.from_strings(["ab"], TokenVocabulary.load(tiktoken))
    # An EOS that is a text token is excluded from text: the error says so.
    vocab = TokenVocabulary.from_token_bytes([b"a", b"b"])
    with pytest.raises(ValueError, match=r"cannot be spelled.*`eos_token_id`=0 is the text token"):
        StringIndex.from_strings(["a"], vocab, eos_token_id=0)
    with pytest.raises(ValueError, match="`padding_pattern` is not a valid regex"):
        TokenVocabulary.from_tokenizer_json(
            tokenizer_from_json(byte_level_tokenizer_json()), padding_pattern="[PAD"
        )


def test_padding_rows_of_tokenizer_json_are_special():
    config = json.loads(byte_level_tokenizer_json())
    size = 1 + max(config["model"]["vocab"].values())
    config["added_tokens"] = [
        {
            "id": size + i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
        for i, text in enumerate(["<pad>", "[PAD7]", "<unused3>", "getWeather"])
    ]
    vocab = TokenVocabulary.from_tokenizer_json(tokenizer_from_json(json.dumps(config)))
    assert vocab.special[size : size + 4].tolist() == [True, True, True, False]
    kept = TokenVocabulary.from_tokenizer_json(
        tokenizer_from_json(json.dumps(config)), padding_pattern=None
    )
    assert not kept.special[size : size + 4].any()


_QWEN2 = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "data", "vocab", "ggml-vocab-qwen2.gguf"
)


@pytest.mark.skipif(not os.path.isfile(_QWEN2), reason="needs ../shared/data/vocab (Qwen2 GGUF)")
def test_qwen2_padding_rows_never_spell_a_member():
    vocab = TokenVocabulary.load(_QWEN2)
    # Ids 151646 .. 151935 are `[PADnnnnnn]` user-defined rows, not text.
    assert vocab.token_bytes[151700] == b"[PAD151700]"
    assert vocab.special[151646:].all() and vocab.special.sum() == 3 + 290
    index = StringIndex.from_strings(["[PAD151700]", "get_weather"], vocab)
    for state, _, _ in explore(index, vocab):
        assert not index.allowed_tokens([state])[0, 151646:].any()
    as_text = TokenVocabulary.load(_QWEN2, padding_pattern=None)
    assert not as_text.special[151646:].any()


def test_unspellable_strings_are_named():
    vocab = TokenVocabulary.from_token_bytes([b"a", b"b", b"ab", b"<e>"], special=[3])
    with pytest.raises(ValueError, match=r"1 of the 2 strings cannot be spelled.*'abc'"):
        StringIndex.from_strings(["ab", "abc"], vocab, eos_token_id=3)
    only_special = TokenVocabulary.from_token_bytes([b"a", b"x", b"<e>"], special=[0, 2])
    with pytest.raises(ValueError, match="cannot be spelled"):
        StringIndex.from_strings(["a"], only_special, eos_token_id=2)
    with pytest.raises(ValueError, match="must be bytes"):
        TokenVocabulary.from_token_bytes(["a"])
    with pytest.raises(ValueError, match="eos_token_id"):
        TokenVocabulary.from_token_bytes([b"a"], eos_token_id=1)


def test_max_length_shorter_than_the_longest_tokenization(bpe):
    full = StringIndex.from_strings(["get_weather"], bpe, eos_token_id=bpe.eos_token_id)
    short = StringIndex.from_strings(
        ["get_weather"], bpe, eos_token_id=bpe.eos_token_id, max_length=6
    )
    assert full.length == len("get_weather") + 1 and short.length == 6
    assert short.step_widths == full.step_widths[:6]


# Files ----------------------------------------------------------------------


def test_save_load_round_trip_and_corruption(bpe, bpe_index, tmp_path):
    path = tmp_path / "strings.npz"
    bpe_index.save(path)
    loaded = StringIndex.load(path, vocabulary=bpe)
    assert loaded.layout == bpe_index.layout
    assert loaded.checksum == bpe_index.checksum
    assert loaded.strings == MEMBERS
    for name, array in bpe_index.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[name], array)
    other = TokenVocabulary.from_token_bytes([b"a"])
    with pytest.raises(ValueError, match="another vocabulary"):
        StringIndex.load(path, vocabulary=other)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt|checksum"):
        StringIndex.load(tmp_path / "bad.npz")
    with pytest.raises(FileNotFoundError):
        StringIndex.load(tmp_path / "missing.npz")
    np.save(tmp_path / "plain.npy", np.zeros(3))
    with pytest.raises(ValueError):
        StringIndex.load(tmp_path / "plain.npy")


def test_dtypes_are_narrow(bpe_index):
    arrays = bpe_index.arrays
    assert arrays["tokens"].dtype == np.uint16  # V = 420
    assert arrays["next_states"].dtype == np.uint8  # 156 states
    assert arrays["indptr"].dtype == np.int32
    assert arrays["member_item_ids"].dtype == np.int32


# Byte tries and docstrings --------------------------------------------------


def test_byte_trie_matches_a_dictionary_trie():
    rng = np.random.default_rng(0)
    for _ in range(50):
        strings = [
            bytes(rng.choice(list(b"ab\x00c"), int(rng.integers(1, 7))).tolist())
            for _ in range(int(rng.integers(1, 40)))
        ]
        unique, first, inverse = sort_unique(strings)
        assert unique == sorted(set(strings))
        assert [strings.index(u) for u in unique] == first.tolist()
        assert [unique[i] for i in inverse] == strings
        trie, ends = build_byte_trie(unique)
        prefixes = sorted(
            {s[:k] for s in unique for k in range(len(s) + 1)}, key=lambda p: (len(p), p)
        )
        assert trie.num_nodes == len(prefixes)
        ids = {p: i for i, p in enumerate(prefixes)}
        for prefix, node in ids.items():
            assert trie.walk(prefix) == node
            if prefix:
                assert trie.parent[node] == ids[prefix[:-1]] and trie.byte[node] == prefix[-1]
        assert [ids[s] for s in unique] == ends.tolist()
        assert np.all(np.diff(trie.keys) > 0)


def test_preorder_trie_matches_a_dictionary_trie():
    rng = np.random.default_rng(1)
    for _ in range(50):
        strings = {
            bytes(rng.choice(list(b"ab\x00c"), int(rng.integers(1, 7))).tolist())
            for _ in range(int(rng.integers(1, 40)))
        }
        unique = sorted(strings)
        offsets = np.cumsum([0] + [len(s) for s in unique]).astype(np.int64)
        flat = np.frombuffer(b"".join(unique), np.uint8)
        byte, depth, subtree_end, ends = kernels.preorder_trie(flat, offsets)
        # Preorder: the prefixes in sorted (lexicographic) order, root first.
        prefixes = sorted({s[:k] for s in unique for k in range(len(s) + 1)})
        assert byte.size == len(prefixes)
        ids = {p: i for i, p in enumerate(prefixes)}
        for prefix, node in ids.items():
            assert depth[node] == len(prefix)
            assert byte[node] == (prefix[-1] if prefix else 0)
            below = [q for q in prefixes if q.startswith(prefix)]
            assert subtree_end[node] == node + len(below)
        assert ends.tolist() == [ids[s] for s in unique]


def test_fill_bitmask_matches_allowed_tokens_with_wide_rows():
    # 256 single bytes and some pairs: the root allows more than 64 tokens,
    # so its row is precomputed ("wide"); ids 31, 63, ... use the sign bit.
    rng = np.random.default_rng(2)
    alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-_"
    pairs = {bytes(rng.choice(list(alphabet), 2).tolist()) for _ in range(300)}
    tokens = [bytes([b]) for b in range(256)] + sorted(pairs) + [b"<eos>"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[len(tokens) - 1])
    strings = [
        bytes(rng.choice(list(alphabet), int(rng.integers(1, 9))).tolist()) for _ in range(400)
    ]
    index = StringIndex.from_strings(strings, vocab, eos_token_id=len(tokens) - 1)
    states = np.concatenate([np.arange(index.num_states), [-1, index.num_states, 0, 0]])
    bitmask = index.fill_bitmask(states)
    assert index._bitmask_writer.wide_states >= 1  # the root at least
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, : vocab.vocab_size]
    np.testing.assert_array_equal(bits.astype(bool), index.allowed_tokens(states))
    assert not bits[-4:-2].any()  # states outside the index allow nothing
    out = np.full((states.size + 3, bitmask.shape[1]), -1, np.int32)
    index.fill_bitmask(states, out)
    np.testing.assert_array_equal(out[: states.size], bitmask)
    np.testing.assert_array_equal(out[states.size :], -1)  # rows past n untouched
    # Any int dtype and shape of states; int64 ids past int32 allow nothing.
    big = np.array([[0, 2**40], [-(2**40), 1]], np.int64)
    np.testing.assert_array_equal(
        index.fill_bitmask(big), index.fill_bitmask(np.array([0, -1, -1, 1], np.int32))
    )
    strided = np.repeat(states.astype(np.int32), 2)[::2]  # not contiguous: converted
    np.testing.assert_array_equal(index.fill_bitmask(strided, out)[: states.size], bitmask)
    with pytest.raises(ValueError, match="`out` must be a C-contiguous int32 array"):
        index.fill_bitmask(states, np.zeros((states.size, bitmask.shape[1]), np.float32))
    with pytest.raises(ValueError, match="`out` must be a C-contiguous int32 array"):
        index.fill_bitmask(states, np.zeros((2, bitmask.shape[1]), np.int32))
    with pytest.raises(ValueError, match="`out` must be a C-contiguous int32 array"):
        index.fill_bitmask(states[:2], np.zeros((bitmask.shape[1], 2), np.int32).T)


@pytest.mark.parametrize("wide_edges", [0, 3, 64, 10**9])
def test_bitmask_writer_exact_across_chunks_dtypes_and_wide_thresholds(wide_edges):
    # More rows than one zeroing chunk (128 KiB of rows), states repeated
    # and out of range, every state wide or none: the rows equal the oracle.
    rng = np.random.default_rng(5)
    alphabet = b"abcdefghijklmnopqrstuvwxyz .-"
    pairs = {bytes(rng.choice(list(alphabet), 2).tolist()) for _ in range(200)}
    tokens = [bytes([b]) for b in range(256)] + sorted(pairs) + [b"<eos>"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[len(tokens) - 1])
    strings = [
        bytes(rng.choice(list(alphabet), int(rng.integers(1, 7))).tolist()) for _ in range(300)
    ]
    index = StringIndex.from_strings(strings, vocab, eos_token_id=len(tokens) - 1)
    states = rng.integers(-3, index.num_states + 3, 3 * 2**17 // 64).astype(np.int32)
    expected = index.allowed_tokens(states)
    words = (vocab.vocab_size + 31) // 32
    indptr, edge_tokens = index.arrays["indptr"], index.arrays["tokens"]
    for indptr_dtype, tokens_dtype in ((np.int32, np.uint16), (np.int64, np.int64)):
        writer = kernels.BitmaskWriter(
            indptr.astype(indptr_dtype),
            edge_tokens.astype(tokens_dtype),
            vocab.vocab_size,
            wide_edges,
        )
        assert writer.wide_states == int((np.diff(indptr) > wide_edges).sum())
        out = np.full((states.size + 1, words), -1, np.int32)
        writer(states, out)
        bits = np.unpackbits(out.view(np.uint8), axis=1, bitorder="little")
        np.testing.assert_array_equal(bits[:-1, : vocab.vocab_size].astype(bool), expected)
        assert not bits[:-1, vocab.vocab_size :].any()
        np.testing.assert_array_equal(out[-1], -1)  # rows past n untouched


@pytest.mark.parametrize("vocab_size", [40, 2**20, 2**20 + 1])
def test_bitmask_writer_packs_small_states_at_any_vocabulary_size(vocab_size):
    # States of 0-5 edges (up to 3 tokens are kept in the state's entry: 20
    # bits each up to V = 2**20, 30 bits above), the largest ids included.
    rng = np.random.default_rng(vocab_size)
    rows = [sorted(rng.choice(vocab_size, n, replace=False).tolist()) for n in range(6)] * 3
    rows += [
        [vocab_size - 1],
        [0, vocab_size - 1],
        [vocab_size - 3, vocab_size - 2, vocab_size - 1],
    ]
    indptr = np.cumsum([0] + [len(r) for r in rows])
    edge_tokens = np.array([t for r in rows for t in r], np.int64)
    writer = kernels.BitmaskWriter(indptr, edge_tokens, vocab_size, 4)
    states = np.arange(-1, len(rows) + 1, dtype=np.int32)
    out = np.full((states.size, writer.words), -1, np.int32)
    writer(states, out)
    expected = np.zeros((states.size, writer.words * 32), np.uint8)
    for i, state in enumerate(states):
        if 0 <= state < len(rows):
            expected[i, rows[state]] = 1
    np.testing.assert_array_equal(
        np.unpackbits(out.view(np.uint8), axis=1, bitorder="little"), expected
    )


@pytest.mark.parametrize(
    "name",
    [
        "static_keras.strings.byte_decoding",
        "static_keras.strings.byte_trie",
        "static_keras.strings.vocabulary",
        "static_keras.strings.string_index",
        "static_keras.strings.logits_processor",
        "static_keras.strings.string_constrained_decoding",
    ],
)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# Long members -----------------------------------------------------------------


def _allowed_by_brute_force(members, vocabulary, prefix):
    """Tokens whose bytes extend `prefix` inside some member (every single byte
    of the alphabet is a token, so every such prefix is completable), plus
    EOS where `prefix` is a member."""
    out = set()
    for token in np.flatnonzero(vocabulary.text_tokens).tolist():
        extended = prefix + vocabulary.token_bytes[token]
        if any(m.startswith(extended) for m in members):
            out.add(token)
    if prefix in members:
        out.add(vocabulary.eos_token_id)
    return out


def test_members_longer_than_the_step_window_keep_exact_ranges_and_safe_widths():
    # 300 bytes: step counts of deep states span more than the 64-step window,
    # so widths past it are an upper bound; before it they stay exact.
    rng = np.random.default_rng(3)
    vocab = random_byte_vocabulary(3, size=40, alphabet=b"abc", max_len=5)
    members = [bytes(rng.choice(list(b"abc"), 300).tolist())]
    members += [
        bytes(rng.choice(list(b"abc"), int(rng.integers(1, 9))).tolist()) for _ in range(20)
    ]
    index = StringIndex.from_strings(members, vocab)
    assert index.length == 301  # the longest tokenization (one byte a token), then EOS
    for t, frontier in enumerate(reachable_by_step(index)):
        row, _, _ = index.edges(sorted(frontier))
        exact = max(1, int(np.bincount(row).max(initial=0)))
        assert index.step_widths[t] >= exact
        if t < 64:
            assert index.step_widths[t] == exact
    _check_against_oracle(index, vocab, members, limit=10)


def test_a_50000_character_member_compiles_in_linear_memory():
    rng = np.random.default_rng(4)
    vocab = random_byte_vocabulary(4, size=60, alphabet=b"abcd", max_len=4)
    long = bytes(rng.choice(list(b"abcd"), 50_000).tolist())
    members = [long] + [
        bytes(rng.choice(list(b"abcd"), int(rng.integers(1, 9))).tolist()) for _ in range(30)
    ]
    index = StringIndex.from_strings(members, vocab)
    assert index.length == 50_001
    member_set = set(members)
    # Random walks that follow the long member (a random allowed token each
    # step, preferring to stay on it), checked against brute force at sampled
    # depths and at the end.
    for seed in range(2):
        walk = np.random.default_rng(seed)
        state, prefix, step = 0, b"", 0
        while not index.is_finished([state])[0]:
            row, options, targets = index.edges([state])
            if step % 997 == 0 or len(long) - len(prefix) < 8:
                expected = _allowed_by_brute_force(member_set, vocab, prefix)
                assert set(options.tolist()) == expected, (step, len(prefix))
                assert index.step_widths[step] >= options.size
            on_long = [
                k
                for k, token in enumerate(options.tolist())
                if token != index.eos_token_id
                and long.startswith(prefix + vocab.token_bytes[token])
            ]
            pick = walk.choice(on_long) if on_long else walk.integers(options.size)
            if options[pick] != index.eos_token_id:
                prefix += vocab.token_bytes[int(options[pick])]
            state = int(targets[pick])
            step += 1
        assert prefix == long and index.strings[int(index.item_ids([state])[0])] == long.decode()
