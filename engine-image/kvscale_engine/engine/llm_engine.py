"""The engine: each step schedules a batch, runs the model and folds the tokens back in.

Not thread-safe: call `add_request`, `abort_request` and `step` from one thread (the server
runs them in its engine's process, `server/engine_process.py`, or on its engine thread,
`server/engine_thread.py`), so a step never sees a request vanish half-way.
"""

from __future__ import annotations

import time
from collections import Counter

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.block_manager import BlockManager
from kvscale_engine.engine.detokenizer import Detokenizer
from kvscale_engine.engine.model_runner import ModelRunner
from kvscale_engine.engine.outputs import EngineStats, RequestOutput
from kvscale_engine.engine.scheduler import ScheduledBatch, Scheduler
from kvscale_engine.engine.sequence import Sequence
from kvscale_engine.engine.tokenizer import load_tokenizer
from kvscale_engine.model_config import ModelConfig
from kvscale_engine.sampling_params import SamplingParams


class RequestError(ValueError):
    """A request the engine can never serve (too long, duplicate id, empty prompt)."""


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_config = ModelConfig.from_source(config.model_source)
        self.tokenizer = load_tokenizer(config)
        self.model_runner = ModelRunner(config, self.model_config)
        self.block_manager = BlockManager(
            self.model_runner.num_kv_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.cache_salt,
        )
        self.scheduler = Scheduler(config, self.block_manager)
        self.detokenizer = Detokenizer(
            self.tokenizer, self.tokenizer.eos_token_id, config.max_model_len
        )
        self.requests: dict[str, Sequence] = {}
        self.aborted: list[Sequence] = []
        self.prompt_tokens = 0

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        traffic_class: str = "",
        preemptible: bool = False,
    ) -> None:
        self._validate(request_id, prompt_token_ids, params)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seq = Sequence(
            request_id, prompt_token_ids, params, priority, arrival, traffic_class, preemptible
        )
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        self.prompt_tokens += len(prompt_token_ids)

    def abort_request(self, request_id: str) -> None:
        seq = self.requests.pop(request_id, None)
        if seq is not None:
            self.scheduler.abort(seq)
            self.aborted.append(seq)

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        token_ids = self.model_runner.run(batch) if batch else []
        self.scheduler.postprocess(batch, token_ids, self.detokenizer)
        return self._outputs(batch)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.aborted)

    def stats(self) -> EngineStats:
        running = self.scheduler.running
        bm = self.block_manager
        return EngineStats(
            num_running=len(running),
            num_waiting=len(self.scheduler.waiting),
            num_total_blocks=bm.num_total_blocks,
            num_free_blocks=bm.num_free_blocks,
            num_preemptions=self.scheduler.num_preemptions,
            preemptions_by_class=dict(self.scheduler.preemptions_by_class),
            waiting_by_class=dict(Counter(s.traffic_class for s in self.scheduler.waiting)),
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.scheduler.generation_tokens,
            computed_tokens=self.scheduler.computed_tokens,
            block_size=bm.block_size,
            kv_allocated_slots=sum(len(s.block_table) for s in running) * bm.block_size,
            kv_used_slots=sum(s.num_computed_tokens for s in running),
        )

    def _outputs(self, batch: ScheduledBatch) -> list[RequestOutput]:
        outputs = [self._output(seq, [seq.last_token_id]) for seq in _sampled(batch)]
        outputs += [self._output(seq, []) for seq in self.aborted]
        self.aborted = []
        for out in outputs:
            if out.finished:
                self.requests.pop(out.request_id, None)
        return outputs

    def _output(self, seq: Sequence, new_token_ids: list[int]) -> RequestOutput:
        delta = self.detokenizer.emit(seq, seq.is_finished)
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_token_ids,
            output_token_ids=seq.output_token_ids,
            delta_text=delta,
            text=seq.text[: seq.num_emitted_chars],
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            first_scheduled_time=seq.first_scheduled_time,
        )

    def _validate(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in flight")
        if not prompt:
            raise RequestError("prompt must contain at least one token")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt token ids must lie in [0, {vocab})")
        if len(prompt) >= self.config.max_model_len:
            raise RequestError(
                f"prompt has {len(prompt)} tokens; max_model_len {self.config.max_model_len} "
                "leaves no room to generate"
            )
        longest = min(len(prompt) + params.max_tokens, self.config.max_model_len)
        needed = self.block_manager.blocks_needed(longest)
        if needed > self.block_manager.num_total_blocks:
            raise RequestError(
                f"request may grow to {longest} tokens ({needed} KV blocks) but the pool has "
                f"{self.block_manager.num_total_blocks} blocks"
            )


def _sampled(batch: ScheduledBatch) -> list[Sequence]:
    return [item.seq for item in batch.seqs if item.samples]
