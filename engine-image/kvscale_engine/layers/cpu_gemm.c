/* A linear layer for a few rows on the CPU: y = x W^T (+ bias), W read once for every row.
 *
 * A decode step multiplies a few rows (one per sequence) by every weight. At one row that is a
 * read of the weights, which MKL does at memory speed; from four rows on torch takes oneDNN's
 * blocked GEMM, which on the bench machine (one thread, AVX-512) read the benchmark model's 96 MB
 * of weights at 5.0 ms for 4 rows, 8.4 for 8 and 11.5 for 16 (8 layers' four GEMMs in turn),
 * against 3.4 ms for 1 row: small-M GEMMs there do not keep up with memory. This kernel does:
 * the weight is packed once into panels of 16 output columns ([N/16][K][16] floats, each panel
 * contiguous), and for up to 16 rows at a time each panel streams through once while every row
 * keeps its 16 sums in a register: per k, one load of 16 weights and an FMA per row with the
 * row's x[k] broadcast. Every output is one sequential sum over k, so results differ from MKL's
 * and oneDNN's only in rounding (as theirs differ from each other).
 *
 * Built by cpu_gemm.py with the system C compiler for this CPU; without AVX-512 the library says
 * so (`kvscale_gemm_lanes` returns 0) and the caller keeps torch's GEMMs.
 */
#include <stdint.h>

#define PANEL 16    /* output columns a panel holds: one AVX-512 vector */
#define MAX_ROWS 16 /* rows a pass keeps in registers (16 sums + a weight vector of 32) */
#define AHEAD 64    /* weight lines asked for ahead of use (4 KB; see below) */

#if defined(__AVX512F__)
#include <immintrin.h>

int kvscale_gemm_lanes(void) { return PANEL; }

/* `rows` (a compile-time constant where it is inlined) rows of x times one panel */
static inline __attribute__((always_inline)) void panel_rows(
    const float *restrict x, int64_t ldx, const float *restrict panel, __m512 start,
    float *restrict y, int64_t ldy, int rows, int k_len) {
    __m512 acc[MAX_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < rows; r++) acc[r] = start;
    for (int k = 0; k < k_len; k++) {
        /* a line of weights per k: the hardware's prefetch alone fell behind from 5 rows on
         * (16 rows at 12.2 ms, the weights in cache 5.6); asking 4 KB ahead hides the wait at
         * every row count (a prefetch past the end is harmless) */
        _mm_prefetch((const char *)(panel + (int64_t)(k + AHEAD) * PANEL), _MM_HINT_T0);
        __m512 w = _mm512_loadu_ps(panel + (int64_t)k * PANEL);
#pragma GCC unroll 16
        for (int r = 0; r < rows; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + k]), w, acc[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

/* One pass: `rows` rows of x against every panel. */
static inline __attribute__((always_inline)) void pass(
    const float *restrict x, int64_t ldx, const float *restrict panels, const float *bias,
    float *restrict y, int64_t ldy, int rows, int n, int k_len) {
    for (int p = 0; p < n / PANEL; p++) {
        __m512 start = bias ? _mm512_loadu_ps(bias + p * PANEL) : _mm512_setzero_ps();
        panel_rows(x, ldx, panels + (int64_t)p * k_len * PANEL, start, y + p * PANEL, ldy, rows,
                   k_len);
    }
}

#define PASS(R) static void pass_##R(const float *restrict x, int64_t ldx, const float *restrict w, \
    const float *bias, float *restrict y, int64_t ldy, int n, int k_len) { \
    pass(x, ldx, w, bias, y, ldy, R, n, k_len); }
PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6) PASS(7) PASS(8)
PASS(9) PASS(10) PASS(11) PASS(12) PASS(13) PASS(14) PASS(15) PASS(16)

typedef void (*pass_fn)(const float *restrict, int64_t, const float *restrict, const float *,
                        float *restrict, int64_t, int, int);
static const pass_fn PASSES[MAX_ROWS + 1] = {
    0, pass_1, pass_2, pass_3, pass_4, pass_5, pass_6, pass_7, pass_8,
    pass_9, pass_10, pass_11, pass_12, pass_13, pass_14, pass_15, pass_16,
};

/* y[m][n] = sum_k x[m][k] w[n][k] (+ bias[n]) for m < rows: x rows at x + m * ldx, y rows at
 * y + m * ldy, w as cpu_gemm.py packs it ([n / 16][k_len][16]); n a multiple of 16. Rows go in
 * passes of up to 16, each reading the weights once. Returns 0, or -1 for shapes it cannot take
 * (nothing written). */
int kvscale_gemm(const float *restrict x, int64_t ldx, const float *restrict w,
                 const float *bias, float *restrict y, int64_t ldy, int rows, int n, int k_len) {
    if (rows < 0 || n < 0 || k_len < 0 || n % PANEL) return -1;
    for (int m = 0; m < rows; m += MAX_ROWS) {
        int r = rows - m < MAX_ROWS ? rows - m : MAX_ROWS;
        PASSES[r](x + m * ldx, ldx, w, bias, y + m * ldy, ldy, n, k_len);
    }
    return 0;
}

#else

int kvscale_gemm_lanes(void) { return 0; }

int kvscale_gemm(const float *x, int64_t ldx, const float *w, const float *bias, float *y,
                 int64_t ldy, int rows, int n, int k_len) {
    (void)x; (void)ldx; (void)w; (void)bias; (void)y; (void)ldy; (void)rows; (void)n;
    (void)k_len;
    return -1;
}

#endif
