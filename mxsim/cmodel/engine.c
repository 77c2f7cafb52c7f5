/* The dot-product engine of an exported mxsim C model (C99, no dependency but <stdint.h>/<string.h>).
 *
 * Every value is held exactly as (class, sign, significand, exponent): (-1)^neg * sig * 2^exp,
 * sig an unsigned 64-bit integer; exact sums go through a wide fixed-point integer (mxw, 32-bit
 * digits in int64 limbs, LSB 2^MXW_BASE). No floating-point type is used: every rounding is an
 * integer rounding into a format described by its parameter vector (the format table's data).
 * The unit's parameters are the CFG_* macros and the MXF_* format vectors the generator writes
 * above this text (one per key of mxsim's kernel record), so the compiler drops every stage the
 * unit does not have. The stages follow docs/hwconfig.md step by step, as mxsim's kernel
 * (mxsim/datapath/_kernels.py) does.
 */

#define MXV_FIN 0
#define MXV_INF 1
#define MXV_NAN 2

typedef struct { int cls; int neg; uint64_t sig; int64_t exp; } mxv;

/* format parameter vector indices (mxsim.formats._kernels.P_*) */
#define P_BITS 0
#define P_EBITS 1
#define P_MBITS 2
#define P_BIAS 3
#define P_SIGNED 4
#define P_TWOS 5
#define P_SPECIALS 6
#define P_SUBN 7
#define P_MAXI 8
#define P_MAXIN 9
#define P_EMAX 10
#define SP_NONE 0
#define SP_IEEE 1
#define SP_NAN_AT_MAX 2
#define SP_NAN_AT_NEG_ZERO 3
#define RND_NE 0
#define RND_NA 1
#define RND_TZ 2
#define RND_UP 3
#define RND_DN 4
#define RND_NTP 6
#define OVF_SAT 0
#define OVF_INF_NAN 1
#define OVF_INF 2
#define ZERO_EXPONENT (-(INT64_C(1) << 40))
#define SCALE_NAN_EXP (INT64_C(1) << 20)

static const mxv MXV_ZERO = {MXV_FIN, 0, 0, 0};

static int mx_bitlen(uint64_t x) { int n = 0; while (x) { n++; x >>= 1; } return n; }
static int64_t mx_asr(int64_t x, int64_t n) { if (n > 63) n = 63; return x >= 0 ? x >> n : ~((~x) >> n); }
static int64_t mx_shl(int64_t x, int64_t n) { return (int64_t)((uint64_t)x << n); }
static int mxv_zero(mxv v) { return v.cls == MXV_FIN && v.sig == 0; }
static int mxv_nonzero_finite(mxv v) { return v.cls == MXV_FIN && v.sig != 0; }
static int64_t mxv_log2(mxv v) { return v.exp + mx_bitlen(v.sig) - 1; }
static mxv mxv_nan(void) { mxv v = {MXV_NAN, 0, 0, 0}; return v; }
static mxv mxv_inf(int neg) { mxv v = {MXV_INF, neg, 0, 0}; return v; }
static mxv mxv_signed_zero(int neg) { mxv v = {MXV_FIN, neg, 0, 0}; return v; }

/* --- formats: decode, encode (mxsim/formats/_kernels.py) --------------------------------------- */

static mxv mx_decode(uint64_t code, const int64_t *f) {
    int64_t bits = f[P_BITS], eb = f[P_EBITS], mb = f[P_MBITS];
    int neg = 0; uint64_t mi; mxv v = {MXV_FIN, 0, 0, 0};
    uint64_t mmask = (UINT64_C(1) << mb) - 1;
    if (f[P_TWOS]) {
        int64_t value = (code >> (bits - 1)) & 1 ? (int64_t)code - (INT64_C(1) << bits) : (int64_t)code;
        neg = value < 0; mi = (uint64_t)(value < 0 ? -value : value);
    } else if (f[P_SIGNED]) {
        neg = (int)((code >> (bits - 1)) & 1); mi = code & ((UINT64_C(1) << (bits - 1)) - 1);
    } else { mi = code; }
    if (f[P_SPECIALS] == SP_IEEE && (int64_t)(mi >> mb) == (INT64_C(1) << eb) - 1)
        return (mi & mmask) ? mxv_nan() : mxv_inf(neg);
    if (f[P_SPECIALS] == SP_NAN_AT_MAX && mi == (UINT64_C(1) << (bits - f[P_SIGNED])) - 1) return mxv_nan();
    if (f[P_SPECIALS] == SP_NAN_AT_NEG_ZERO && neg && mi == 0) return mxv_nan();
    v.neg = neg;
    if (eb == 0 || (f[P_SUBN] && mi <= mmask)) { v.sig = mi; v.exp = 1 - f[P_BIAS] - mb; }
    else { v.sig = (mi & mmask) | (UINT64_C(1) << mb); v.exp = (int64_t)(mi >> mb) - f[P_BIAS] - mb; }
    return v;
}

static uint64_t mx_nan_code(int neg, const int64_t *f) {
    int64_t bits = f[P_BITS], mb = f[P_MBITS]; uint64_t mag;
    if (f[P_SPECIALS] == SP_IEEE) mag = ((((UINT64_C(1) << f[P_EBITS]) - 1)) << mb) | (UINT64_C(1) << (mb - 1));
    else if (f[P_SPECIALS] == SP_NAN_AT_NEG_ZERO) return UINT64_C(1) << (bits - 1);
    else mag = (UINT64_C(1) << (bits - f[P_SIGNED])) - 1;
    return f[P_SIGNED] ? ((uint64_t)neg << (bits - 1)) | mag : mag;
}

