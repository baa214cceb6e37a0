// FP8 quantization (cuda/fp8.h) and the device linear layer's FP8 products (cuda/linear.h)
// against float64 references computed here from the same bf16 inputs.
//
// Quantization: every byte decoded on the host (E4M3: bias 7, 3 mantissa bits, 0x7f/0xff NaN;
// E5M2: bias 15, 2 mantissa bits) times the returned 1 / scale must be the input within half a
// step of the format (relative 2^-4 for E4M3, 2^-3 for E5M2, for normal values; the tally is the
// largest error over the tensor in units of that bound, which must be <= 1), the largest input
// must map to the format's largest value, and the transposed copy must be the same bytes.
// Products: forward, input gradient and weight gradient in both formats against float64, with the
// tolerance a per-tensor 8-bit quantization allows (relative L2: 0.06 with E4M3 operands, 0.10
// with an E5M2 gradient; the bf16 products give ~4e-3); shapes that are not multiples of 16 must
// give the 16-bit path's bits. A GPU without FP8 tensor cores skips (exit 77).
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn, to_bf16

#include <math.h> // ldexp, fabs

extern "C" {
#include "cuda/fp8.h"    // dsc__cuda_amax_bf16, dsc__cuda_fp8_quantize
#include "cuda/linear.h" // dsc__cuda_lin_*
#include "cuda/matmul.h" // dsc__cuda_blas_create, DSC_CUDA_E4M3
}

static double decode(uint8_t b, int fmt) {
    int sign = b >> 7, e, m;
    double v;
    if (fmt == DSC_CUDA_E4M3) {
        e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7) return NAN;
        v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    } else {
        e = (b >> 2) & 31, m = b & 3;
        if (e == 31) return m ? NAN : INFINITY;
        v = e ? ldexp(1.0 + m / 4.0, e - 15) : ldexp(m / 4.0, -14);
    }
    return sign ? -v : v;
}

static void test_quantize(int rows, int cols, int ld, int fmt, double spread) {
    std::vector<float> x = randn((size_t)rows * ld, spread);
    x[(size_t)(rows / 2) * ld + cols / 3] = (float)(7.5 * spread); // a clear maximum
    std::vector<uint16_t> xb = to_bf16(x);
    uint16_t *dx = dev_upload(xb);
    uint8_t *q = dev_alloc<uint8_t>((size_t)rows * cols), *qt = dev_alloc<uint8_t>((size_t)rows * cols);
    float *sc = dev_alloc<float>(4);
    DS(dsc__cuda_amax_bf16(sc, dx, rows, cols, ld, NULL));
    DS(dsc__cuda_fp8_quantize(q, sc + 1, dx, rows, cols, ld, sc, fmt, 0, false, NULL));
    DS(dsc__cuda_fp8_quantize(qt, sc + 3, dx, rows, cols, ld, sc, fmt, 0, true, NULL));
    SYNC();
    std::vector<uint8_t> hq = dev_download(q, (size_t)rows * cols),
                         hqt = dev_download(qt, (size_t)rows * cols);
    std::vector<float> s = dev_download(sc, 4);
    double amax = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            amax = fmax(amax, fabs((double)x[(size_t)r * ld + c]));
    double fmax_ = dsc__fp8_max(fmt), step = fmt == DSC_CUDA_E4M3 ? 0x1p-4 : 0x1p-3;
    double min_normal = fmt == DSC_CUDA_E4M3 ? 0x1p-6 : 0x1p-14;
    double worst = 0;
    bool same_t = true, hit_max = false;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            uint8_t b = hq[(size_t)r * cols + c];
            double xv = x[(size_t)r * ld + c], qv = decode(b, fmt);
            double scaled = fabs(xv) * fmax_ / amax;
            // within half a step of the scaled value (absolute below the normal range)
            double bound = scaled >= min_normal ? step * scaled : step * min_normal;
            worst = fmax(worst, fabs(qv - xv * fmax_ / amax) / bound);
            if (fabs(qv) == fmax_) hit_max = true;
            if (hqt[(size_t)c * rows + r] != b) same_t = false;
        }
    char name[128];
    snprintf(name, sizeof name, "quantize %s %dx%d ld %d: error / half-step",
             fmt == DSC_CUDA_E4M3 ? "E4M3" : "E5M2", rows, cols, ld);
    check(name, worst, 1.001);
    snprintf(name, sizeof name, "  amax %.6g, 1 / scale = amax / %g", amax, fmax_);
    check(name, fabs(s[0] - amax) / amax + fabs(s[1] - amax / fmax_) / (amax / fmax_), 1e-6);
    check_true("  the largest value maps to the format's largest", hit_max);
    check_true("  the transposed copy holds the same bytes", same_t);
    check_true("  both calls returned the same scale", s[1] == s[3]);
    CK(cudaFree(dx));
    CK(cudaFree(q));
    CK(cudaFree(qt));
    CK(cudaFree(sc));
}

