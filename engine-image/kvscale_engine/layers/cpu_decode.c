/* Paged-attention decode on the CPU: each query reads its K/V straight through its block table.
 *
 * The CPU twin of paged_decode.py's Triton kernel, built by cpu_decode.py with the system C
 * compiler and called through ctypes (which releases the GIL for the call). Walk a sequence's
 * blocks in place, score a block's rows for the query heads that share a KV head (GQA), and keep
 * an online softmax, rescaling only when a row beats the running max. fp32 only. No gather, no
 * padding, no mask. Common (group, head_dim) pairs get their own compiled copy, sixteen lanes
 * wide where the CPU has AVX-512.
 *
 * Reading the cache: a step reads every layer's K/V once, far more than the caches hold, so the
 * wait is on DRAM, and blocks are scattered, so the hardware prefetcher cannot guess the next
 * one. The wide path takes a whole sequence per task (when there are at least two sequences per
 * thread), reads every KV head's rows of a block before moving on, so a block's rows are read
 * once and contiguous, and asks for the next block's rows a row at a time while it scores the
 * current one: asked for all at once, the requests filled the core's miss buffers and the
 * arithmetic waited behind them. 64 sequences x 150-500 tokens, 8 layers' caches in turn, two
 * threads: 14.7-16.1 -> 10.9-12.6 ms (the task per (sequence, KV head) and the block-at-once
 * prefetch before); a decode step of the bench model at 64 in flight 47.7 -> 44.1 ms, at 32 x
 * 1,000-2,000 tokens 61.1 -> 49.9 ms.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 16
#define MAX_DIM 256
#define MAX_BLOCK 64
#define MAX_HEADS 256  /* query heads */

static float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ask for one block's K and V rows of one KV head, a cache line at a time */
static inline __attribute__((always_inline)) void fetch_block(const float *k, const float *v, int32_t block,
                        int kv_head, int dim, int block_size, int kv_heads) {
    int64_t first = (int64_t)block * block_size;
    for (int t = 0; t < block_size; t++) {
        const float *kn = k + ((first + t) * kv_heads + kv_head) * dim;
        const float *vn = v + ((first + t) * kv_heads + kv_head) * dim;
        for (int d = 0; d < dim; d += 16) {
            __builtin_prefetch(kn + d);
            __builtin_prefetch(vn + d);
        }
    }
}

static inline __attribute__((always_inline)) void one(const float *q, const float *k, const float *v, float *out, const int32_t *table,
                int32_t ctx, int kv_head, int group, int dim, int block_size, int kv_heads,
                int window, float scale) {
    float m[MAX_GROUP], total[MAX_GROUP], acc[MAX_GROUP][MAX_DIM];
    float score[MAX_GROUP][MAX_BLOCK];
    for (int g = 0; g < group; g++) {
        m[g] = -FLT_MAX;
        total[g] = 0.0f;
        memset(acc[g], 0, sizeof(float) * dim);
    }
    const float *qh = q + (int64_t)kv_head * group * dim;  /* this KV head's query rows */
    int first = window > 0 && ctx > window ? ctx - window : 0;
    for (int start = first - first % block_size; start < ctx; start += block_size) {
        int lo = start < first ? first - start : 0;
        int hi = ctx - start < block_size ? ctx - start : block_size;
        int64_t base = (int64_t)table[start / block_size] * block_size;
        if (start + block_size < ctx)  /* the next block is elsewhere: fetch it ahead */
            fetch_block(k, v, table[start / block_size + 1], kv_head, dim, block_size, kv_heads);
        for (int g = 0; g < group; g++) {
            float best = m[g];
            for (int t = lo; t < hi; t++) {
                const float *kr = k + ((base + t) * kv_heads + kv_head) * dim;
                float s = dot(qh + g * dim, kr, dim) * scale;
                score[g][t] = s;
                if (s > best) best = s;
            }
            float c = expf(m[g] - best);  /* 0 on the first block (m = -FLT_MAX) */
            total[g] *= c;
            for (int d = 0; d < dim; d++) acc[g][d] *= c;
            m[g] = best;
        }
        for (int g = 0; g < group; g++) {
            float mg = m[g], sum = 0.0f, *sc = score[g];
#pragma omp simd reduction(+ : sum)
            for (int t = lo; t < hi; t++) {
                sc[t] = expf(sc[t] - mg);
                sum += sc[t];
            }
            total[g] += sum;
        }
        for (int t = lo; t < hi; t++) {
            const float *vr = v + ((base + t) * kv_heads + kv_head) * dim;
            for (int g = 0; g < group; g++) {
                float p = score[g][t], *a = acc[g];
#pragma omp simd
                for (int d = 0; d < dim; d++) a[d] += p * vr[d];
            }
        }
    }
    for (int g = 0; g < group; g++) {
        float inv = total[g] > 0.0f ? 1.0f / total[g] : 0.0f;
        float *o = out + ((int64_t)kv_head * group + g) * dim;
        for (int d = 0; d < dim; d++) o[d] = acc[g][d] * inv;
    }
}

