// engine/optim/sround.h - stochastic rounding of fp32 values to bf16 (bf16_master_rounding
// "stochastic"), shared by the CPU optimizer and the GPU kernels so that both round the same value
// at the same step and index to the same bits.
//
// The value's low 16 bits decide: 16 random bits are added to its fp32 bit pattern and the sum is
// truncated, so x rounds up with probability (x - down) / (up - down): unbiased. The random bits
// are a hash (SplitMix64's finaliser) of the optimizer step and the element's index in the
// engine's flat layout, so a run is reproducible, resumes bitwise and gives the same bits at every
// ZeRO stage and rank count. inf and NaN round to nearest (NaN stays quiet NaN).
#ifndef DSC_ENGINE_OPTIM_SROUND_H
#define DSC_ENGINE_OPTIM_SROUND_H

#include <stdint.h> // uint16_t, uint32_t, uint64_t, int64_t
#include <string.h> // memcpy

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DSC__SR_FN __host__ __device__ static inline
#else
#define DSC__SR_FN static inline
#endif

DSC__SR_FN uint32_t dsc__sr_bits(int64_t step, uint64_t index) {
    uint64_t z = (uint64_t)step * 0x9E3779B97F4A7C15ull + index * 0xD1B54A32D192ED03ull +
                 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint32_t)(z & 0xffffu);
}

// x rounded to bf16 with the random bits r (16 bits): the bf16 pattern.
DSC__SR_FN uint16_t dsc__bf16_sr(float x, uint32_t r) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) >= 0x7f800000u) { // inf, NaN: nearest (NaN quiet)
        if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040);
        return (uint16_t)(u >> 16);
    }
    return (uint16_t)((u + r) >> 16);
}

#endif