static uint64_t mx_mag_code(int neg, uint64_t mi, const int64_t *f) {
    int64_t bits = f[P_BITS];
    if (f[P_TWOS]) { int64_t value = neg ? -(int64_t)mi : (int64_t)mi; return (uint64_t)value & ((UINT64_C(1) << bits) - 1); }
    if (mi == 0 && f[P_SPECIALS] == SP_NAN_AT_NEG_ZERO) return 0;
    if (f[P_SIGNED]) return ((uint64_t)neg << (bits - 1)) | mi;
    if (neg && mi != 0) return mx_nan_code(0, f);
    return mi;
}

static uint64_t mx_overflow_code(int neg, int rnd, int ovf, const int64_t *f) {
    uint64_t maxi = (uint64_t)(neg ? f[P_MAXIN] : f[P_MAXI]);
    int toward_finite = ovf == OVF_INF_NAN && (rnd == RND_TZ || (rnd == RND_UP && neg) || (rnd == RND_DN && !neg));
    if (ovf == OVF_SAT || toward_finite || f[P_SPECIALS] == SP_NONE) return mx_mag_code(neg, maxi, f);
    if (f[P_SPECIALS] == SP_IEEE) return mx_mag_code(neg, ((UINT64_C(1) << f[P_EBITS]) - 1) << f[P_MBITS], f);
    return mx_nan_code(neg, f);
}

static int mx_round_up(int rnd, int neg, uint64_t odd, int below_half, int tie, int inexact) {
    if (!inexact) return 0;
    switch (rnd) {
    case RND_NE: return !below_half && (!tie || (odd & 1));
    case RND_NA: return !below_half;
    case RND_NTP: return !below_half && (!tie || !neg);
    case RND_UP: return !neg;
    case RND_DN: return neg;
    default: return 0;
    }
}

/* Code of (-1)^neg * sig * 2^lsb (sig < 2^63, nonzero; lead = floor(log2)), rounded once. */
static uint64_t mx_encode(int neg, uint64_t sig, int64_t lsb, int64_t lead, const int64_t *f, int rnd, int ovf) {
    int64_t eb = f[P_EBITS], mb = f[P_MBITS], bias = f[P_BIAS], qexp, shift, offset = 0;
    uint64_t q, mi, maxi;
    int below_half = 1, tie = 0, inexact = 0;
    if (lead > f[P_EMAX]) return mx_overflow_code(neg, rnd, ovf, f);
    if (eb == 0) qexp = 1 - bias - mb;
    else {
        int64_t min_e = f[P_SUBN] ? 1 - bias : -bias, binade;
        if (lead < min_e && !f[P_SUBN]) return mx_mag_code(neg, 0, f);
        binade = lead > min_e ? lead : min_e;
        qexp = binade - mb;
        offset = (binade + bias - 1) * (INT64_C(1) << mb);  /* -1 binade: a format without zero */
    }
    shift = qexp - lsb;
    if (shift <= 0) q = sig << (-shift);
    else if (shift > 63) { q = 0; inexact = 1; }
    else {
        uint64_t rem, half;
        q = sig >> shift; rem = sig - (q << shift); half = UINT64_C(1) << (shift - 1);
        inexact = rem != 0; below_half = rem < half; tie = rem == half;
    }
    mi = (uint64_t)((int64_t)q + offset);
    if (mx_round_up(rnd, neg, mi, below_half, tie, inexact)) mi++;
    maxi = (uint64_t)(neg ? f[P_MAXIN] : f[P_MAXI]);
    if (mi > maxi) return mx_overflow_code(neg, rnd, ovf, f);
    return mx_mag_code(neg, mi, f);
}

/* The code of a value already in the format (NaN: the canonical positive quiet NaN). */
static uint64_t mx_code_of(mxv v, const int64_t *f) {
    if (v.cls == MXV_NAN) return mx_nan_code(0, f);
    if (v.cls == MXV_INF) return mx_mag_code(v.neg, ((UINT64_C(1) << f[P_EBITS]) - 1) << f[P_MBITS], f);
    if (v.sig == 0) return mx_mag_code(f[P_SIGNED] && !f[P_TWOS] ? v.neg : 0, 0, f);
    return mx_encode(v.neg, v.sig, v.exp, mxv_log2(v), f, RND_NE, OVF_INF_NAN);
}

static mxv mx_flush(mxv v, const int64_t *f, int subnormals) {
    if (subnormals || !mxv_nonzero_finite(v)) return v;
    if (mxv_log2(v) < 1 - f[P_BIAS]) return mxv_signed_zero(v.neg);
    return v;
}

static mxv mx_round_parts(int neg, uint64_t sig, int64_t lsb, const int64_t *f, int rnd, int subn, int ovf) {
    return mx_flush(mx_decode(mx_encode(neg, sig, lsb, lsb + mx_bitlen(sig) - 1, f, rnd, ovf), f), f, subn);
}

/* v rounded once into f (zeros and specials unchanged). */
static mxv mx_round(mxv v, const int64_t *f, int rnd, int subn, int ovf) {
    if (v.cls != MXV_FIN || v.sig == 0) return v;
    return mx_round_parts(v.neg, v.sig, v.exp, f, rnd, subn, ovf);
}

/* total * 2^lsb rounded once into f; +0 for zero. */
static mxv mx_round_int(int64_t total, int64_t lsb, const int64_t *f, int rnd, int subn, int ovf) {
    if (total == 0) return MXV_ZERO;
    return mx_round_parts(total < 0, (uint64_t)(total < 0 ? -total : total), lsb, f, rnd, subn, ovf);
}

/* --- the wide exact accumulator (mxsim/datapath/_limbs.py) ------------------------------------ */

#define MXW_LIMBS 160
#define MXW_BASE (-2560)
typedef struct { int64_t d[MXW_LIMBS + 2]; int lo, hi; } mxw;

static void mxw_clear(mxw *w) {
    int i;
    for (i = w->lo; i <= w->hi; i++) w->d[i] = 0;
    w->lo = MXW_LIMBS; w->hi = -1;
}

