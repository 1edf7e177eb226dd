"""Incremental text: stop strings cut and never streamed, partial characters held, spaces kept."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import pytest
import tokenizers

from kvscale_engine.engine.detokenizer import Detokenizer
from kvscale_engine.engine.sequence import Sequence
from kvscale_engine.engine.tokenizer import Tokenizer
from kvscale_engine.sampling_params import SamplingParams

EOS = 0


class CharDecoder:
    """Token t decodes to chr(t); token 1 to a replacement char (a split UTF-8 sequence)."""

    def decode(self, token_ids: Seq[int], skip_special_tokens: bool = True) -> str:
        return "".join("\ufffd" if t == 1 else chr(t) for t in token_ids if t != EOS)


def feed(text: str, params: SamplingParams, max_model_len: int = 100) -> tuple[list[str], Sequence]:
    detok = Detokenizer(CharDecoder(), EOS, max_model_len)
    seq = Sequence("r", [65], params)
    deltas = []
    for char in text:
        seq.append_token(ord(char) if char != "\ufffd" else 1)
        reason = detok(seq)
        seq.finish_reason = reason
        deltas.append(detok.emit(seq, finished=reason is not None))
        if reason:
            break
    return deltas, seq


def test_stop_string_is_cut_and_never_streamed() -> None:
    deltas, seq = feed("hello END world", SamplingParams(stop=["END"], max_tokens=50))
    assert seq.finish_reason == "stop"
    assert "".join(deltas) == "hello " == seq.text
    assert all("E" not in d for d in deltas)


def test_a_near_miss_is_released_once_it_cannot_be_a_stop() -> None:
    deltas, seq = feed("EN!x", SamplingParams(stop=["END"], max_tokens=4))
    assert deltas[:2] == ["", ""]
    assert deltas[2] == "EN!"
    assert seq.finish_reason == "length" and "".join(deltas) == "EN!x"


def test_partial_characters_are_held_back() -> None:
    deltas, _ = feed("a\ufffdb", SamplingParams(max_tokens=3))
    assert deltas == ["a", "", "\ufffdb"]


def test_eos_stop_ids_and_length() -> None:
    detok = Detokenizer(CharDecoder(), EOS, max_model_len=4)
    seq = Sequence("r", [65], SamplingParams(max_tokens=10, stop_token_ids=[66]))
    seq.append_token(EOS)
    assert detok(seq) == "stop"
    ignoring = Sequence("r", [65], SamplingParams(max_tokens=10, ignore_eos=True))
    ignoring.append_token(EOS)
    assert detok(ignoring) is None
    seq = Sequence("r", [65], SamplingParams(max_tokens=10, stop_token_ids=[66]))
    seq.append_token(66)
    assert detok(seq) == "stop"
    seq = Sequence("r", [65, 65], SamplingParams(max_tokens=10))
    seq.append_token(67)
    assert detok(seq) is None
    seq.append_token(67)
    assert detok(seq) == "length"  # max_model_len


def _metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style BPE (Metaspace, as Llama-2 and Mistral) trained on a few lines."""
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    backend.decoder = tokenizers.decoders.Metaspace()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    corpus = [
        "The capital of France is Paris.",
        "The capital of Italy is Rome, and the capital of Spain is Madrid.",
        "Paris is a city in France; Rome is a city in Italy.",
    ] * 20
    backend.train_from_iterator(corpus, trainer)
    return Tokenizer(backend, backend.token_to_id("</s>"))


@pytest.mark.parametrize(
    ("prompt", "completion"),
    [
        ("The capital of France is", " Paris, and the capital of Italy is Rome."),
        ("The capital of", " Spain is Madrid."),
        ("Rome is a city in", " Italy; Paris is a city in France."),
    ],
)
def test_sentencepiece_text_keeps_the_space_before_the_first_word(
    prompt: str, completion: str
) -> None:
    tok = _metaspace_tokenizer()
    prompt_ids = tok.encode(prompt)
    output_ids = tok.encode(prompt + completion)[len(prompt_ids) :]
    assert tok.encode(prompt + completion)[: len(prompt_ids)] == prompt_ids
    expected = tok.decode(prompt_ids + output_ids)[len(tok.decode(prompt_ids)) :]
    assert expected.startswith(" ")  # the tokenizer itself keeps the space in context

    detok = Detokenizer(tok, tok.eos_token_id, max_model_len=100)
    seq = Sequence("r", prompt_ids, SamplingParams(max_tokens=len(output_ids)))
    streamed = []
    for token in output_ids:
        seq.append_token(token)
        seq.finish_reason = detok(seq)
        streamed.append(detok.emit(seq, finished=seq.finish_reason is not None))
    assert seq.finish_reason == "length"
    assert "".join(streamed) == expected  # what a streaming client reads
    assert seq.text == expected  # what a non-streaming response holds