#if defined(__AVX512F__)
#include <immintrin.h>

__m512 _ZGVeN16v_expf(__m512);  /* glibc's libmvec (in -lm): what -ffast-math's expf loops call */

/* sixteen vectors' horizontal sums as one vector: lane i holds the sum of v[i]'s lanes (45
 * shuffles and adds, against 16 x 8 for sixteen separate horizontal sums) */
static inline __attribute__((always_inline)) __m512 sums16(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

/* up to sixteen rows (lo..hi of the sixteen at kb/vb) of one KV head, for its `group` query
 * heads: the rows' scores go into one vector per query head, whose max, exponentials and sum are
 * vector operations; each K and V row is read once for the whole group. acc (group x dim,
 * unnormalised), m and total carry the online softmax from one call to the next. */
static inline __attribute__((always_inline)) void rows16(const float *qh, const float *kb, const float *vb,
                const float *kn, const float *vn, float *acc, float *m, float *total, int lo, int hi, int group, int dim,
                int64_t row, float scale) {
    enum { V = MAX_DIM / 16 };
    const int nv = dim / 16;
    __mmask16 live = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
    __m512 part[MAX_GROUP][16];
    float p[MAX_GROUP][16] __attribute__((aligned(64)));
    for (int t = 0; t < 16; t++) {
        if (t < lo || t >= hi) {
            for (int g = 0; g < group; g++) part[g][t] = _mm512_setzero_ps();
            continue;
        }
        const float *kr = kb + t * row;
        __m512 kv[V];
        for (int j = 0; j < nv; j++) kv[j] = _mm512_loadu_ps(kr + 16 * j);
        for (int g = 0; g < group; g++) {
            const float *qg = qh + g * dim;
            __m512 s = _mm512_mul_ps(_mm512_loadu_ps(qg), kv[0]);
            for (int j = 1; j < nv; j++) s = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * j), kv[j], s);
            part[g][t] = s;
        }
    }
    __m512 a[MAX_GROUP][V];
    for (int g = 0; g < group; g++) {
        for (int j = 0; j < nv; j++) a[g][j] = _mm512_loadu_ps(acc + g * dim + 16 * j);
        __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-FLT_MAX), live,
                                      _mm512_mul_ps(sums16(part[g]), _mm512_set1_ps(scale)));
        if (_mm512_mask_cmp_ps_mask(live, s, _mm512_set1_ps(m[g]), _CMP_GT_OQ)) {  /* a new max */
            float best = _mm512_reduce_max_ps(s);
            float c = expf(m[g] - best);  /* 0 on the first rows (m = -FLT_MAX) */
            total[g] *= c;
            for (int j = 0; j < nv; j++) a[g][j] = _mm512_mul_ps(a[g][j], _mm512_set1_ps(c));
            m[g] = best;
        }
        __m512 e = _mm512_maskz_mov_ps(live, _ZGVeN16v_expf(_mm512_sub_ps(s, _mm512_set1_ps(m[g]))));
        total[g] += _mm512_reduce_add_ps(e);
        _mm512_store_ps(p[g], e);
    }
    for (int t = lo; t < hi; t++) {
        const float *vr = vb + t * row;
        if (kn) /* the same row of the next rows to be read: asked for a few lines at a time */
            for (int d = 0; d < dim; d += 16) {
                __builtin_prefetch(kn + t * row + d);
                __builtin_prefetch(vn + t * row + d);
            }
        __m512 vv[V];
        for (int j = 0; j < nv; j++) vv[j] = _mm512_loadu_ps(vr + 16 * j);
        for (int g = 0; g < group; g++) {
            __m512 pg = _mm512_set1_ps(p[g][t]);
            for (int j = 0; j < nv; j++) a[g][j] = _mm512_fmadd_ps(pg, vv[j], a[g][j]);
        }
    }
    for (int g = 0; g < group; g++)
        for (int j = 0; j < nv; j++) _mm512_storeu_ps(acc + g * dim + 16 * j, a[g][j]);
}

/* one sequence's KV heads [h0, h1), sixteen lanes wide (head_dim a multiple of 16): block by
 * block, every head's rows of a block before the next block, so a block is read from memory
 * once, as contiguous rows when every head is wanted, while the next is fetched; out holds the
 * accumulators until the end */
