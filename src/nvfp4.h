/*
 * nvfp4.h: the NVFP4 codec: 4-bit E2M1 elements in blocks of 16 with an
 * FP8 E4M3 scale per block and an FP32 scale per tensor, bit-exact with the
 * producers' own arithmetic (NVIDIA Model Optimizer, compressed-tensors,
 * Transformer Engine).
 *
 * Byte layout of one quantized matrix, logical shape [R, C] (the layout's
 * orientation: W [out, in] rowwise, W^T [in, out] columnwise), C padded with
 * zeros to Cp = roundup(C, 16):
 *
 *   packed   U8       [R, Cp/2]   element 2i in the low nibble of byte i,
 *                                 element 2i+1 in the high nibble; a nibble
 *                                 is E2M1: sign (bit 3), exponent (bits 2..1,
 *                                 bias 1), mantissa (bit 0):
 *                                 0 0.5 1 1.5 2 3 4 6, codes 8..15 negated
 *   scales   F8_E4M3  [R, Cp/16]  e4m3fn (bias 7, max 448 = 0x7E, 0x7F NaN),
 *                                 row-major, unswizzled; with 2D blocks each
 *                                 16x16 tile's byte is repeated on its rows
 *   tensor   F32      one value   modelopt and te: weight_scale_2 = the
 *                                 decode factor S; compressed-tensors:
 *                                 weight_global_scale = 1 / S
 *
 *   value = e2m1(code) * e4m3(scale) * S
 *
 * Rows are never padded: a 2D tile at the bottom edge covers the rows that
 * exist. Callers record the logical shape; every function here takes it.
 *
 * Two implementations of quantization exist: ms_nvfp4_quantize_ref (plain
 * scalar C, the truth every other path must match byte for byte, including
 * the CUDA kernels) and ms_nvfp4_quantize (threads + AVX-512/AVX2 chosen at
 * run time, scalar fallback). Both are pure: no I/O, no global state.
 *
 * Float arithmetic: every recipe step is a single IEEE float32 operation
 * rounded to nearest even, in the order the producer performs it. The code
 * contains no a*b+c expression (nothing for FMA contraction to fuse), is
 * built with -std=c11 (which implies -ffp-contract=off on GCC), refuses
 * -ffast-math at compile time, and never changes the rounding mode or the
 * flush-to-zero bits (subnormals are kept).
 */
#ifndef MS_NVFP4_H
#define MS_NVFP4_H

#include "ms.h"
#include <stdint.h>

#include "common.h"
#include "safetensors.h"

#define MS_NVFP4_BLOCK 16
#define MS_NVFP4_E4M3_MAX 448.0f
#define MS_NVFP4_E2M1_MAX 6.0f

/* Instruction set of the fast path; AUTO picks the best the CPU has. */
enum ms_nvfp4_isa {
	MS_NVFP4_ISA_AUTO,
	MS_NVFP4_ISA_SCALAR,
	MS_NVFP4_ISA_AVX2,
	MS_NVFP4_ISA_AVX512,
};

/* Flags. */
#define MS_NVFP4_ALLOW_NONFINITE 1u /* see ms_nvfp4_quantize_ref */

struct ms_nvfp4_params {
	enum ms_nvfp4_recipe recipe;
	enum ms_nvfp4_block block;
	enum ms_nvfp4_layout layout;
	uint32_t flags;
	/* fast path only (the reference ignores them): */
	enum ms_nvfp4_isa isa;
	int nthreads;            /* 0: one per CPU */
};

/* A high-precision matrix [rows, cols], row-major, little-endian, possibly
 * unaligned (tensor data inside a safetensors file need not be). */
struct ms_nvfp4_src {
	enum ms_dtype dtype;     /* MS_DTYPE_BF16, MS_DTYPE_F16 or MS_DTYPE_F32 */
	const void *data;        /* borrowed for the duration of the call */
	uint64_t rows, cols;
};

/* The per-tensor constants of a recipe, derived from amax (the tensor's, or
 * its fused group's, largest finite magnitude). */
struct ms_nvfp4_tscale {
	enum ms_nvfp4_recipe recipe;
	float amax;
	float stored;            /* the recipe's own stored F32 ... */
	enum ms_nvfp4_tscale_kind kind; /* ... and how it decodes */
	/* Both on-disk forms, each as the recipe computes it: weight_scale_2
	 * (Model Optimizer names; decode multiplies) and weight_global_scale
	 * (compressed-tensors names; decode divides). modelopt: ws2 and
	 * 1/ws2; compressed-tensors: 1/gs and gs; te: S_dec and S_enc. */
	float scale_2;
	float global_scale;
	/* recipe internals: modelopt ws2, 6*ws2; compressed-tensors gs;
	 * te S_enc*(1/6), S_dec */
	float k0, k1;
	/* the source dtype: compressed-tensors computes its global scale
	 * and the block step's amax / 6 in the dtype of the observed weight
	 * (ms_nvfp4_round_src) */
	enum ms_dtype src_dtype;
};