typedef struct lin_case {
    int rows, IN, OUT;
} lin_case;

// One layer's three products with fp8 = mode against float64; 16-bit path beside it.
static void test_linear(dsc_cuda_blas *h, lin_case k, int mode) {
    int R = k.rows, IN = k.IN, OUT = k.OUT;
    std::vector<float> x = randn((size_t)R * IN, 1.0), w = randn((size_t)OUT * IN, 0.05),
                       dy = randn((size_t)R * OUT, 1e-3), b = randn((size_t)OUT, 0.1);
    std::vector<uint16_t> xb = to_bf16(x), wb = to_bf16(w), dyb = to_bf16(dy), bb = to_bf16(b);
    uint16_t *dx = dev_upload(xb), *dw16 = dev_upload(wb), *ddy = dev_upload(dyb),
             *dbias = dev_upload(bb);
    uint16_t *out = dev_alloc<uint16_t>((size_t)R * OUT), *out16 = dev_alloc<uint16_t>((size_t)R * OUT);
    uint16_t *din = dev_alloc<uint16_t>((size_t)R * IN), *din16 = dev_alloc<uint16_t>((size_t)R * IN);
    float *gw = dev_alloc<float>((size_t)OUT * IN), *gw16 = dev_alloc<float>((size_t)OUT * IN);
    int64_t maxd = IN > OUT ? IN : OUT;
    dsc__cuda_lin L, L16;
    memset(&L, 0, sizeof L);
    L.blas = h, L.fp8 = mode;
    size_t bytes = dsc__cuda_lin_scratch_bytes(mode, R, maxd, (int64_t)IN * OUT, 2);
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, bytes));
    DS(dsc__cuda_lin_carve(&L, scratch, R, maxd, (int64_t)IN * OUT, 2));
    L16 = L, L16.fp8 = DSC_FP8_OFF, L16.seen = NULL;
    for (int pass = 0; pass < 2; pass++) {
        dsc__cuda_lin *P = pass ? &L16 : &L;
        DS(dsc__cuda_lin_forward(P, 1, pass ? out16 : out, OUT, dx, IN, dw16, dbias, NULL, R, IN, OUT));
        DS(dsc__cuda_lin_dinp(P, 1, pass ? din16 : din, IN, ddy, OUT, dw16, R, IN, OUT, false));
        DS(dsc__cuda_lin_dw(P, 1, pass ? gw16 : gw, ddy, OUT, dx, IN, R, IN, OUT, true));
    }
    SYNC();
    // slots: the weight gradient without the kept output gradient, and every call without a
    // slot, give the same bits as the slotted sequence (the same maxima, measured or kept)
    if (R % 16 == 0 && IN % 16 == 0 && OUT % 16 == 0) {
        float *gw2 = dev_alloc<float>((size_t)OUT * IN), *gw3 = dev_alloc<float>((size_t)OUT * IN);
        uint16_t *out3 = dev_alloc<uint16_t>((size_t)R * OUT);
        DS(dsc__cuda_lin_dw(&L, 1, gw2, ddy, OUT, dx, IN, R, IN, OUT, true)); // nothing kept now
        DS(dsc__cuda_lin_forward(&L, -1, out3, OUT, dx, IN, dw16, dbias, NULL, R, IN, OUT));
        DS(dsc__cuda_lin_dw(&L, -1, gw3, ddy, OUT, dx, IN, R, IN, OUT, true));
        SYNC();
        std::vector<float> a = dev_download(gw, (size_t)OUT * IN), b2 = dev_download(gw2, a.size()),
                           b3 = dev_download(gw3, a.size());
        std::vector<uint16_t> y1 = dev_download(out, (size_t)R * OUT), y3 = dev_download(out3, y1.size());
        check_true("  slots and kept gradients change no bits", !memcmp(a.data(), b2.data(), a.size() * 4) &&
                   !memcmp(a.data(), b3.data(), a.size() * 4) && !memcmp(y1.data(), y3.data(), y1.size() * 2));
        cudaFree(gw2), cudaFree(gw3), cudaFree(out3);
    }
    dsc__cuda_lin_release(&L);
    std::vector<double> ry((size_t)R * OUT), rdx((size_t)R * IN, 0.0), rdw((size_t)OUT * IN, 0.0);
    for (int r = 0; r < R; r++)
        for (int o = 0; o < OUT; o++) {
            double s = b[o];
            for (int i = 0; i < IN; i++)
                s += (double)x[(size_t)r * IN + i] * w[(size_t)o * IN + i];
            ry[(size_t)r * OUT + o] = s;
            double g = dy[(size_t)r * OUT + o];
            for (int i = 0; i < IN; i++) {
                rdx[(size_t)r * IN + i] += g * w[(size_t)o * IN + i];
                rdw[(size_t)o * IN + i] += g * x[(size_t)r * IN + i];
            }
        }
    std::vector<float> y8 = from_bf16(dev_download(out, ry.size())),
                       y16 = from_bf16(dev_download(out16, ry.size())),
                       dx8 = from_bf16(dev_download(din, rdx.size())),
                       dx16 = from_bf16(dev_download(din16, rdx.size())),
                       dw8 = dev_download(gw, rdw.size()), dw16h = dev_download(gw16, rdw.size());
    bool fp8 = R % 16 == 0 && IN % 16 == 0 && OUT % 16 == 0;
    const char *fmt = mode == DSC_FP8_HYBRID ? "hybrid" : "e4m3";
    double tg = mode == DSC_FP8_HYBRID ? 0.10 : 0.06;
    char name[128];
    double e16[3] = {rel_err(y16.data(), ry.data(), ry.size()),
                     rel_err(dx16.data(), rdx.data(), rdx.size()),
                     rel_err(dw16h.data(), rdw.data(), rdw.size())};
    const char *what[3] = {"forward", "input grad", "weight grad"};
    double e8[3] = {rel_err(y8.data(), ry.data(), ry.size()),
                    rel_err(dx8.data(), rdx.data(), rdx.size()),
                    rel_err(dw8.data(), rdw.data(), rdw.size())};
    for (int j = 0; j < 3; j++) {
        snprintf(name, sizeof name, "linear %s %dx%d->%d %s (bf16: %.1e)", fmt, R, IN, OUT,
                 what[j], e16[j]);
        check(name, e8[j], fp8 ? (j == 0 ? 0.06 : tg) : 1e-2);
    }
    if (fp8) { // the FP8 products ran: their error is well above the bf16 products'
        snprintf(name, sizeof name, "  %s: FP8 ran (forward error %.1e > 2x bf16's)", fmt, e8[0]);
        check_true(name, e8[0] > 2 * e16[0]);
    } else { // the 16-bit path: the same bits
        bool same = !memcmp(y8.data(), y16.data(), y8.size() * 4) &&
                    !memcmp(dx8.data(), dx16.data(), dx8.size() * 4) &&
                    !memcmp(dw8.data(), dw16h.data(), dw8.size() * 4);
        check_true("  sizes not multiples of 16: the 16-bit path's bits", same);
    }
    CK(cudaFree(scratch));
    cudaFree(dx), cudaFree(dw16), cudaFree(ddy), cudaFree(dbias), cudaFree(out), cudaFree(out16);
    cudaFree(din), cudaFree(din16), cudaFree(gw), cudaFree(gw16);
}

