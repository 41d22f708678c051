/*
 * ggemm.h: one grouped GEMM over the experts of a MoE layer on the bf16
 * tensor cores (kernels/ggemm.cu), with the experts' row counts read from
 * device memory.
 *
 * The trainer's expert products are per-expert GEMMs over each expert's
 * rows of the sorted token copies. Run as one cuBLAS call per expert they
 * need every count on the host (a synchronisation after routing) and 64
 * launches a product; cuBLAS's own grouped GEMM takes its shapes from the
 * host too and has no float32 output. Here one launch covers every expert:
 * its grid is sized by a bound on the rows, and each block finds its
 * expert and row tile from the offsets on the device (ms_ggemm_index).
 * On mma.sync it reaches about half of cuBLAS's (wgmma) rate on an H200,
 * more than the host waiting it removes: the trainer's default is
 * CUTLASS's wgmma grouped GEMM (xgemm.h), or cuBLAS per expert without
 * it, and offers this as mstrain --expert-gemm grouped and fused
 * (tools/bench/NOTES.md has the measurements).
 *
 *   group e (0 <= e < E) owns rows off[e] .. off[e+1]-1 of A and C:
 *   C[row, 0:N] (+)= A[row, 0:K] B_e^T,  B_e [N, K] row-major
 *   A bf16 [rows, K] (row stride lda), C float32 [rows, N] (stride ldc).
 *
 * Rows past off[E] and columns past N are neither read nor written; a
 * group with no rows launches nothing that touches memory. Sums run in a
 * fixed order (float32 accumulators, k ascending in steps of 16), so the
 * result is the same run to run.
 *
 * Internal to libms (not in ms.h). Errors: MS_EINVAL for a shape the
 * kernel does not cover (the caller keeps its other path), CUDA failures
 * through ms_gpu_cuda_err; nothing is printed.
 */
#ifndef MS_GGEMM_H
#define MS_GGEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_err;

#define MS_GGEMM_MAX_E 1024u    /* groups ms_ggemm_index scans in one block */

/* the tile shape (ggemm.cu): which is faster is measured, not assumed
 * (t_ggemm_gpu --bench); NARROW is the default */
enum { MS_GGEMM_NARROW, MS_GGEMM_WIDE };

/*
 * One group's B in NVFP4 instead of bf16 (ms_ggemm.bq): decoded to bf16
 * inside the GEMM, a stage at a time in shared memory, the value
 * train.cu's decode kernel (and ms_nvfp4_dequantize_ref) makes: e2m1(code)
 * times e4m3(scale) times or over the tensor scale, in float32, rounded
 * to bf16. The layout is nvfp4.h's: codes two a byte, the lower column in
 * the low nibble, one e4m3 scale per 16 along K. B may be two tensors
 * (an expert's gate and up projections, each with its own tensor scale):
 * part 0 holds B's rows [0, split) and part 1 rows [split, N) (along N),
 * or part 0 columns [0, split) and part 1 [split, K) (along K: the
 * transpose of such a stack); split >= N (or K) is one part.
 */
struct ms_ggemm_q4 {
	const uint8_t *codes;     /* the part's [rows, code_stride], 16-byte
				     aligned */
	const uint8_t *scales;    /* [rows, scale_stride] */
	uint32_t code_stride;     /* bytes, a multiple of 16, >= its K / 2 */
	uint32_t scale_stride;    /* bytes, >= its K / 16 */
	float tscale;             /* the tensor scale */
	int divide;               /* 1: scale / tscale (MS_NVFP4_TSCALE_DIV);
				     0: scale * tscale */
};

struct ms_ggemm_nvfp4 {
	struct ms_ggemm_q4 part[2];
	uint32_t split;           /* where part 1 starts */
	int along_k;              /* the parts split K (a multiple of 32), or N */
};

#define MS_GGEMM_NVFP4_MAX_K 8192u  /* the block keeps its rows' scales */

struct ms_ggemm {
	uint32_t E;               /* groups, 1 .. MS_GGEMM_MAX_E */
	uint32_t N, K;            /* every group's columns and reduction length */
	uint64_t rows;            /* a bound on off[E] (the grid is sized by it) */
	const uint32_t *off;      /* device [E + 1], from ms_ggemm_index */
	const uint32_t *tiles;    /* device [E + 1], from ms_ggemm_index */
	const void *a;            /* device bf16 [rows, K], 16-byte aligned */
	uint64_t lda;             /* a multiple of 8 */
	const void *const *b;     /* device [E]: group e's bf16 [N, K], each
				     16-byte aligned; unused with bq */
	const struct ms_ggemm_nvfp4 *bq; /* device [E], or NULL: B from b */
	uint64_t ldb;             /* a multiple of 8 */
	float *c;                 /* device float [rows, N], 8-byte aligned */
	uint64_t ldc;             /* even */
	int accumulate;           /* 1: C += A B^T; 0: C = A B^T */
	int cfg;                  /* MS_GGEMM_NARROW (0) or MS_GGEMM_WIDE */
};

/* 1 when the kernel covers N columns and reduction length K (both
 * multiples of 8: rows of 16 bytes), else 0. */