/* ---- scalar codec steps (the reference's building blocks) ---------------- */

/* E2M1 code of q: nearest, ties to the even code, saturating at 6 (also
 * Inf). Sign bit set only when q < 0: -0.0 encodes as 0x0 (the sign test is
 * the producers' `x < 0`), -0.08 as 0x8. NaN encodes as 0x7 (+6): every
 * threshold test fails, as in the producers' comparison chains and the
 * hardware's satfinite conversion. */
uint8_t ms_nvfp4_e2m1_encode(float q);
/* Value of a 4-bit code (the high nibble bits are ignored). */
float ms_nvfp4_e2m1_value(uint8_t code);
/* E4M3 (e4m3fn) byte of x: round to nearest even, saturating at +-448;
 * NaN gives 0x7F. -0.0 gives 0x80. */
uint8_t ms_nvfp4_e4m3_encode(float x);
/* Value of an E4M3 byte (0x7F and 0xFF are NaN). */
float ms_nvfp4_e4m3_value(uint8_t b);
/* float32 rounded to the nearest bfloat16 (ties to even), as a float. */
float ms_nvfp4_bf16_round(float x);
/* float32 rounded to dtype (nearest, ties to even) as torch rounds the
 * float32 result of an operation on tensors of that dtype: bf16, f16 (which
 * overflows to Inf, with subnormals), or f32 (x itself). */
float ms_nvfp4_round_src(float x, enum ms_dtype dtype);

/* Tensor constants of recipe for amax (finite, >= 0; else MS_EINVAL) of a
 * source of dtype src_dtype (bf16, f16 or f32; only compressed-tensors
 * depends on it: its global scale is round_src(round_src(1 / a) * 2688),
 * a = max(amax, the dtype's smallest normal), 1.0 when not finite).
 * amax == 0 (an all-zero tensor or group) is well defined for every recipe:
 * all blocks are all-zero blocks; modelopt stores weight_scale_2 = 0.
 * ms_nvfp4_tscale_init is ms_nvfp4_tscale_init_src for a bf16 source. */
int ms_nvfp4_tscale_init_src(enum ms_nvfp4_recipe recipe, float amax,
			     enum ms_dtype src_dtype, struct ms_nvfp4_tscale *t,
			     struct ms_err *err);
int ms_nvfp4_tscale_init(enum ms_nvfp4_recipe recipe, float amax,
			 struct ms_nvfp4_tscale *t, struct ms_err *err);
/* The stored tensor scale of t for names that decode as kind. */
float ms_nvfp4_tscale_value(const struct ms_nvfp4_tscale *t,
			    enum ms_nvfp4_tscale_kind kind);
/* The block step: scale byte for a block whose largest finite magnitude is
 * bamax (<= t->amax), and the element factor: code = e2m1(x / *factor)
 * for modelopt and compressed-tensors, e2m1(x * *factor) for te (see
 * ms_nvfp4_encode_elem). All-zero blocks give 0x38 / 0x20 / 0x00. */
uint8_t ms_nvfp4_block_scale(const struct ms_nvfp4_tscale *t, float bamax,
			     float *factor);
/* The element step, with the factor of its block. */
uint8_t ms_nvfp4_encode_elem(const struct ms_nvfp4_tscale *t, float x,
			     float factor);
/* Decode factor of a block: e4m3(s8) * S computed as the producer's
 * dequantizer does (s8 * ws2, or s8 / gs for MS_NVFP4_TSCALE_DIV). */
float ms_nvfp4_block_decode(uint8_t s8, float tscale,
			    enum ms_nvfp4_tscale_kind kind);

/* Element i (flat, row-major) of src as float32 (exact for its dtypes). */
float ms_nvfp4_src_get(const struct ms_nvfp4_src *src, uint64_t i);

/* ---- whole matrices ------------------------------------------------------- */

/* Output shapes for src [rows, cols] in layout: packed [R, Cp/2] and scales
 * [R, Cp/16]. MS_EINVAL on overflow. */
int ms_nvfp4_shapes(uint64_t rows, uint64_t cols, enum ms_nvfp4_layout layout,
		    uint64_t packed_shape[2], uint64_t scale_shape[2],
		    struct ms_err *err);

