"""Incremental detokenisation and stop decisions for one sequence at a time.

Each step decodes only a short window of tokens (the previous window for context, as vLLM does,
so tokenizers that strip a leading space still join words correctly), so a step costs the same at
token 10 and token 10,000. The first window starts on the prompt's last tokens: a SentencePiece
(Metaspace) tokenizer drops the space of a sequence's first word, so without that context the
completion of "The capital of France is" would read "Paris" instead of " Paris".

What is emitted holds back a trailing partial UTF-8 character and any suffix that could still grow
into a stop string, so streamed text never contains a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

from kvscale_engine.engine.sequence import FinishReason, Sequence

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: Seq[int], skip_special_tokens: bool = True) -> str: ...


class Detokenizer:
    def __init__(self, decoder: Decoder, eos_token_id: int | None, max_model_len: int) -> None:
        self.decoder = decoder
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len

    def __call__(self, seq: Sequence) -> FinishReason | None:
        """Update `seq.text` after a new token; return why the sequence stops, if it does."""
        params = seq.params
        token = seq.last_token_id
        self._decode_new_token(seq)
        if params.stop and self._truncate_at_stop(seq):
            return "stop"
        if token == self.eos_token_id and not params.ignore_eos:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def emit(self, seq: Sequence, finished: bool) -> str:
        """The text that became final since the last call."""
        end = len(seq.text) if finished else self._stable_end(seq)
        delta = seq.text[seq.num_emitted_chars : end]
        seq.num_emitted_chars = max(end, seq.num_emitted_chars)
        return delta

    def _decode_new_token(self, seq: Sequence) -> None:
        ids = seq.token_ids
        prefix = self.decoder.decode(ids[seq.prefix_offset : seq.read_offset])
        new = self.decoder.decode(ids[seq.prefix_offset :])[len(prefix) :]
        if new.endswith(REPLACEMENT_CHAR):  # a partial character: keep the window open
            seq.text = seq.stable_text + new
            return
        seq.stable_text += new
        seq.text = seq.stable_text
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)

    def _truncate_at_stop(self, seq: Sequence) -> bool:
        start = max(seq.num_emitted_chars - seq.params.max_stop_len, 0)
        hits = [i for s in seq.params.stop if (i := seq.text.find(s, start)) >= 0]
        if not hits:
            return False
        seq.text = seq.text[: min(hits)]
        return True

    def _stable_end(self, seq: Sequence) -> int:
        text = seq.text
        end = len(text)
        while end > seq.num_emitted_chars and text[end - 1] == REPLACEMENT_CHAR:
            end -= 1
        hold = 0
        for stop in seq.params.stop:
            for k in range(min(len(stop) - 1, end), hold, -1):
                if text[end - k : end] == stop[:k]:
                    hold = k
                    break
        return max(end - hold, seq.num_emitted_chars)