int ms_ggemm_supported(uint32_t N, uint32_t K);

/* MS_OK when the kernel covers an NVFP4 B of d's layout (host memory)
 * over N x K: K a multiple of 32 up to MS_GGEMM_NVFP4_MAX_K, N of 8,
 * the strides and alignments above; else MS_EINVAL saying which. */
int ms_ggemm_nvfp4_check(const struct ms_ggemm_nvfp4 *d, uint32_t N, uint32_t K,
			 struct ms_err *err);

/* the rows of a tile in ms_ggemm_index's tables */
#define MS_GGEMM_TILE_ROWS 128u

/* From cnt [E] (device, rows per group): off [E + 1] (off[0] = 0, the
 * running sum) and tiles [E + 1] (the same over each group's row tiles of
 * MS_GGEMM_TILE_ROWS), both device memory, written on stream (a
 * cudaStream_t; NULL: the default). One small kernel, nothing copied to
 * the host. */
int ms_ggemm_index(const uint32_t *cnt, uint32_t E, uint32_t *off, uint32_t *tiles,
		   void *stream, struct ms_err *err);

/* The grouped product on stream. */
int ms_ggemm_run(const struct ms_ggemm *p, void *stream, struct ms_err *err);

/*
 * The grouped weight gradient of a low-rank factor: for every group e,
 *   G_e (+)= alpha U_e^T X_e     (a sum over the group's rows)
 * U float [rows, R] (row stride ldu), X float [rows, N] (ldx), both over
 * the rows off[e] .. off[e+1]-1; G_e at g + e * gstride, [R, N] or, with
 * trans, [N, R]. The LoRA factors' gradients of every expert at once
 * (gA_e = dU_e^T X_e; gB_e = s dY_e^T U_e, transposed), from the offsets
 * routing left on the device, in float32 on the CUDA cores: the rank is
 * small, so the sum is bound by reading X once, not by the multiplies.
 * Each element sums its rows in order (deterministic).
 */
#define MS_GGEMM_WGRAD_MAX_R 32u

struct ms_ggemm_wgrad {
	uint32_t E, R, N;         /* groups, rank (1 .. MS_GGEMM_WGRAD_MAX_R),
				     columns */
	const uint32_t *off;      /* device [E + 1] */
	const float *u;           /* device [rows, R] */
	uint64_t ldu;
	const float *x;           /* device [rows, N] */
	uint64_t ldx;
	float *g;                 /* device: G_e at g + e * gstride */
	uint64_t gstride;
	int trans;                /* G_e [N, R] instead of [R, N] */
	float alpha;
	int accumulate;           /* 1: G += ...; 0: G = ... */
};

int ms_ggemm_wgrad(const struct ms_ggemm_wgrad *p, void *stream, struct ms_err *err);

/*
 * The same sum with bf16 U and X on the tensor cores (mma.sync, float32
 * accumulation): G_e (+)= alpha U_e^T X_e over the rows off[e] ..
 * off[e+1]-1, G_e [R, N] or, with trans, [N, R]. A block a 128-column
 * slice of one group, its rows streamed through shared memory in a ring of
 * four cp.async stages (rows past the group's end are zero-filled, not read),
 * each element's rows summed in the same order every run. The folded
 * expert LoRA's gradients (train.cu): a read of X once. Covered: R of 1
 * .. MS_GGEMM_WGRAD_BF16_MAX_R (padded with zeros to a multiple of 16 in
 * shared memory), N and ldx multiples of 8, x 16-byte aligned, ldu at
 * least R, xdiv at least 1 with xperm (ms_ggemm_wgrad_bf16 says which it
 * is not).
 */
#define MS_GGEMM_WGRAD_BF16_MAX_R 64u

struct ms_ggemm_wgrad_bf16 {
	uint32_t E, R, N;
	const uint32_t *off;      /* device [E + 1] */
	const void *u;            /* device bf16 [rows, R] */
	uint64_t ldu;
	const void *x;            /* device bf16 [rows, N] */
	uint64_t ldx;
	float *g;                 /* device: G_e at g + e * gstride */
	uint64_t gstride;
	int trans;                /* G_e [N, R] instead of [R, N] */
	float alpha;
	int accumulate;           /* 1: G += ...; 0: G = ... */
	/* NULL, or X's rows through a permutation: row i of the groups reads
	 * row xperm[i] / xdiv of x (the expert rows' tokens, read from the
	 * token-major input without gathering it first) */
	const int32_t *xperm;
	uint32_t xdiv;
	/* 0 or 1: a block a column slice sums all of its group's rows; more:
	 * each group's rows cut into nsplit equal runs (multiples of 32), a
	 * block each, their float32 partial sums written to part (nsplit * E
	 * * R * N floats) and added in split order by a second kernel: the
	 * most loaded group no longer sets the time, and the sums still have
	 * a fixed order. run_rows > 0: a group is cut only into as many runs
	 * (at most nsplit) as keep each to about run_rows rows, so a group
	 * not above it is one run, written directly, no partials */
	uint32_t nsplit;
	float *part;
	uint32_t run_rows;
	/* 0: the blocks' width (columns of X) the launch picks, the one
	 * whose grid fills the device's block slots best; 128 or 256: that
	 * one (the tests take each) */
	uint32_t width;
	/* NULL, or in the same pass over X the low-rank product the folded
	 * LoRA's backward takes of it as well (dU = s dY B beside gB = s
	 * dY^T U: gate/up's dY read once, not twice):
	 *   DU[row, 0:RP] = dalpha X[row, 0:N] W_e, over each group's rows,
	 * RP = R rounded up to 16, W_e [N, RP] bf16 at w + e * wstride (row
	 * stride ldw: at least RP, a multiple of 8; w 16-byte aligned), DU
	 * bf16 (row stride lddu), rounded once from the float sums. Each
	 * block's column slice's partial sums go to dpart
	 * (ms_ggemm_wgrad_bf16_dpart floats, drows a bound on off[E]) and a
	 * second kernel adds the slices in order: a fixed order every run. */
	const void *w;
	uint64_t ldw, wstride;
	void *du;
	uint64_t lddu;
	float dalpha;
	float *dpart;
	uint64_t drows;
};