static void mxw_init(mxw *w) { memset(w, 0, sizeof *w); w->lo = MXW_LIMBS; w->hi = -1; }

/* Add (-1)^neg * m * 2^e exactly. */
static void mxw_add_u64(mxw *w, int neg, uint64_t m, int64_t e) {
    int64_t pos, idx, off; uint64_t lo, hi, d0, d1, d2;
    if (m == 0) return;
    pos = e - MXW_BASE; idx = pos >> 5; off = pos & 31;
    lo = (m & 0xFFFFFFFFu) << off; hi = (m >> 32) << off;
    d0 = lo & 0xFFFFFFFFu; d1 = (lo >> 32) + (hi & 0xFFFFFFFFu); d2 = hi >> 32;
    if (neg) { w->d[idx] -= (int64_t)d0; w->d[idx + 1] -= (int64_t)d1; w->d[idx + 2] -= (int64_t)d2; }
    else { w->d[idx] += (int64_t)d0; w->d[idx + 1] += (int64_t)d1; w->d[idx + 2] += (int64_t)d2; }
    if (idx < w->lo) w->lo = (int)idx;
    if (idx + 2 > w->hi) w->hi = (int)idx + 2;
}

static void mxw_add(mxw *w, mxv v) { if (mxv_nonzero_finite(v)) mxw_add_u64(w, v.neg, v.sig, v.exp); }

static void mxw_add_int(mxw *w, int64_t total, int64_t lsb) {
    if (total != 0) mxw_add_u64(w, total < 0, (uint64_t)(total < 0 ? -total : total), lsb);
}

/* The exact product x * y * 2^shift (significands up to 64 bits: a 128-bit product). */
static void mxw_add_product(mxw *w, mxv x, mxv y, int64_t shift) {
    uint64_t a0 = x.sig & 0xFFFFFFFFu, a1 = x.sig >> 32, b0 = y.sig & 0xFFFFFFFFu, b1 = y.sig >> 32;
    int neg = x.neg ^ y.neg; int64_t e = x.exp + y.exp + shift;
    mxw_add_u64(w, neg, a0 * b0, e);
    mxw_add_u64(w, neg, a0 * b1, e + 32);
    mxw_add_u64(w, neg, a1 * b0, e + 32);
    mxw_add_u64(w, neg, a1 * b1, e + 64);
}

static int64_t mxw_carry(mxw *w) {
    int64_t carry = 0; int i;
    for (i = w->lo; i <= w->hi; i++) {
        int64_t v = w->d[i] + carry;
        carry = mx_asr(v, 32);
        w->d[i] = v - mx_shl(carry, 32);
    }
    return carry;
}

/* Normalise to a magnitude in 32-bit digits; returns the sign (1: negative). */
static int mxw_normalise(mxw *w) {
    int neg = 0, i; int64_t carry;
    if (w->hi < w->lo) return 0;
    carry = mxw_carry(w);
    if (carry < 0) {
        neg = 1;
        for (i = w->lo; i <= w->hi; i++) w->d[i] = -w->d[i];
        carry = -carry;
    }
    while (carry != 0) { w->hi++; w->d[w->hi] += carry; carry = mxw_carry(w); }
    return neg;
}

/* The sum as (neg, sig, lsb): at most 62 significant bits, a sticky bit jammed below them
 * (sig = 0: zero). Leaves the limbs normalised (same value). */
static void mxw_get(mxw *w, int *neg, uint64_t *sig, int64_t *lsb) {
    int top, i; int64_t from, idx, off; uint64_t r; int sticky = 0;
    *neg = mxw_normalise(w);
    for (top = w->hi; top >= w->lo && w->d[top] == 0; top--) {}
    if (top < w->lo) { *sig = 0; *lsb = 0; if (w->hi >= w->lo) { *neg = 0; } return; }
    from = (int64_t)top * 32 + mx_bitlen((uint64_t)w->d[top]) - 1 - 61;
    if (from < (int64_t)w->lo * 32) from = (int64_t)w->lo * 32;
    idx = from >> 5; off = from & 31;
    r = (uint64_t)w->d[idx] >> off;
    if (idx + 1 <= w->hi) r |= (uint64_t)w->d[idx + 1] << (32 - off);
    if (off > 0 && idx + 2 <= w->hi) r |= (uint64_t)w->d[idx + 2] << (64 - off);
    r &= (UINT64_C(1) << 62) - 1;
    for (i = w->lo; i < idx; i++) sticky |= w->d[i] != 0;
    if (off > 0) sticky |= (w->d[idx] & ((INT64_C(1) << off) - 1)) != 0;
    *sig = (r << 1) | (uint64_t)sticky;
    *lsb = MXW_BASE + from - 1;
    if (*neg) for (i = w->lo; i <= w->hi; i++) w->d[i] = -w->d[i];  /* the same signed value again */
}

/* The exact sum rounded into f; +0 for an exact zero. */
static mxv mxw_round(mxw *w, const int64_t *f, int rnd, int subn, int ovf) {
    int neg; uint64_t sig; int64_t lsb;
    mxw_get(w, &neg, &sig, &lsb);
    if (sig == 0) return MXV_ZERO;
    return mx_round_parts(neg, sig, lsb, f, rnd, subn, ovf);
}

/* The exact sum as a value (it must fit 62 bits: group sums, which the config keeps exact). */
static mxv mxw_value(mxw *w) {
    mxv v = {MXV_FIN, 0, 0, 0};
    mxw_get(w, &v.neg, &v.sig, &v.exp);
    if (v.sig == 0) return MXV_ZERO;
    while (!(v.sig & 1)) { v.sig >>= 1; v.exp++; }
    return v;
}

static mxv mx_add_round(mxv x, mxv y, const int64_t *f, int rnd, int subn, int ovf, mxw *w) {
    mxv r;
    mxw_clear(w); mxw_add(w, x); mxw_add(w, y);
    r = mxw_round(w, f, rnd, subn, ovf);
    mxw_clear(w);
    return r;
}

