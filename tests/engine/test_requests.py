"""Request-level behaviour: sampling, stops, aborts, validation, stats and the offline API."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import GREEDY, random_prompts, run_to_completion

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.detokenizer import Detokenizer
from kvscale_engine.engine.device_memory import measure_peak
from kvscale_engine.engine.llm_engine import LLMEngine, RequestError
from kvscale_engine.engine.sequence import Sequence
from kvscale_engine.engine.tokenizer import EOS, Tokenizer, build_tokenizer
from kvscale_engine.llm import LLM
from kvscale_engine.sampling_params import SamplingParams

MakeEngine = Callable[..., LLMEngine]
PROMPT = random_prompts(1, (12, 12), seed=20)[0]


def generate(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[int]:
    return run_to_completion(engine, [prompt], params)["0"].output_token_ids


def test_seeded_sampling_does_not_depend_on_the_batch(make_engine: MakeEngine) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=16, seed=7)
    alone = generate(make_engine(), PROMPT, params)
    crowd = [*random_prompts(5, (3, 40), seed=21), PROMPT]
    crowded = run_to_completion(make_engine(), crowd, params)["5"].output_token_ids
    other_seed = generate(make_engine(), PROMPT, SamplingParams(max_tokens=16, seed=8))
    assert alone == crowded
    assert alone != other_seed


def test_top_k_one_is_greedy(make_engine: MakeEngine) -> None:
    greedy = generate(make_engine(), PROMPT, GREEDY)
    top1 = generate(make_engine(), PROMPT, SamplingParams(temperature=0.8, top_k=1, max_tokens=24))
    assert top1 == greedy


def test_stop_string_is_cut_from_text_and_stream(make_engine: MakeEngine) -> None:
    full = run_to_completion(make_engine(), [PROMPT])["0"].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3
    engine = make_engine()
    engine.add_request("r", PROMPT, SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]))
    deltas: list[str] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas.append(out.delta_text)
            final = out
    assert final.finish_reason == "stop"
    assert final.text == full[: full.index(stop)]
    assert "".join(deltas) == final.text
    assert stop not in final.text


def test_stop_token_id_ends_the_request(make_engine: MakeEngine) -> None:
    # EOS ignored, so the reference has 24 tokens whatever the seeded weights say
    no_eos = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    greedy = generate(make_engine(), PROMPT, no_eos)
    stop_id = greedy[4]
    params = SamplingParams(
        temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop_id]
    )
    out = run_to_completion(make_engine(), [PROMPT], params)["0"]
    assert out.output_token_ids == greedy[: greedy.index(stop_id) + 1]
    assert out.finish_reason == "stop"


def test_eos_stops_unless_ignored(make_engine: MakeEngine) -> None:
    prompts = random_prompts(32, (1, 120), seed=1)
    stopped = [
        (int(k), o)
        for k, o in run_to_completion(make_engine(), prompts).items()
        if o.finish_reason == "stop"
    ]
    assert stopped, "the fixture checkpoint should emit EOS for one of these prompts"
    index, out = stopped[0]
    eos = make_engine().tokenizer.eos_token_id
    assert out.output_token_ids[-1] == eos
    ignoring = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    longer = run_to_completion(make_engine(), [prompts[index]], ignoring)["0"]
    assert longer.finish_reason == "length"
    assert len(longer.output_token_ids) == 24


def test_abort_frees_blocks_at_once(make_engine: MakeEngine) -> None:
    engine = make_engine()
    for i, prompt in enumerate(random_prompts(3, (40, 40), seed=22)):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=50))
    engine.step()
    engine.step()
    free_before = engine.stats().num_free_blocks
    engine.abort_request("1")
    assert engine.stats().num_free_blocks == free_before + 3
    aborted = [o for o in engine.step() if o.request_id == "1"]
    assert aborted and aborted[0].finished and aborted[0].finish_reason == "abort"
    engine.abort_request("unknown")  # a no-op
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_stats_count_tokens_and_cache(make_engine: MakeEngine) -> None:
    engine = make_engine(max_num_seqs=1)
    shared = random_prompts(1, (40, 40), seed=23)[0]
    prompts = [[*shared, 7], [*shared, 9]]
    finals = run_to_completion(engine, prompts)
    stats = engine.stats()
    assert stats.prompt_tokens == 82
    assert stats.generation_tokens == sum(len(o.output_token_ids) for o in finals.values())
    assert stats.prefix_cache_queries == 82
    assert stats.prefix_cache_hits == 32  # two full 16-token blocks of the shared prefix
    assert finals["1"].num_cached_tokens == 32
    assert stats.num_running == stats.num_waiting == 0
    assert stats.kv_cache_usage == 0.0
    assert finals["0"].first_scheduled_time is not None


def test_invalid_requests_are_refused(make_engine: MakeEngine) -> None:
    engine = make_engine(max_model_len=64, num_kv_blocks=8)
    with pytest.raises(RequestError, match="max_model_len"):
        engine.add_request("long", list(range(5, 70)), GREEDY)
    with pytest.raises(RequestError, match="at least one token"):
        engine.add_request("empty", [], GREEDY)
    with pytest.raises(RequestError, match="KV blocks"):
        make_engine(max_model_len=512, num_kv_blocks=2).add_request("big", [5] * 40, GREEDY)
    engine.add_request("dup", [5, 6], GREEDY)
    with pytest.raises(RequestError, match="already in flight"):
        engine.add_request("dup", [5, 6], GREEDY)


def test_offline_llm_api_takes_text_and_tokens(llama_dir: Path) -> None:
    llm = LLM(str(llama_dir), max_model_len=256, num_kv_blocks=64)
    prompt = llm.engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert prompt.endswith("<|assistant|>\n")
    outs = llm.generate([prompt, [5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=5))
    assert [len(o.token_ids) for o in outs] == [5, 5]
    assert outs[0].text == llm.engine.tokenizer.decode(outs[0].token_ids)


def test_kv_pool_is_sized_from_the_memory_budget(llama_dir: Path) -> None:
    config = EngineConfig(str(llama_dir), max_model_len=256, max_num_seqs=4, memory_fraction=0.5)
    engine = LLMEngine(config)
    budget = engine.model_runner.budget
    assert budget is not None and budget.weight_bytes > 0 and budget.activation_bytes > 0
    assert engine.block_manager.num_total_blocks == 4 * config.max_blocks_per_seq  # capped


def test_incremental_text_equals_a_full_decode() -> None:
    """Windowed decoding matches decoding everything, split characters and specials included."""
    backend = build_tokenizer()
    tokenizer = Tokenizer(backend, backend.token_to_id(EOS))
    detokenizer = Detokenizer(tokenizer, None, max_model_len=10**6)
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(backend.get_vocab_size()) for _ in range(rng.randint(1, 60))]
        seq = Sequence("r", [5], SamplingParams(max_tokens=10**6))
        for token in ids:
            seq.append_token(token)
            detokenizer(seq)
        assert seq.text == tokenizer.decode(ids)


def test_activation_peak_is_measured_on_the_cpu() -> None:
    with measure_peak(torch.device("cpu")) as peak:
        block = torch.ones(16 * 2**20)  # 64 MiB, touched
        del block
    assert peak.bytes is not None and peak.bytes >= 60 * 2**20


def test_waste_figure_counts_unused_slots_of_allocated_blocks(make_engine: MakeEngine) -> None:
    engine = make_engine()
    engine.add_request("r", list(range(5, 25)), GREEDY)  # 20 prompt tokens, blocks of 16
    engine.step()
    stats = engine.stats()
    assert (stats.kv_allocated_slots, stats.kv_used_slots) == (32, 20)
    assert stats.kv_waste_slots == 12 and stats.kv_waste_fraction == 12 / 32
    assert stats.kv_cache_usage == 2 / engine.block_manager.num_total_blocks


def test_chat_template_from_a_named_list_or_a_jinja_file(llama_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "generation_config.json"):
        (tmp_path / name).write_bytes((llama_dir / name).read_bytes())
    config = json.loads((llama_dir / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    (tmp_path / "chat_template.jinja").write_text(template)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": "hi"}]
    expected = Tokenizer.from_dir(llama_dir).apply_chat_template(messages)
    assert Tokenizer.from_dir(tmp_path).apply_chat_template(messages) == expected
    config["chat_template"] = [
        {"name": "tool_use", "template": "x"},
        {"name": "default", "template": template},
    ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_dir(tmp_path).apply_chat_template(messages) == expected
