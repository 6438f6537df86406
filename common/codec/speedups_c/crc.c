/* CRC-32. */
#include "speedups.h"

/* CRC-32 (zlib's: reflected polynomial 0xEDB88320): folded with PCLMULQDQ where the CPU
 * has it, the rest (and everything elsewhere) slicing by 8. */
static uint32_t crc_table[8][256];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CRC_FOLDING 1
static int crc_folding = 0; /* the CPU has PCLMULQDQ and SSE4.1 (set by crc_init) */
#endif

void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++) crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
#ifdef HAVE_CRC_FOLDING
    __builtin_cpu_init();
    crc_folding = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

#ifdef HAVE_CRC_FOLDING
/* The register c after the bytes p[0:n] (n a multiple of 16, at least 64), folded 64
 * bytes at a time with carry-less multiplication: Intel's "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ" (2009) for the reflected polynomial, with its
 * constants (x^k mod P for the fold distances, and the Barrett reduction's mu and P). */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(uint32_t c, const unsigned char *p, Py_ssize_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
    const __m128i poly = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
#define FOLD(x, k, next) \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    for (; n >= 64; p += 64, n -= 64) {
        x1 = FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
        x2 = FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x1 = FOLD(x1, k3k4, x2);
    x1 = FOLD(x1, k3k4, x3);
    x1 = FOLD(x1, k3k4, x4);
    for (; n >= 16; p += 16, n -= 16) x1 = FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
#undef FOLD
    /* 128 bits to 64, then to 32, then the Barrett reduction. */
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(k3k4, x1, 0x01), _mm_srli_si128(x1, 8));
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00), _mm_srli_si128(x1, 4));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x1, t), 1);
}
#endif

uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
#ifdef HAVE_CRC_FOLDING
    if (crc_folding && n >= 64) {
        c = crc_fold(c, p, n & ~(Py_ssize_t)15);
        p += n & ~(Py_ssize_t)15;
        n &= 15;
    }
#endif
    while (n >= 8) {
        uint32_t low = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][low & 0xFF] ^ crc_table[6][(low >> 8) & 0xFF] ^ crc_table[5][(low >> 16) & 0xFF]
            ^ crc_table[4][low >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]]
            ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}