/* --- the running special value (NaN, +-Inf): an IEEE sum of the non-finite contributions ------ */

static int mxs_any(mxv s) { return s.cls != MXV_FIN; }
static mxv mxs_add(mxv s, mxv x) {
    if (x.cls == MXV_FIN) return s;
    if (s.cls == MXV_FIN) return x;
    if (s.cls == MXV_NAN || x.cls == MXV_NAN || s.neg != x.neg) return mxv_nan();
    return s;
}
static mxv mxs_overflow(mxv s, mxv v) { return s.cls == MXV_FIN ? v : s; }

/* --- steps 1-3: decode, multiply, order and trees ---------------------------------------------- */

static mxv mx_element(uint64_t code, const int64_t *f, int64_t *exponent) {
    mxv v = mx_decode(code, f);
    if (!CFG_input_subnormals && f[P_EBITS] > 0) v = mx_flush(v, f, 0);
    if (!mxv_nonzero_finite(v)) { *exponent = ZERO_EXPONENT; return v; }
    {
        int64_t emin = f[P_EBITS] > 0 ? 1 - f[P_BIAS] : f[P_EMAX], e = mxv_log2(v);
        *exponent = e > emin ? e : emin;
    }
    return v;
}

/* A block scale's alignment exponent: floor(log2 s), at least emin when the format has subnormals. */
static int64_t scale_exponent_of(mxv s) {
    int64_t e = mxv_log2(s);
    if (MXF_SCALE[P_SUBN] && MXF_SCALE[P_EBITS] > 0 && e < 1 - MXF_SCALE[P_BIAS]) e = 1 - MXF_SCALE[P_BIAS];
    return e;
}

static mxv mx_mul(mxv x, mxv y) {
    mxv r = {MXV_FIN, 0, 0, 0};
    if (x.cls == MXV_NAN || y.cls == MXV_NAN) return mxv_nan();
    if (x.cls == MXV_INF || y.cls == MXV_INF) {
        if (mxv_zero(x) || mxv_zero(y)) return mxv_nan();
        return mxv_inf(x.neg ^ y.neg);
    }
    r.neg = x.neg ^ y.neg;
    r.sig = x.sig * y.sig;
    r.exp = r.sig ? x.exp + y.exp : 0;
    return r;
}

#define MXC_PERIOD (CFG_term_order_length ? CFG_term_order_length : 1)  /* (no division by zero) */

static int64_t padded_length(int64_t n) {
    if (CFG_term_order_length == 0) return n;
    return (n + MXC_PERIOD - 1) / MXC_PERIOD * MXC_PERIOD;
}

static int64_t ordered_index(int64_t position) {
    if (CFG_term_order_length == 0) return position;
    return (position / MXC_PERIOD) * MXC_PERIOD + MXC_TERM_ORDER[position % MXC_PERIOD];
}

static int64_t tree_count(int64_t n) {
    if (CFG_trees_in_blocks) {
        int64_t per_block = (CFG_block_size + CFG_fused_terms - 1) / CFG_fused_terms;
        return (n / CFG_block_size) * per_block + (n % CFG_block_size + CFG_fused_terms - 1) / CFG_fused_terms;
    }
    return (padded_length(n) + CFG_fused_terms - 1) / CFG_fused_terms;
}

static void tree_bounds(int64_t tree, int64_t n, int64_t *start, int64_t *stop) {
    if (CFG_trees_in_blocks) {
        int64_t per_block = (CFG_block_size + CFG_fused_terms - 1) / CFG_fused_terms;
        int64_t block_start = (tree / per_block) * CFG_block_size, s = block_start + (tree % per_block) * CFG_fused_terms;
        int64_t e = s + CFG_fused_terms;
        if (e > block_start + CFG_block_size) e = block_start + CFG_block_size;
        if (e > n) e = n;
        *start = s; *stop = e;
        return;
    }
    *start = tree * CFG_fused_terms;
    *stop = *start + CFG_fused_terms;
    if (*stop > padded_length(n)) *stop = padded_length(n);
}

typedef struct {
    const uint64_t *a, *b;      /* field codes */
    const int64_t *sa, *sb;     /* scale exponents (SCALE_NAN_EXP: NaN), or scale codes with group_sum */
    int64_t n;
    mxv *terms; int64_t *exps;
    mxw *w, *tw, *kw;
} mxc_dot;

/* Steps 1-2 for element k: the product (exact; NaN for a NaN scale; +-Inf past the multiplier's
 * range), its exponent sum, and the deferred block_sum scale. */
static mxv multiply(const mxc_dot *d, int64_t k, int64_t *exponent_sum, int64_t *deferred) {
    int64_t ea, eb; mxv va = mx_element(d->a[k], MXF_A, &ea), vb = mx_element(d->b[k], MXF_B, &eb), p;
    if (CFG_input_zeros_positive) { if (mxv_zero(va)) va.neg = 0; if (mxv_zero(vb)) vb.neg = 0; }
    p = mx_mul(va, vb);
    *exponent_sum = ea + eb;
    *deferred = 0;
    if (CFG_scales == 1 || CFG_scales == 2) {
        int64_t block = k / CFG_block_size, s_a = d->sa[block], s_b = d->sb[block];
        if (s_a == SCALE_NAN_EXP || s_b == SCALE_NAN_EXP) p = mxv_nan();
        else if (CFG_scales == 1 || CFG_align_fraction_bits < 0) {
            if (p.cls == MXV_FIN && p.sig) p.exp += s_a + s_b;
            *exponent_sum += s_a + s_b;
        } else *deferred = s_a + s_b;
    }
    if (CFG_product_overflow_exponent != MXC_NO_PRODUCT_OVERFLOW && mxv_nonzero_finite(p)
        && mxv_log2(p) >= CFG_product_overflow_exponent) p = mxv_inf(p.neg);
    return p;
}