/* the floats ms_ggemm_wgrad_bf16's dpart takes for N, R and drows */
uint64_t ms_ggemm_wgrad_bf16_dpart(uint32_t N, uint32_t R, uint64_t drows);

int ms_ggemm_wgrad_bf16(const struct ms_ggemm_wgrad_bf16 *p, void *stream,
			struct ms_err *err);

/*
 * The grouped low-rank products (a LoRA's two factors, every expert at
 * once, over the rows and row tiles ms_ggemm_index left on the device),
 * float32 on the CUDA cores: with a rank of at most
 * MS_GGEMM_WGRAD_MAX_R each is bound by reading or writing its wide side
 * once.
 *   down (up 0): Y[row, 0:R] (+)= alpha X[row, 0:D] W_e^T, W_e [R, D]
 *   up   (up 1): Y[row, 0:D] (+)= alpha X[row, 0:R] W_e^T, W_e [D, R]
 * W_e at w + e * wstride, stored as above or, with wt, transposed
 * ([D, R] for down, [R, D] for up: a LoRA's B in dU = dY B, its A in
 * dX = dU A). Each output sums in a fixed order (deterministic).
 */
struct ms_ggemm_lowrank {
	uint32_t E, R, D;         /* groups, rank, the wide dimension */
	int up;                   /* 0: D -> R; 1: R -> D */
	uint64_t rows;            /* a bound on off[E] */
	const uint32_t *off, *tiles; /* device [E + 1] each (ms_ggemm_index) */
	const float *x;           /* device [rows, D] (down) or [rows, R] (up) */
	uint64_t ldx;
	const float *w;           /* device: W_e at w + e * wstride */
	uint64_t wstride;
	int wt;                   /* W_e stored transposed */
	float *y;                 /* device [rows, R] (down) or [rows, D] (up) */
	uint64_t ldy;
	float alpha;
	int accumulate;           /* 1: Y += ...; 0: Y = ... */
};

int ms_ggemm_lowrank(const struct ms_ggemm_lowrank *p, void *stream, struct ms_err *err);

/*
 * The down product in bf16 on the tensor cores (mma.sync, float32
 * accumulators), over the same rows and row tiles:
 *   Y[row, 0:R] = alpha X[row, 0:D] W_e^T, W_e [R, D] (wt: stored [D, R])
 * X, W and Y bf16, Y rounded once from the float sums. What the folded
 * LoRA's U = X A^T and dU = s dY B are, at a rank a multiple of 8: one
 * pass over X's rows, W_e staged in shared memory a chunk of D at a time.
 * R a multiple of 8 up to MS_GGEMM_WGRAD_MAX_R, D a multiple of 8, ldx
 * and ldy even with x and y 4-byte aligned. With x and w 16-byte aligned
 * and ldx and wstride multiples of 8 (the trainer's twin rows), X and W_e
 * stream through shared memory by 16-byte copies, near the rate of
 * reading X once; otherwise a slower kernel of 4-byte loads. Each output
 * sums in a fixed order (deterministic); Y's other columns and rows are
 * not written, and X's columns past D are not read (Y may be X's tail
 * columns: y = x + D, ldy = ldx).
 */
struct ms_ggemm_lowrank_bf16 {
	uint32_t E, R, D;
	uint64_t rows;               /* a bound on off[E] */
	const uint32_t *off, *tiles; /* device [E + 1] each (ms_ggemm_index) */
	const void *x;               /* device bf16 [rows, D], row stride ldx */
	uint64_t ldx;
	const void *w;               /* device bf16: W_e at w + e * wstride */
	uint64_t wstride;
	int wt;                      /* W_e stored [D, R] */
	void *y;                     /* device bf16 [rows, R], row stride ldy */
	uint64_t ldy;
	float alpha;
};

int ms_ggemm_lowrank_bf16(const struct ms_ggemm_lowrank_bf16 *p, void *stream,
			  struct ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
