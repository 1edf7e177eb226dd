/* The decoder's small per-layer ops on the CPU, one call each instead of a chain of torch ops.
 *
 * At one sequence in flight a decode step of the benchmark's model spent about a seventh of its
 * time dispatching some 1,100 torch ops (most of the rest is the GEMMs reading the weights):
 * RMSNorm was eight ops (17 us), the rotary embedding of q and k fourteen (about 40 us a layer).
 * Built by cpu_ops.py with the system C compiler and called through ctypes while holding the GIL
 * (each call takes microseconds; releasing the GIL for it would hand the engine's thread to the
 * event loop's). fp32, one thread: at prefill sizes these are still a small part of a step.
 *
 * Compiled without -ffast-math and with -ffp-contract=off: the rotary embedding is bit for bit
 * what torch computes (x * cos + rotate_half(x) * sin, each product and the sum rounded), and
 * RMSNorm differs from torch's only in the order its sum of squares adds up.
 */
#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define LANES 16

/* out[r] = weight * (x[r] * 1 / sqrt(mean(x[r]^2) + eps)), as Hugging Face's LlamaRMSNorm */
void kvscale_rms_norm(const float *restrict x, int64_t x_stride, const float *restrict weight,
                      float *restrict out, int64_t rows, int n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * n;
        float acc[LANES] = {0};
        int i = 0;
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += xr[i + j] * xr[i + j];
        float sum = 0.0f;
        for (; i < n; i++) sum += xr[i] * xr[i];
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) acc[j] += acc[j + w];
        sum += acc[0];
        float inv = 1.0f / sqrtf(sum / (float)n + eps);
        for (int k = 0; k < n; k++) o[k] = weight[k] * (xr[k] * inv);
    }
}

/* Rotates `heads` heads of `dim` at each of `rows` rows of x in place (row r at x + r *
 * row_stride, its heads contiguous) by cos and sin ([rows, dim], the same for every head):
 * x * cos + rotate_half(x) * sin, where rotate_half(x) = cat(-x[half:], x[:half]). */
void kvscale_rope(float *restrict x, int64_t row_stride, const float *restrict cos,
                  const float *restrict sin, int64_t rows, int heads, int dim) {
    int half = dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * dim, *s = sin + r * dim;
        for (int h = 0; h < heads; h++) {
            float *p = x + r * row_stride + (int64_t)h * dim;
            for (int i = 0; i < half; i++) {
                float a = p[i], b = p[i + half];
                float lo = a * c[i], lo_rot = b * s[i];
                float hi = b * c[i + half], hi_rot = a * s[i + half];
                p[i] = lo - lo_rot;
                p[i + half] = hi + hi_rot;
            }
        }
    }
}

/* Writes each of `rows` rows' K and V (width floats, at k + r * k_stride and v + r * v_stride)
 * to the caches' row slots[r]: the two index_copy_ calls of a layer's cache write as one.
 * Returns -1, having written nothing, when a slot is outside [0, num_slots). */
int kvscale_kv_write(const float *restrict k, int64_t k_stride, const float *restrict v,
                     int64_t v_stride, float *restrict k_cache, float *restrict v_cache,
                     const int64_t *restrict slots, int64_t rows, int width, int64_t num_slots) {
    for (int64_t r = 0; r < rows; r++)
        if (slots[r] < 0 || slots[r] >= num_slots) return -1;
    for (int64_t r = 0; r < rows; r++) {
        float *kd = k_cache + slots[r] * width, *vd = v_cache + slots[r] * width;
        const float *ks = k + r * k_stride, *vs = v + r * v_stride;
        for (int i = 0; i < width; i++) kd[i] = ks[i];
        for (int i = 0; i < width; i++) vd[i] = vs[i];
    }
    return 0;
}

#ifdef __AVX512F__
/* e^x for 16 floats: x = n ln2 + r, e^r by Cephes' degree-7 polynomial, times 2^n by scalef
 * (which also takes overflow to inf and underflow to 0). Within 2 ulp of expf; NaN stays NaN. */
static inline __m512 exp16(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.7228391f), lo = _mm512_set1_ps(-103.972084f);
    x = _mm512_max_ps(lo, _mm512_min_ps(hi, x)); /* NaN passes: min/max return their 2nd */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

/* The MLP's SwiGLU on the fused gate/up projection: out[r][j] = silu(g) * u, where g and u are
 * row r's columns j and n + j of gu (rows at gu + r * stride), silu(g) = g / (1 + e^-g) as torch
 * computes it. One pass instead of torch's silu and mul (two passes and a temporary). */
void kvscale_silu_mul(const float *restrict gu, int64_t stride, float *restrict out,
                      int64_t rows, int n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * stride, *u = g + n;
        float *o = out + r * n;
        int j = 0;
#ifdef __AVX512F__
        const __m512 one = _mm512_set1_ps(1.0f);
        for (; j < n; j += LANES) {
            __mmask16 m = j + LANES <= n ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            __m512 gv = _mm512_maskz_loadu_ps(m, g + j), uv = _mm512_maskz_loadu_ps(m, u + j);
            __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(o + j, m, _mm512_mul_ps(s, uv));
        }
#endif
        for (; j < n; j++) o[j] = (g[j] / (1.0f + expf(-g[j]))) * u[j];
    }
}

/* The index of each row's largest value, the first where several tie, a NaN counting as the
 * largest (torch.argmax's rules): a vector pass for the maximum, then one for where it is. */
void kvscale_argmax(const float *restrict x, int64_t stride, int64_t rows, int n,
                    int64_t *restrict out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * stride;
        float best = -INFINITY;
        int nan = 0, j = 0;
#ifdef __AVX512F__
        __m512 mv = _mm512_set1_ps(-INFINITY);
        __mmask16 nans = 0;
        for (; j + LANES <= n; j += LANES) {
            __m512 v = _mm512_loadu_ps(xr + j);
            nans |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            mv = _mm512_max_ps(mv, v);
        }
        nan = nans != 0;
        best = _mm512_reduce_max_ps(mv);
#endif
        for (; j < n; j++) {
            if (xr[j] != xr[j]) nan = 1;
            else if (xr[j] > best) best = xr[j];
        }
        int k = 0;
#ifdef __AVX512F__
        const __m512 bv = _mm512_set1_ps(best);
        for (; k + LANES <= n; k += LANES) {
            __m512 v = _mm512_loadu_ps(xr + k);
            __mmask16 hit = nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)
                                : _mm512_cmp_ps_mask(v, bv, _CMP_EQ_OQ);
            if (hit) {
                k += __builtin_ctz(hit);
                break;
            }
        }
#endif
        while (k < n && !(nan ? xr[k] != xr[k] : xr[k] == best)) k++;
        out[r] = k < n ? k : 0; /* n == 0 never reaches here: the wrapper refuses it */
    }
}