// Products of an 8B layer's shapes, FP8 against bf16 (timing only; printed).
static void time_linear(dsc_cuda_blas *h, int R, int IN, int OUT) {
    std::vector<float> x = randn((size_t)R * IN, 1.0), w = randn((size_t)OUT * IN, 0.05),
                       dy = randn((size_t)R * OUT, 1e-3);
    std::vector<uint16_t> xb = to_bf16(x), wb = to_bf16(w), dyb = to_bf16(dy);
    uint16_t *dx = dev_upload(xb), *dw16 = dev_upload(wb), *ddy = dev_upload(dyb);
    uint16_t *out = dev_alloc<uint16_t>((size_t)R * OUT), *din = dev_alloc<uint16_t>((size_t)R * IN);
    float *gw = dev_alloc<float>((size_t)OUT * IN);
    int64_t maxd = IN > OUT ? IN : OUT;
    dsc__cuda_lin L;
    memset(&L, 0, sizeof L);
    L.blas = h, L.fp8 = DSC_FP8_HYBRID;
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, dsc__cuda_lin_scratch_bytes(L.fp8, R, maxd, (int64_t)IN * OUT, 1)));
    DS(dsc__cuda_lin_carve(&L, scratch, R, maxd, (int64_t)IN * OUT, 1));
    double flop = 2.0 * R * IN * OUT;
    for (int mode = DSC_FP8_HYBRID; mode >= DSC_FP8_OFF; mode--) {
        L.fp8 = mode;
        double t[3];
        // as a training step calls them: the forward measures, the input gradient keeps dout^T
        t[0] = time_ms([&] { DS(dsc__cuda_lin_forward(&L, 0, out, OUT, dx, IN, dw16, NULL, NULL, R, IN, OUT)); }, 3, 10);
        t[1] = time_ms([&] { DS(dsc__cuda_lin_dinp(&L, 0, din, IN, ddy, OUT, dw16, R, IN, OUT, false)); }, 3, 10);
        t[2] = time_ms([&] { DS(dsc__cuda_lin_dinp(&L, 0, din, IN, ddy, OUT, dw16, R, IN, OUT, false));
                             DS(dsc__cuda_lin_dw(&L, 0, gw, ddy, OUT, dx, IN, R, IN, OUT, false)); }, 3, 10);
        t[2] -= t[1];
        printf("TIME linear %s rows %d %d->%d: forward %.3f ms (%.0f TFLOP/s), input grad %.3f ms "
               "(%.0f), weight grad %.3f ms (%.0f), with quantization\n",
               mode ? "fp8 hybrid" : "bf16", R, IN, OUT, t[0], flop / t[0] / 1e9, t[1],
               flop / t[1] / 1e9, t[2], flop / t[2] / 1e9);
    }
    dsc__cuda_lin_release(&L);
    CK(cudaFree(scratch));
    cudaFree(dx), cudaFree(dw16), cudaFree(ddy), cudaFree(out), cudaFree(din), cudaFree(gw);
}