static mxv truncate_significand(mxv p, int64_t fraction_bits) {
    int n = mx_bitlen(p.sig);
    if (n > fraction_bits + 1) { p.sig >>= n - fraction_bits - 1; p.exp += n - fraction_bits - 1; }
    return p;
}

/* Steps 1-3 for the tree positions start..stop by step: its nonzero finite products. */
static int64_t tree_terms(const mxc_dot *d, int64_t start, int64_t stop, int64_t step, int64_t *tree_scale, mxv *special,
                          int *nzo, int *has_zero) {
    int64_t count = 0, position;
    *has_zero = 0; *tree_scale = 0;
    for (position = start; position < stop; position += step) {
        int64_t k = ordered_index(position), es; mxv p;
        if (k >= d->n) continue;
        p = multiply(d, k, &es, tree_scale);
        if (p.cls != MXV_FIN) { *special = mxs_add(*special, p); continue; }
        if (p.sig == 0) { *has_zero = 1; if (!p.neg) *nzo = 0; continue; }
        *nzo = 0;
        if (CFG_product_fraction_bits >= 0) p = truncate_significand(p, CFG_product_fraction_bits);
        d->terms[count] = p;
        d->exps[count] = CFG_align_leading_bit ? mxv_log2(p) : es;
        count++;
    }
    return count;
}

/* scales: group_sum: one term per group, the group's exact sum times its two scales. */
static int64_t group_tree_terms(const mxc_dot *d, int64_t start, int64_t stop, mxv *special, int *nzo, int *has_zero) {
    int64_t count = 0, g;
    *has_zero = 0;
    for (g = start; g < stop; g += CFG_group_terms) {
        int64_t k, end = g + CFG_group_terms < stop ? g + CFG_group_terms : stop, block = g / CFG_block_size, e1, e2;
        int all_zero = 1; mxv sum, sa, sb, scale;
        mxw_clear(d->w);
        for (k = g; k < end; k++) {
            int64_t ea, eb; mxv p = mx_mul(mx_element(d->a[k], MXF_A, &ea), mx_element(d->b[k], MXF_B, &eb));
            if (p.cls != MXV_FIN) { *special = mxs_add(*special, p); all_zero = 0; continue; }
            if (p.sig != 0 || !p.neg) *nzo = 0;
            if (p.sig != 0) {
                all_zero = 0;
                if (CFG_product_fraction_bits >= 0) p = truncate_significand(p, CFG_product_fraction_bits);
            }
            mxw_add(d->w, p);
        }
        sum = mxw_value(d->w);
        mxw_clear(d->w);
        sa = mx_decode((uint64_t)d->sa[block], MXF_SCALE); sb = mx_decode((uint64_t)d->sb[block], MXF_SCALE);
        scale = mx_mul(sa, sb);
        if (scale.cls == MXV_NAN) { *special = mxs_add(*special, scale); continue; }
        if (all_zero || mxv_zero(scale)) { *has_zero = 1; continue; }
        d->terms[count] = mx_mul(sum, scale);
        if (d->terms[count].sig == 0) d->terms[count].neg = sum.neg ^ scale.neg;
        e1 = scale_exponent_of(sa); e2 = scale_exponent_of(sb);
        d->exps[count] = e1 + e2;
        count++;
    }
    return count;
}

/* fp64 operands: an exact tree's products straight into the limbs (128-bit products). */
static void wide_tree_into_limbs(const mxc_dot *d, int64_t start, int64_t stop, mxv *special, int *nzo, mxw *target) {
    int64_t position;
    for (position = start; position < stop; position++) {
        int64_t k = ordered_index(position), ea, eb, shift = 0; mxv va, vb;
        if (k >= d->n) continue;
        va = mx_element(d->a[k], MXF_A, &ea); vb = mx_element(d->b[k], MXF_B, &eb);
        if (CFG_scales != 0) {
            int64_t block = k / CFG_block_size;
            if (d->sa[block] == SCALE_NAN_EXP || d->sb[block] == SCALE_NAN_EXP) { *special = mxs_add(*special, mxv_nan()); continue; }
            shift = d->sa[block] + d->sb[block];
        }
        if (va.cls != MXV_FIN || vb.cls != MXV_FIN) { *special = mxs_add(*special, mx_mul(va, vb)); continue; }
        if (va.sig == 0 || vb.sig == 0) {
            if (CFG_input_zeros_positive || va.neg == vb.neg) *nzo = 0;
            continue;
        }
        *nzo = 0;
        mxw_add_product(target, va, vb, shift);
    }
}

/* --- steps 4-5: align and add ------------------------------------------------------------------- */

/* A term in units of 2^lsb as the adder keeps it (below_window), sticky in half units. */
static int64_t keep_in_window(mxv t, int64_t lsb) {
    int64_t shift = t.exp - lsb; uint64_t q, rem = 0, half = 0; int64_t kept;
    if (shift >= 0) q = t.sig << shift;
    else if (-shift >= 64) { q = 0; rem = t.sig; half = 0; }
    else { q = t.sig >> -shift; rem = t.sig - (q << -shift); half = UINT64_C(1) << (-shift - 1); }
    switch (CFG_below_window) {
    case 0: kept = (int64_t)q; break;
    case 1: kept = (int64_t)q + (t.neg && rem != 0); break;
    case 2: {
        int up = -shift >= 64 ? 0 : (rem > half || (rem == half && rem != 0 && (q & 1)));
        kept = (int64_t)q + up; break;
    }
    default: kept = 2 * (int64_t)q + (rem != 0); break;
    }
    return t.neg ? -kept : kept;
}

