/* Paged-attention decode on the CPU: each query reads its K/V straight through its block table.
 *
 * The CPU twin of paged_decode.py's Triton kernel, built by cpu_decode.py with the system C
 * compiler and called through ctypes (which releases the GIL for the call). One task per
 * (sequence, KV head): walk the sequence's blocks in place, score a block's rows for the query
 * heads that share the KV head (GQA), and keep an online softmax, rescaling once per block.
 * fp32 only. No gather, no padding, no mask. Blocks are scattered, so the hardware prefetcher
 * cannot guess the next one: each block asks for the next block's rows while it works, and
 * common (group, head_dim) pairs get their own compiled copy. At 64 sequences x 150-500 tokens
 * (8 heads, 2 KV heads, head_dim 64, one thread) those two took a layer from 3.5 to 1.4 ms.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 16
#define MAX_DIM 256
#define MAX_BLOCK 64

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

/* one(), sixteen lanes wide (head_dim a multiple of 16): up to 16 rows of a block are scored
 * into one vector per query head, whose max, exponentials and sum are vector operations, and
 * the query and the accumulators stay in registers */
static inline __attribute__((always_inline)) void one16(const float *q, const float *k, const float *v, float *out, const int32_t *table,
                int32_t ctx, int kv_head, int group, int dim, int block_size, int kv_heads,
                int window, float scale) {
    enum { V = MAX_DIM / 16 };
    const int nv = dim / 16;
    const int64_t row = (int64_t)kv_heads * dim;
    __m512 qv[MAX_GROUP][V], acc[MAX_GROUP][V];
    float m[MAX_GROUP], total[MAX_GROUP];
    float p[MAX_GROUP][16] __attribute__((aligned(64)));
    const float *qh = q + (int64_t)kv_head * group * dim;
    for (int g = 0; g < group; g++) {
        m[g] = -FLT_MAX;
        total[g] = 0.0f;
        for (int j = 0; j < nv; j++) {
            qv[g][j] = _mm512_loadu_ps(qh + g * dim + 16 * j);
            acc[g][j] = _mm512_setzero_ps();
        }
    }
    int first = window > 0 && ctx > window ? ctx - window : 0;
    for (int start = first - first % block_size; start < ctx; start += block_size) {
        int64_t base = (int64_t)table[start / block_size] * block_size;
        if (start + block_size < ctx)  /* the next block is elsewhere: fetch it ahead */
            fetch_block(k, v, table[start / block_size + 1], kv_head, dim, block_size, kv_heads);
        int rows = ctx - start < block_size ? ctx - start : block_size;
        for (int c0 = 0; c0 < rows; c0 += 16) {  /* sixteen rows at a time */
            int lo = start + c0 < first ? first - start - c0 : 0;
            int hi = rows - c0 < 16 ? rows - c0 : 16;
            if (lo >= hi) continue;
            __mmask16 live = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
            const float *kb = k + (base + c0) * row + kv_head * dim;
            const float *vb = v + (base + c0) * row + kv_head * dim;
            for (int g = 0; g < group; g++) {
                __m512 part[16];
                for (int t = 0; t < 16; t++) {
                    if (t < lo || t >= hi) {
                        part[t] = _mm512_setzero_ps();
                        continue;
                    }
                    const float *kr = kb + t * row;
                    __m512 s = _mm512_mul_ps(qv[g][0], _mm512_loadu_ps(kr));
                    for (int j = 1; j < nv; j++)
                        s = _mm512_fmadd_ps(qv[g][j], _mm512_loadu_ps(kr + 16 * j), s);
                    part[t] = s;
                }
                __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-FLT_MAX), live,
                                              _mm512_mul_ps(sums16(part), _mm512_set1_ps(scale)));
                float best = _mm512_reduce_max_ps(s);
                if (best < m[g]) best = m[g];
                float c = expf(m[g] - best);  /* 0 on the first block (m = -FLT_MAX) */
                __m512 e = _mm512_maskz_mov_ps(
                    live, _ZGVeN16v_expf(_mm512_sub_ps(s, _mm512_set1_ps(best))));
                total[g] = total[g] * c + _mm512_reduce_add_ps(e);
                _mm512_store_ps(p[g], e);
                for (int j = 0; j < nv; j++) acc[g][j] = _mm512_mul_ps(acc[g][j], _mm512_set1_ps(c));
                m[g] = best;
            }
            for (int t = lo; t < hi; t++) {
                const float *vr = vb + t * row;
                __m512 vv[V];
                for (int j = 0; j < nv; j++) vv[j] = _mm512_loadu_ps(vr + 16 * j);
                for (int g = 0; g < group; g++) {
                    __m512 pg = _mm512_set1_ps(p[g][t]);
                    for (int j = 0; j < nv; j++) acc[g][j] = _mm512_fmadd_ps(pg, vv[j], acc[g][j]);
                }
            }
        }
    }
    for (int g = 0; g < group; g++) {
        __m512 inv = _mm512_set1_ps(total[g] > 0.0f ? 1.0f / total[g] : 0.0f);
        float *o = out + ((int64_t)kv_head * group + g) * dim;
        for (int j = 0; j < nv; j++) _mm512_storeu_ps(o + 16 * j, _mm512_mul_ps(acc[g][j], inv));
    }
}
#define WIDE one16  /* head_dim a multiple of 16 */
#define LANES 16
#else
#define WIDE one
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
    int64_t tasks = (int64_t)batch * kv_heads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < tasks; i++) {
        int b = (int)(i / kv_heads), h = (int)(i % kv_heads);
        const float *qb = q + (int64_t)b * heads * dim;
        float *ob = out + (int64_t)b * heads * dim;
        const int32_t *table = tables + (int64_t)b * max_blocks;
        /* common shapes get a copy compiled for their constants (unrolled, accumulators kept in
         * registers), sixteen lanes wide where the CPU has AVX-512; any other shape takes the
         * general one */
#define ONE(F, G, D) F(qb, k, v, ob, table, lens[b], h, G, D, block_size, kv_heads, window, scale)
        if (dim == 64 && group == 4) ONE(WIDE, 4, 64);
        else if (dim == 64 && group == 8) ONE(WIDE, 8, 64);
        else if (dim == 128 && group == 4) ONE(WIDE, 4, 128);
        else if (dim == 128 && group == 8) ONE(WIDE, 8, 128);
        else if (dim == 64 && group == 1) ONE(WIDE, 1, 64);
        else if (dim == 128 && group == 1) ONE(WIDE, 1, 128);
        else ONE(one, group, dim);
#undef ONE
    }
    return 0;
}