/* Largest finite |x| of src into *amax (0 for an empty matrix). A NaN or Inf
 * is MS_EINVAL, "non-finite value (nan) at element N" with N the flat
 * row-major index of the first one, unless allow_nonfinite, when non-finite
 * values are skipped. Reference: scalar; ms_nvfp4_amax: fast path. */
int ms_nvfp4_amax_ref(const struct ms_nvfp4_src *src, int allow_nonfinite,
		      float *amax, struct ms_err *err);
int ms_nvfp4_amax(const struct ms_nvfp4_src *src, int allow_nonfinite,
		  int nthreads, enum ms_nvfp4_isa isa, float *amax,
		  struct ms_err *err);

/*
 * Quantize src in p->layout with p->recipe and p->block, using the tensor
 * constants of amax (pass the group's max for fused layers; it must be at
 * least the largest finite |x| of src, else MS_EINVAL). packed and scales
 * have the sizes ms_nvfp4_shapes gives; the caller owns them.
 *
 * Non-finite input is MS_EINVAL naming the first bad element (flat source
 * index), unless p->flags has MS_NVFP4_ALLOW_NONFINITE: then NaN and Inf
 * are left out of block maxima and encode by ms_nvfp4_encode_elem (Inf
 * saturates to +-6, NaN gives 0x7).
 *
 * ms_nvfp4_quantize_ref is the reference; ms_nvfp4_quantize gives the same
 * bytes on every input, faster (p->isa, p->nthreads). Returns MS_OK,
 * MS_EINVAL, MS_ENOMEM, or MS_ENODEV when p->isa names an instruction set
 * the CPU lacks.
 */
int ms_nvfp4_quantize_ref(const struct ms_nvfp4_params *p,
			  const struct ms_nvfp4_src *src, float amax,
			  uint8_t *packed, uint8_t *scales, struct ms_err *err);
int ms_nvfp4_quantize(const struct ms_nvfp4_params *p,
		      const struct ms_nvfp4_src *src, float amax,
		      uint8_t *packed, uint8_t *scales, struct ms_err *err);

/*
 * The other orientation of a 2D-block quantization, by nibble repacking and
 * scale transposition: given the quantized M [rows, cols] (logical shape;
 * packed [rows, Cp/2], scales [rows, Cp/16]) it writes the quantized M^T
 * [cols, rows] (packed_t [cols, Rp/2], scales_t [cols, Rp/16]), equal byte
 * for byte to quantizing M^T directly. Rowwise -> columnwise and back are
 * the same call. With 1D blocks this is MS_EINVAL: a 1x16 block of W^T
 * spans 16 rows of W, whose scale the rowwise bytes do not hold, so the
 * high-precision source is needed. MS_EINVAL too when the input is not a
 * 2D-block quantization (a tile's rows disagree on its scale, or padding
 * nibbles are not zero).
 */
int ms_nvfp4_transpose(enum ms_nvfp4_block block, uint64_t rows, uint64_t cols,
		       const uint8_t *packed, const uint8_t *scales,
		       uint8_t *packed_t, uint8_t *scales_t, struct ms_err *err);

/*
 * Decode a quantized [rows, cols] (logical shape; packed [rows, Cp/2],
 * scales [rows, Cp/16]) to out, MS_DTYPE_F32 or MS_DTYPE_BF16 (rounded to
 * nearest even from the float32 value), row-major [rows, cols]. Each value
 * is e2m1(code) * ms_nvfp4_block_decode(scale, tscale, kind) in float32.
 * ms_nvfp4_dequantize is the threaded version (nthreads 0: one per CPU).
 */
int ms_nvfp4_dequantize_ref(const uint8_t *packed, const uint8_t *scales,
			    uint64_t rows, uint64_t cols, float tscale,
			    enum ms_nvfp4_tscale_kind kind,
			    enum ms_dtype out_dtype, void *out,
			    struct ms_err *err);
int ms_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales,
			uint64_t rows, uint64_t cols, float tscale,
			enum ms_nvfp4_tscale_kind kind, enum ms_dtype out_dtype,
			void *out, int nthreads, struct ms_err *err);

/* The instruction set AUTO resolves to on this CPU, and its name ("avx512",
 * "avx2", "scalar"). Whether the CPU can run isa. */
enum ms_nvfp4_isa ms_nvfp4_isa_best(void);
const char *ms_nvfp4_isa_name(enum ms_nvfp4_isa isa);
int ms_nvfp4_isa_supported(enum ms_nvfp4_isa isa);

#endif
