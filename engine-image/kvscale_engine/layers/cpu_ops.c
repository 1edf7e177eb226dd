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
