"""A request's state inside the engine: its tokens, its block table and how much KV is computed.

`num_computed_tokens` counts tokens whose KV is in the cache. The next step feeds tokens from
there on; a step that reaches the end of `token_ids` samples one new token. Preemption by
recompute simply resets the block table and `num_computed_tokens`.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Literal

from kvscale_engine.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort"]
DETOKENIZE_CONTEXT_TOKENS = 5  # prompt tokens the first decode window starts with (as vLLM)


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float = 0.0,
        traffic_class: str = "",
        preemptible: bool = False,
    ) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.arrival_time = arrival_time
        self.traffic_class = traffic_class  # a label, for counting preemptions by class
        self.preemptible = preemptible  # deferred work: a more important arrival may preempt it
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_hashed_blocks = 0
        self.last_block_hash: int | None = None
        self.first_scheduled_time: float | None = None
        self.waiting_steps = 0
        self.finish_reason: FinishReason | None = None
        # detokenizer state: text decoded so far (a pending partial character included), the
        # part of it that is final, and the window of `token_ids` the next decode starts from;
        # the window opens on the prompt's last tokens, so the first output token is decoded in
        # context (a SentencePiece tokenizer keeps the space before the first word)
        self.text = ""
        self.stable_text = ""
        self.read_offset = self.num_prompt_tokens
        self.prefix_offset = max(self.num_prompt_tokens - DETOKENIZE_CONTEXT_TOKENS, 0)
        self.num_emitted_chars = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        self.block_table = []
        self.num_computed_tokens = 0
        self.num_hashed_blocks = 0
        self.last_block_hash = None
        self.status = SequenceStatus.WAITING