static inline __attribute__((always_inline)) void heads16(const float *q, const float *k, const float *v, float *out,
                const int32_t *table, int32_t ctx, int h0, int h1, int group, int dim,
                int block_size, int kv_heads, int window, float scale) {
    const int64_t row = (int64_t)kv_heads * dim;
    float m[MAX_HEADS], total[MAX_HEADS];
    for (int i = h0 * group; i < h1 * group; i++) {
        m[i] = -FLT_MAX;
        total[i] = 0.0f;
    }
    memset(out + (int64_t)h0 * group * dim, 0, sizeof(float) * (h1 - h0) * group * dim);
    int first = window > 0 && ctx > window ? ctx - window : 0;
    for (int start = first - first % block_size; start < ctx; start += block_size) {
        int64_t base = (int64_t)table[start / block_size] * block_size;
        int64_t next = start + block_size < ctx ? (int64_t)table[start / block_size + 1] * block_size : -1;
        int rows = ctx - start < block_size ? ctx - start : block_size;
        for (int c0 = 0; c0 < rows; c0 += 16) {  /* sixteen rows at a time */
            int lo = start + c0 < first ? first - start - c0 : 0;
            int hi = rows - c0 < 16 ? rows - c0 : 16;
            if (lo >= hi) continue;
            for (int h = h0; h < h1; h++) {
                int64_t at = (int64_t)h * group;
                const float *kn = next < 0 ? 0 : k + (next + c0) * row + h * dim;
                const float *vn = next < 0 ? 0 : v + (next + c0) * row + h * dim;
                rows16(q + at * dim, k + (base + c0) * row + h * dim, v + (base + c0) * row + h * dim,
                       kn, vn, out + at * dim, m + at, total + at, lo, hi, group, dim, row, scale);
            }
        }
    }
    for (int i = h0 * group; i < h1 * group; i++) {
        float inv = total[i] > 0.0f ? 1.0f / total[i] : 0.0f;
        float *o = out + (int64_t)i * dim;
        for (int d = 0; d < dim; d++) o[d] *= inv;
    }
}
#define LANES 16
#else
#define LANES 1
#endif

/* how many rows the common shapes score at once: 16 where the build has AVX-512, else 1 */
int kvscale_decode_lanes(void) { return LANES; }

/* q, out: [batch, heads, dim]; k, v: [slots, kv_heads, dim]; tables: [batch, max_blocks];
 * lens: [batch]; all contiguous. Returns 0, or -1 when a size exceeds the stack buffers. */
int kvscale_paged_decode(const float *q, const float *k, const float *v, float *out,
                         const int32_t *tables, const int32_t *lens, int batch, int heads,
                         int kv_heads, int dim, int block_size, int max_blocks, int window,
                         float scale, int threads) {
    int group = heads / kv_heads;
    if (group > MAX_GROUP || dim > MAX_DIM || block_size > MAX_BLOCK || heads % kv_heads)
        return -1;
#if defined(__AVX512F__)
    if (heads <= MAX_HEADS && dim % 16 == 0 && (group == 1 || group == 4 || group == 8) &&
        (dim == 64 || dim == 128)) {
        /* a whole sequence per task when there are enough sequences to share out (a block's
         * rows are read once, contiguous); else one task per (sequence, KV head) */
        int per_head = batch < 2 * threads;
        int64_t tasks = per_head ? (int64_t)batch * kv_heads : batch;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
        for (int64_t i = 0; i < tasks; i++) {
            int b = (int)(per_head ? i / kv_heads : i);
            int h0 = per_head ? (int)(i % kv_heads) : 0, h1 = per_head ? h0 + 1 : kv_heads;
            const float *qb = q + (int64_t)b * heads * dim;
            float *ob = out + (int64_t)b * heads * dim;
            const int32_t *table = tables + (int64_t)b * max_blocks;
#define SEQ(G, D) heads16(qb, k, v, ob, table, lens[b], h0, h1, G, D, block_size, kv_heads, window, scale)
            if (dim == 64 && group == 4) SEQ(4, 64);
            else if (dim == 64 && group == 8) SEQ(8, 64);
            else if (dim == 128 && group == 4) SEQ(4, 128);
            else if (dim == 128 && group == 8) SEQ(8, 128);
            else if (dim == 64) SEQ(1, 64);
            else SEQ(1, 128);
#undef SEQ
        }
        return 0;
    }
#endif
    int64_t tasks = (int64_t)batch * kv_heads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < tasks; i++) {
        int b = (int)(i / kv_heads), h = (int)(i % kv_heads);
        one(q + (int64_t)b * heads * dim, k, v, out + (int64_t)b * heads * dim,
            tables + (int64_t)b * max_blocks, lens[b], h, group, dim, block_size, kv_heads, window,
            scale);
    }
    return 0;
}