/* Steps 4-5 of a windowed tree: total * 2^lsb; R is returned in *reference. */
static int64_t align_and_add(const mxc_dot *d, int64_t count, int64_t tree_scale, int64_t floor_, int64_t *lsb,
                             int64_t *reference) {
    int64_t R, i, total = 0;
    if (count == 0) { *lsb = 0; *reference = ZERO_EXPONENT; return 0; }
    R = d->exps[0];
    for (i = 1; i < count; i++) if (d->exps[i] > R) R = d->exps[i];
    if (R < floor_) R = floor_;
    *reference = R;
    *lsb = R - CFG_align_fraction_bits;
    for (i = 0; i < count; i++) total += keep_in_window(d->terms[i], *lsb);
    if (CFG_below_window == 3) *lsb -= 1;
    if (CFG_carry_bits >= 0) {
        int64_t width = 1 + (CFG_align_fraction_bits + 2) + CFG_carry_bits + (CFG_below_window == 3);
        int64_t limit = INT64_C(1) << (width - 1);
        if (total < -limit || total >= limit) {
            if (CFG_adder_saturates) total = total > 0 ? limit - 1 : -limit;
            else total = ((total + limit) & ((limit << 1) - 1)) - limit;
        }
    }
    *lsb += tree_scale;
    return total;
}

static int64_t parity_tree_sum(const mxc_dot *d, int64_t start, int64_t stop, mxv *special, int *nzo, int64_t *total,
                               int64_t *lsb, int64_t *reference) {
    int64_t count = 0, parity; *total = 0; *lsb = 0; *reference = ZERO_EXPONENT;
    for (parity = 0; parity < 2; parity++) {
        int64_t tree_scale, half, ht, hl, hr; int has_zero;
        half = tree_terms(d, start + parity, stop, 2, &tree_scale, special, nzo, &has_zero);
        if (half == 0) continue;
        ht = align_and_add(d, half, tree_scale, has_zero ? CFG_zero_term_exponent : MXC_NO_ZERO_TERM, &hl, &hr);
        if (hr > *reference) *reference = hr;
        if (count == 0) { *total = ht; *lsb = hl; }
        else if (hl > *lsb) { *total = mx_asr(*total, hl - *lsb) + ht; *lsb = hl; }
        else *total += mx_asr(ht, *lsb - hl);
        count += half;
    }
    return count;
}

/* --- steps 5-6 ------------------------------------------------------------------------------------ */

static int64_t floor_scaled(mxv v, int64_t shift) {   /* floor(v * 2^shift), v finite */
    int64_t e = v.exp + shift; uint64_t q, rem;
    if (v.sig == 0) return 0;
    if (e >= 0) { q = v.sig << e; rem = 0; }
    else if (-e >= 64) { q = 0; rem = 1; }
    else { q = v.sig >> -e; rem = v.sig - (q << -e); }
    return v.neg ? -(int64_t)q - (rem != 0) : (int64_t)q;
}

static mxv second_alignment(mxv acc, int64_t count, int64_t total, int64_t lsb) {
    int64_t window = CFG_align_fraction_bits, bits = CFG_second_alignment_bits, emin = 1 - MXF_ACC[P_BIAS];
    int64_t acc_e = mxv_zero(acc) ? emin : (mxv_log2(acc) > emin ? mxv_log2(acc) : emin), top, low, tree_part = 0, acc_part = 0, reg;
    top = count == 0 ? acc_e : (acc_e > lsb + window ? acc_e : lsb + window);
    low = top - (bits + 1 > window ? bits + 1 : window);
    if (count > 0) {
        int64_t shift = lsb - (top - bits - 1);
        tree_part = shift >= 0 ? mx_shl(total, shift) : mx_asr(total, -shift);
        tree_part = mx_shl(tree_part, (top - bits - 1) - low);
    }
    if (!mxv_zero(acc) && !(CFG_far_accumulator_dropped && acc_e < top - window - 1))
        acc_part = mx_shl(floor_scaled(acc, window - top), (top - window) - low);
    reg = tree_part + acc_part;
    if (reg != 0) {
        int64_t leading = low + mx_bitlen((uint64_t)(reg < 0 ? -reg : reg)) - 1;
        int64_t cut = (leading > emin ? leading : emin) - bits;
        if (cut > low) { reg = mx_asr(reg, cut - low); low = cut; }
    }
    return mx_round_int(reg, low, MXF_ACC, CFG_accumulator_rounding, CFG_accumulator_subnormals, CFG_accumulator_overflow);
}

static int special_accumulator_dropped(mxv carried, mxv tree_special, int64_t count, int64_t lsb) {
    int64_t e = CFG_special_accumulator_exponent, top;
    if (carried.cls == MXV_FIN || tree_special.cls != MXV_FIN) return 0;
    top = count == 0 ? e : (e > lsb + CFG_align_fraction_bits ? e : lsb + CFG_align_fraction_bits);
    return e < top - CFG_align_fraction_bits - 1;
}

static mxv grid_accumulate(const mxc_dot *d, mxv acc, int64_t count, int64_t scale_exponent) {
    int64_t emin = 1 - MXF_ACC[P_BIAS], e, offset, i;
    e = mxv_zero(acc) ? emin - 1 : (mxv_log2(acc) > emin ? mxv_log2(acc) : emin);
    offset = (e - MXF_ACC[P_MBITS]) - (scale_exponent - CFG_grid_fraction_bits);
    if (offset > CFG_grid_max_left_shift) return acc;
    mxw_clear(d->tw);
    for (i = 0; i < count; i++) mxw_add(d->tw, d->terms[i]);
    if (offset < -CFG_grid_max_right_shift) {
        int neg; uint64_t sig; int64_t lsb;
        mxw_get(d->tw, &neg, &sig, &lsb);
        if (sig == 0) { mxw_clear(d->tw); return acc; }
    }
    mxw_add(d->tw, acc);
    acc = mxw_round(d->tw, MXF_ACC, CFG_accumulator_rounding, CFG_accumulator_subnormals, CFG_accumulator_overflow);
    mxw_clear(d->tw);
    return acc;
}