int main(void) {
    require_device("test_cuda_fp8");
    dsc_status s = dsc__cuda_fp8_supported();
    if (s != DSC_OK) {
        printf("SKIP: %s\n", dsc_last_error());
        return SKIP_EXIT;
    }
    for (int fmt = DSC_CUDA_E4M3; fmt <= DSC_CUDA_E5M2; fmt++) {
        test_quantize(64, 128, 128, fmt, 1.0);
        test_quantize(48, 200, 216, fmt, 3e-3); // edges of the 64-wide tiles, a row stride
        test_quantize(80, 40, 40, fmt, 1e3);
    }
    dsc_cuda_blas *h = NULL;
    DS(dsc__cuda_blas_create(&h, 0));
    lin_case cases[] = {{64, 128, 96}, {128, 256, 512}, {48, 96, 24}, {40, 64, 64}};
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        test_linear(h, cases[i], DSC_FP8_HYBRID);
        test_linear(h, cases[i], DSC_FP8_E4M3);
    }
    if (getenv("DSC_FP8_TIME")) {
        time_linear(h, 2048, 4096, 6144);  // llama-3.1-8B q, k, v
        time_linear(h, 2048, 4096, 28672); // gate | up
        time_linear(h, 2048, 14336, 4096); // down
        time_linear(h, 4096, 3072, 16384); // llama-3.2-3B gate | up, micro batch 2
    }
    dsc__cuda_blas_destroy(h);
    return finish("test_cuda_fp8");
}
