/* elu + 1 features in one pass over a block, for the CPU float32 fast path (native.py).
 *
 * phi(x) = exp(min(x, 0)) + max(x, 0) (Katharopoulos et al. 2020, eq. 7), the exponential
 * of Cephes' expf (S. L. Moshier, Cephes Math Library 2.2, expf.c): x = n ln 2 + r with
 * |r| <= ln(2)/2 (Cody-Waite, ln 2 in two parts, fused multiply-adds), exp(r) by its
 * degree-7 minimax polynomial, then n added to the exponent bits. Error about one unit in
 * the last place; the domain is x >= -87, where e^x is a normal float (callers pass the
 * unshifted elu features, whose inputs are >= -30, features.ELU_SHIFT_BELOW).
 *
 * Optionally the dot product of each row's features with a vector z (one per group of
 * `group` consecutive rows) is written beside them: the denominator phi(q_i) . z of the
 * queries, in the same pass. The pass also flags inputs that the fast path must not take
 * (non-finite, or below the shift threshold), so that it needs no separate check. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VECTOR 1
#endif

#define SHIFTER 12582912.0f /* 1.5 * 2^23: x + SHIFTER - SHIFTER rounds x to an integer */
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693145751953125f
#define LN2_LO 1.428606765330187e-06f
#define DOMAIN_MIN -87.0f
static const float POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_domain(float x) {
    x = x < DOMAIN_MIN ? DOMAIN_MIN : x;
    float n = fmaf(x, LOG2E, SHIFTER) - SHIFTER;
    float r = fmaf(n, -LN2_LO, fmaf(n, -LN2_HI, x));
    float p = POLY[0];
    for (int i = 1; i < 6; i++) p = fmaf(p, r, POLY[i]);
    p = fmaf(p * r, r, r) + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)n * (1 << 23); /* n >= -126: no overflow */
    memcpy(&p, &bits, sizeof p);
    return p;
}

#ifdef VECTOR
static inline __m256 exp_domain8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(SHIFTER);
    x = _mm256_max_ps(x, _mm256_set1_ps(DOMAIN_MIN));
    __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), shifter), shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(POLY[0]);
    for (int i = 1; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(POLY[i]));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i exponent = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), exponent));
}

static inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
#endif

/* phi of one row of `cols` values into out, and phi . z into *dot when z is given;
 * returns 1 when some value is NaN, +inf or below `low` (the caller's cue to take its
 * validating path instead), else 0. */
static int feature_row(const float *restrict x, float *restrict out, int64_t cols,
                       const float *restrict z, float *dot, float low) {
    int64_t c = 0;
    int bad = 0;
    float sum = 0.0f;
#ifdef VECTOR
    const __m256 zero = _mm256_setzero_ps(), lows = _mm256_set1_ps(low);
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 acc = zero, flags = zero;
    for (; c + 8 <= cols; c += 8) {
        __m256 v = _mm256_loadu_ps(x + c);
        flags = _mm256_or_ps(flags, _mm256_cmp_ps(v, lows, _CMP_NGE_UQ));
        flags = _mm256_or_ps(flags, _mm256_cmp_ps(v, inf, _CMP_EQ_OQ));
        __m256 y = _mm256_add_ps(exp_domain8(_mm256_min_ps(v, zero)), _mm256_max_ps(v, zero));
        _mm256_storeu_ps(out + c, y);
        if (z) acc = _mm256_fmadd_ps(y, _mm256_loadu_ps(z + c), acc);
    }
    bad = _mm256_movemask_ps(flags) != 0;
    if (z) sum = horizontal_sum(acc);
#endif
    for (; c < cols; c++) {
        float v = x[c];
        bad |= !(v >= low) || v == INFINITY;
        out[c] = exp_domain(v < 0.0f ? v : 0.0f) + (v > 0.0f ? v : 0.0f);
        if (z) sum = fmaf(out[c], z[c], sum);
    }
    if (z) *dot = sum;
    return bad;
}

/* x: (batch, rows, cols) with strides (x_batch, x_row, 1); out: the same shape with
 * strides (out_batch, cols, 1). z: NULL, or (batch, rows / group, cols) with strides
 * (z_batch, z_group, 1), and then den (batch, rows) with strides (den_batch, 1) receives
 * phi(x_r) . z[r / group]. Returns 1 when some value of x is NaN, +inf or below `low`
 * (see feature_row), else 0. */
int elu_features(const float *x, int64_t batch, int64_t rows, int64_t cols, int64_t x_batch,
                 int64_t x_row, float *out, int64_t out_batch, const float *z,
                 int64_t z_batch, int64_t z_group, int64_t group, float *den,
                 int64_t den_batch, float low) {
    int bad = 0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < rows; r++) {
            const float *zr = z ? z + b * z_batch + (r / group) * z_group : NULL;
            bad |= feature_row(x + b * x_batch + r * x_row, out + b * out_batch + r * cols,
                               cols, zr, z ? den + b * den_batch + r : NULL, low);
        }
    return bad;
}