/* --- adder.structure: pairwise_rounded ------------------------------------------------------------ */

static mxv rounded_add(mxv x, mxv y, mxw *w) {
    int rnd = CFG_accumulator_rounding; mxv r;
    if (x.cls != MXV_FIN || y.cls != MXV_FIN) {
        if (x.cls == MXV_NAN || y.cls == MXV_NAN) return mxv_nan();
        if (x.cls == MXV_INF && y.cls == MXV_INF) return x.neg == y.neg ? x : mxv_nan();
        return x.cls == MXV_INF ? x : y;
    }
    if (mxv_zero(x) && mxv_zero(y)) return mxv_signed_zero((x.neg && y.neg) || rnd == RND_DN);
    if (mxv_zero(x)) return y;
    if (mxv_zero(y)) return x;
    {
        int neg; uint64_t sig; int64_t lsb;
        mxw_clear(w); mxw_add(w, x); mxw_add(w, y); mxw_get(w, &neg, &sig, &lsb); mxw_clear(w);
        if (sig == 0) return mxv_signed_zero(rnd == RND_DN);  /* an exact zero sum of nonzero values */
        r = mx_round_parts(neg, sig, lsb, MXF_ACC, rnd, CFG_accumulator_subnormals, CFG_accumulator_overflow);
    }
    return r;
}

static mxv pairwise_dot(const mxc_dot *d, mxv c) {
    int rnd = CFG_accumulator_rounding, subn = CFG_accumulator_subnormals, ovf = CFG_accumulator_overflow;
    mxv acc = mx_round(c, MXF_ACC, rnd, subn, ovf), result;
    int64_t tree;
    if (CFG_input_zeros_positive && mxv_zero(acc)) acc.neg = 0;
    for (tree = 0; tree < tree_count(d->n); tree++) {
        int64_t start, stop, position, count = 0;
        tree_bounds(tree, d->n, &start, &stop);
        for (position = start; position < stop; position++) {
            int64_t k = ordered_index(position), es, deferred; mxv p;
            if (k >= d->n) continue;
            p = multiply(d, k, &es, &deferred);
            if (deferred != 0 && mxv_nonzero_finite(p)) p.exp += deferred;
            if (CFG_product_fraction_bits >= 0 && mxv_nonzero_finite(p)) p = truncate_significand(p, CFG_product_fraction_bits);
            d->terms[count++] = mx_round(p, MXF_ACC, rnd, subn, ovf);
        }
        while (count > 1) {
            int64_t j;
            for (j = 0; j < count / 2; j++) d->terms[j] = rounded_add(d->terms[2 * j], d->terms[2 * j + 1], d->w);
            if (count % 2) d->terms[count / 2] = d->terms[count - 1];
            count = (count + 1) / 2;
        }
        if (count == 1) acc = rounded_add(acc, d->terms[0], d->w);
    }
    result = mx_round(acc, MXF_OUT, CFG_output_rounding, CFG_output_subnormals, OVF_INF_NAN);
    if (result.cls == MXV_NAN) return mxv_nan();
    if (mxv_zero(result) && CFG_output_zero_sign == 1) result.neg = 0;
    return result;
}

/* --- the whole dot product --------------------------------------------------------------------- */

static mxv after_tree(mxv acc, mxv *outer, mxv *special, int64_t tree, mxw *w) {
    if (acc.cls != MXV_FIN) { *special = mxs_overflow(*special, acc); acc = MXV_ZERO; }
    if (CFG_promotion_interval > 0 && ((tree + 1) * CFG_fused_terms) % CFG_promotion_interval == 0) {
        *outer = mx_add_round(*outer, acc, MXF_FP32, RND_NE, 1, OVF_INF_NAN, w);
        if (outer->cls != MXV_FIN) { *special = mxs_overflow(*special, *outer); *outer = MXV_ZERO; }
        acc = MXV_ZERO;
    }
    return acc;
}

static int special_code(mxv s) { return s.cls == MXV_FIN ? 0 : s.cls == MXV_NAN ? 3 : s.neg ? 2 : 1; }

static mxv dot_one(mxc_dot *d, mxv c, mxc_stage_record *rec) {
    mxv special = MXV_ZERO, acc = MXV_ZERO, outer = MXV_ZERO, result;
    int nzo, steps = CFG_output_zero_sign == 3 && !CFG_accumulator_exact;
    int drops_specials = CFG_special_accumulator_exponent != MXC_NO_SPECIAL_ACCUMULATOR;
    int64_t tree, trees;
    if (rec) memset(rec, 0, sizeof *rec);
    if (CFG_input_zeros_positive && (mxv_zero(c) || (!CFG_accumulator_subnormals && mxv_nonzero_finite(c)
                                                     && mxv_log2(c) < 1 - MXF_ACC[P_BIAS]))) c = MXV_ZERO;
    if (CFG_pairwise_rounded) return pairwise_dot(d, c);
    if (c.cls != MXV_FIN) { special = c; c = MXV_ZERO; }
    nzo = mxv_zero(c) && c.neg;
    mxw_clear(d->kw);
    if (CFG_accumulator_exact) mxw_add(d->kw, c);
    else if (CFG_promotion_interval > 0) outer = c;
    else if (!CFG_c_at_end) {
        acc = mx_round(c, MXF_ACC, CFG_accumulator_rounding, CFG_accumulator_subnormals, CFG_accumulator_overflow);
        if (acc.cls != MXV_FIN) { special = mxs_overflow(special, acc); acc = MXV_ZERO; }
    }
    trees = tree_count(d->n);
    for (tree = 0; tree < trees; tree++) {
        int64_t start, stop, count = 0, tree_scale = 0, total = 0, lsb = 0, reference = ZERO_EXPONENT;
        int has_zero = 0, windowed = CFG_align_fraction_bits >= 0;
        mxv carried = special;
        mxw *target = CFG_accumulator_exact ? d->kw : d->tw;
        tree_bounds(tree, d->n, &start, &stop);
        if (steps) nzo = mxv_zero(acc) && acc.neg;
        if (drops_specials) special = MXV_ZERO;
        if (!CFG_accumulator_exact) mxw_clear(d->tw);
        if (MXC_WIDE_PRODUCTS) {
            wide_tree_into_limbs(d, start, stop, &special, &nzo, target);
        } else {
            if (CFG_scales == 3) count = group_tree_terms(d, start, stop < d->n ? stop : d->n, &special, &nzo, &has_zero);
            else if (CFG_parity_windows) count = parity_tree_sum(d, start, stop, &special, &nzo, &total, &lsb, &reference);
            else count = tree_terms(d, start, stop, 1, &tree_scale, &special, &nzo, &has_zero);
            if (CFG_grid_fraction_bits >= 0) {
                int64_t scale_exponent = CFG_scales == 0 ? 0 : d->sa[start / CFG_block_size] + d->sb[start / CFG_block_size];
                acc = grid_accumulate(d, acc, count, scale_exponent);
                nzo = 0;
                if (acc.cls != MXV_FIN) { special = mxs_overflow(special, acc); acc = MXV_ZERO; }
                goto recorded;
            }
            if (CFG_accumulator_in_tree) {
                if (!mxv_zero(acc)) {
                    int64_t e = mxv_log2(acc);
                    if (CFG_accumulator_exponent_clamped) {
                        if (e < 1 - MXF_ACC[P_BIAS]) e = 1 - MXF_ACC[P_BIAS];
                        if (tree == 0 && e < CFG_c_format_emin) e = CFG_c_format_emin;
                    }
                    d->terms[count] = acc; d->exps[count] = e; count++;
                } else has_zero = 1;
            }
            if (windowed) {
                if (!CFG_parity_windows)
                    total = align_and_add(d, count, tree_scale, has_zero ? CFG_zero_term_exponent : MXC_NO_ZERO_TERM, &lsb,
                                          &reference);
                mxw_add_int(target, total, lsb);
            } else {
                int64_t i;
                for (i = 0; i < count; i++) {
                    mxv t = d->terms[i];
                    if (tree_scale != 0 && t.sig) t.exp += tree_scale;
                    mxw_add(target, t);
                }
            }
        }
        if (CFG_accumulator_exact) goto recorded;
        if (CFG_second_alignment_bits >= 0) {
            if (drops_specials) {
                if (special_accumulator_dropped(carried, special, count, lsb)) acc = MXV_ZERO;
                else special = mxs_add(special, carried);
            }
            acc = second_alignment(acc, count, total, lsb);
        } else if (CFG_sum_significant_bits > 0) {
            mxv tree_sum = mxw_round(d->tw, MXF_SUM, CFG_sum_rounding, 1, OVF_INF_NAN);
            if (!CFG_accumulator_in_tree && !mxv_zero(acc))
                acc = mx_add_round(acc, tree_sum, MXF_ACC, CFG_accumulator_rounding, CFG_accumulator_subnormals,
                                   CFG_accumulator_overflow, d->w);
            else acc = mx_round(tree_sum, MXF_ACC, CFG_accumulator_rounding, CFG_accumulator_subnormals,
                                CFG_accumulator_overflow);
        } else {
            if (!CFG_accumulator_in_tree || MXC_WIDE_PRODUCTS) mxw_add(d->tw, acc);
            acc = mxw_round(d->tw, MXF_ACC, CFG_accumulator_rounding, CFG_accumulator_subnormals, CFG_accumulator_overflow);
        }
        if (steps && nzo && mxv_zero(acc)) acc.neg = 1;
        acc = after_tree(acc, &outer, &special, tree, d->w);
    recorded:
        if (rec && tree < MXC_MAX_TREES) {
            rec->reference[tree] = reference; rec->sum_total[tree] = total; rec->sum_lsb[tree] = lsb;
            rec->accumulator[tree] = CFG_accumulator_exact ? 0 : mx_code_of(acc, MXF_ACC);
        }
    }
    if (rec) { rec->trees = (int)trees; }
    if (CFG_accumulator_exact) {
        result = mxw_round(d->kw, MXF_OUT, CFG_output_rounding, CFG_output_subnormals, OVF_INF_NAN);
        mxw_clear(d->kw);
    } else {
        if (CFG_promotion_interval > 0) acc = mx_add_round(outer, acc, MXF_FP32, RND_NE, 1, OVF_INF_NAN, d->w);
        else if (CFG_c_at_end) {
            mxv cc = mx_round(c, MXF_ACC, RND_NE, CFG_accumulator_subnormals, CFG_accumulator_overflow);
            if (cc.cls == MXV_FIN)
                acc = mx_add_round(acc, cc, MXF_ACC, CFG_c_add_rounding, CFG_accumulator_subnormals, CFG_accumulator_overflow, d->w);
            else special = mxs_overflow(special, cc);
        }
        if (acc.cls != MXV_FIN) { special = mxs_overflow(special, acc); acc = MXV_ZERO; }
        result = mx_round(acc, MXF_OUT, CFG_output_rounding, CFG_output_subnormals, OVF_INF_NAN);
    }
    if (rec) rec->special = special_code(special);
    if (mxs_any(special)) return special.cls == MXV_NAN ? mxv_nan() : special;
    if (mxv_zero(result) && CFG_output_zero_sign == 1) return MXV_ZERO;
    if (mxv_zero(result) && !result.neg) {
        int ieee = CFG_output_zero_sign == 0 || CFG_output_zero_sign == 3;
        return mxv_signed_zero(nzo && ieee);
    }
    return result;
}
